"""``CompiledModel``: what ``ssmcc.compile`` and ``ssmcc.load`` return, for every target.

It runs a target's ``Executable`` (``lowering/registry.py``): the forward program, and for a token
model that streams, the prefill / chunk / step programs with the states of ``specs``. Everything a
user calls is checked here (token ids, states) before a target sees it; chunking, the prefix
cache, generation and ``State`` are the same for every target.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import uuid

import torch
from torch.export import ExportedProgram

from ssmcc.errors import InputError, StreamingError
from ssmcc.frontend.inputs import check_token_ids
from ssmcc.options import Options, check_chunk_size
from ssmcc.runtime.artifact import sha256_of, write_artifact
from ssmcc.runtime.chunked import run_chunks
from ssmcc.runtime.generation import Sampling, check_eos_token_id, stream
from ssmcc.runtime.input_dims import check_inputs
from ssmcc.runtime.manifest import MANIFEST
from ssmcc.runtime.prefix_cache import PrefixCache
from ssmcc.runtime.prompts import prompt_rows
from ssmcc.runtime.report import CompileReport
from ssmcc.runtime.state import State, check_state
from ssmcc.runtime.text import (
    TextStream,
    before_eos,
    decode,
    encode,
    load_saved_tokenizer,
    save_tokenizer,
)


def _is_text(prompts) -> bool:
    """A text prompt, or a non-empty list of them."""
    if isinstance(prompts, str):
        return True
    return isinstance(prompts, (list, tuple)) and bool(prompts) and isinstance(prompts[0], str)


class CompiledModel:
    """A model compiled by ssmcc for one target.

    - ``compiled(input_ids) -> logits`` (b, l, vocab), like the model's forward;
    - ``prefill(input_ids, state=None) -> (logits, State)``: the prompt, from ``state`` or zeros,
      in chunks of ``chunk_size`` tokens (bounded activation memory); ``last_only=True`` returns
      only the last position's logits (b, vocab), and ``prefix_cache`` reuses cached prefixes;
    - ``step(token_ids, state) -> (logits (b, vocab), State)``: one token per row;
    - ``generate(input_ids, max_new_tokens, ...)`` and ``stream(...)``: greedy or sampled tokens,
      for one batch, a padded batch with its ``attention_mask`` or a list of prompts of any
      lengths; with a ``tokenizer``, ``generate("text")`` and ``stream_text("text")`` too;
    - ``save(dir)``: the target's artifact (``ssmcc.load(dir)`` opens it again).

    ``info`` describes the model as the manifest does (model, vocab_size, ssmcc_ops,
    static_length, streaming refusal); ``program``/``report``: the IR after passes and what
    capture and the passes did (None for a model opened with ``ssmcc.load``).
    """

    def __init__(
        self,
        executable,
        options: Options,
        info: dict,
        *,
        program: ExportedProgram | None = None,
        report: CompileReport | None = None,
        manifest: dict | None = None,
        artifact_dir: str | None = None,
        files=None,
        tokenizer=None,
    ):
        self._executable = executable
        self.options = options
        self.info = info
        self.program = program
        self.report = report
        self.manifest = manifest
        self.artifact_dir = artifact_dir
        self._files = files  # a loaded artifact's verified files (ssmcc.artifact_files)
        self.target = options.target
        self.chunk_size = options.chunk_size
        self.vocab_size = info.get("vocab_size")
        self.static_length = info.get("static_length")  # token count a static capture runs at
        self._token_model = self.vocab_size is not None
        self._tokenizer = tokenizer

    @functools.cached_property
    def model_id(self) -> str:
        """What prefix-cache keys name the model by: its files' content where it has files (an
        artifact, or a target that builds files), so that loads of one artifact share cached
        prefixes; otherwise this compiled object (a compiled torch model's weights may change
        after compiling another)."""
        files = self.manifest["files"] if self.manifest is not None else None
        if files is None and hasattr(self._executable, "file_paths"):
            files = {
                name: {"bytes": os.path.getsize(path), "sha256": sha256_of(path)}
                for name, path in self._executable.file_paths().items()
            }
        if files is not None:
            text = json.dumps(files, sort_keys=True)
            return "artifact:" + hashlib.sha256(text.encode()).hexdigest()
        return "compiled:" + uuid.uuid4().hex

    @property
    def executable(self):
        """The target's executable (its lowered modules or runtime sessions)."""
        return self._executable

    @torch.inference_mode()
    def __call__(self, *args):
        if not self._token_model:
            check_inputs(args, self.info.get("input_dims"))
            outputs = self._executable.run("forward", *args)
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        if len(args) != 1:
            raise TypeError("call a compiled language model with one argument: input_ids")
        input_ids = check_token_ids(args[0], self.vocab_size)
        if self.static_length is not None and input_ids.shape[1] != self.static_length:
            raise InputError(
                f"this model was captured at a static length of {self.static_length} tokens "
                f"(routing off), got input_ids of length {input_ids.shape[1]}; compile with "
                "route=True (the default) for any length, or with example ids of this length"
            )
        if "forward" in self._executable.graphs:
            return self._executable.run("forward", input_ids)[0]
        specs = self._executable.specs
        zeros = State.zeros(specs, input_ids.shape[0]).tensors(specs)
        return self._executable.run("prefill", input_ids, *zeros)[0]

    # -- streaming decode -------------------------------------------------------------------
    @property
    def state_specs(self):
        """Every state tensor (``StateSpec``: name, kind, shape without batch, dtype), in order."""
        self._require_states()
        return self._executable.specs

    def _require_states(self) -> None:
        refusal = self.info.get("streaming_refusal")
        if refusal is not None:
            raise StreamingError(refusal)

    @torch.inference_mode()
    def prefill(
        self,
        input_ids,
        state: State | None = None,
        *,
        chunk_size: int | None = None,
        last_only: bool = False,
        prefix_cache: PrefixCache | None = None,
    ) -> tuple[torch.Tensor, State]:
        """Logits of the prompt and the state after it.

        The prompt runs in chunks of ``chunk_size`` tokens (default: the model's ``chunk_size``),
        each starting from the state the previous one left, so activation memory is that of one
        chunk. Logits: (b, l, vocab), or with ``last_only`` the last position's (b, vocab) --
        then no chunk computes logits for its other positions. ``prefix_cache`` (with
        ``last_only``, from the zero state) restarts each row from its longest cached
        chunk-aligned prefix and stores the state at every later chunk boundary.
        """
        self._require_states()
        ids = check_token_ids(input_ids, self.vocab_size)
        chunk_size = self.chunk_size if chunk_size is None else check_chunk_size(chunk_size)
        specs = self._executable.specs
        if state is None:
            tensors = State.zeros(specs, ids.shape[0]).tensors(specs)
        else:
            tensors = check_state(state, specs, ids.shape[0])
        if prefix_cache is not None:
            self._check_prefix_cache(prefix_cache, state, last_only)
        graph = "chunk" if last_only else "prefill"

        def run(chunk, states):
            logits, *new = self._executable.run(graph, chunk, *states)
            return logits, new

        outputs, new = run_chunks(run, ids, tensors, chunk_size, prefix_cache, self.model_id)
        logits = outputs[-1] if last_only else torch.cat(outputs, dim=1)
        return logits, State(dict(zip([s.name for s in specs], new, strict=True)))

    def _check_prefix_cache(self, cache, state, last_only: bool) -> None:
        if not isinstance(cache, PrefixCache):
            raise InputError(
                f"prefix_cache must be an ssmcc.PrefixCache, got {type(cache).__name__}"
            )
        if state is not None:
            raise InputError(
                "prefix_cache keys prefixes from the start of a prompt (the zero state); it "
                "cannot be combined with a given state"
            )
        if not last_only:
            raise InputError(
                "prefix_cache needs last_only=True: a cached prefix has its state and last "
                "logits, not the logits of every position"
            )
        state_bytes = sum(s.nbytes_per_row for s in self._executable.specs)
        cache.check_fits(state_bytes + 4 * (self.vocab_size or 0), "this model")

    @torch.inference_mode()
    def step(self, token_ids, state: State) -> tuple[torch.Tensor, State]:
        """Logits (b, vocab) after one more token per row (``token_ids``: (b,) or (b, 1))."""
        self._require_states()
        if isinstance(token_ids, torch.Tensor) and token_ids.dim() == 1:
            token_ids = token_ids[:, None]
        ids = check_token_ids(token_ids, self.vocab_size, what="token_ids")
        if ids.shape[1] != 1:
            raise InputError(
                f"step takes one token per row, got token_ids of shape "
                f"{tuple(ids.shape)}; use prefill for several tokens"
            )
        specs = self._executable.specs
        return self._step_checked(ids, check_state(state, specs, ids.shape[0]))

    @torch.inference_mode()
    def _step_checked(self, ids: torch.Tensor, tensors: list) -> tuple[torch.Tensor, State]:
        """``step`` on ids and state tensors already known to fit (what generation feeds back:
        the tokens it chose and the state the previous call returned)."""
        logits, *new = self._executable.run("step", ids, *tensors)
        return logits, State(dict(zip([s.name for s in self._executable.specs], new, strict=True)))

    def stream(
        self,
        input_ids,
        max_new_tokens: int,
        *,
        attention_mask=None,
        chunk_size: int | None = None,
        prefix_cache: PrefixCache | None = None,
        **sampling,
    ):
        """Yield each new token column (b,) as soon as it is chosen. Prompts as ``generate``
        takes them (ids, ids + ``attention_mask``, a list of id rows); keywords as for
        ``generate`` (without ``streamer``)."""
        self._require_states()
        ids, rows = prompt_rows(input_ids, self.vocab_size, attention_mask)
        return self._stream(ids, rows, max_new_tokens, chunk_size, prefix_cache, sampling)

    def _stream(self, ids, rows, max_new_tokens, chunk_size, prefix_cache, sampling: dict):
        sampling = dict(sampling)
        eos_token_id = check_eos_token_id(sampling.pop("eos_token_id", None), self.vocab_size)
        unknown = sorted(set(sampling) - {f.name for f in dataclasses.fields(Sampling)})
        if unknown:
            raise InputError(
                f"unknown generation option(s) {', '.join(unknown)}; options: do_sample, "
                "temperature, top_k, top_p, seed, eos_token_id, attention_mask, chunk_size, "
                "prefix_cache"
            )
        names = [spec.name for spec in self._executable.specs]

        def prefill_rows(prompt):
            return self.prefill(
                prompt, chunk_size=chunk_size, last_only=True, prefix_cache=prefix_cache
            )

        def step(tokens, state):  # the state of the previous call, the tokens stream just chose
            if isinstance(state, list):  # rows apart (ragged_prefill)
                out = [
                    self._step_checked(tokens[i : i + 1], [s[n] for n in names])
                    for i, s in enumerate(state)
                ]
                return torch.cat([logits for logits, _ in out]), [s for _, s in out]
            return self._step_checked(tokens, [state[name] for name in names])

        if rows is None:
            prefill, batch = (lambda: prefill_rows(ids)), ids.shape[0]
        else:
            prefill, batch = (lambda: self._ragged_prefill(rows, prefill_rows)), len(rows)
        chosen = Sampling(**sampling)
        session = getattr(self._executable, "decode_session", None)  # decoding on the device
        device_decode = (lambda: session(batch, chosen)) if session is not None else None
        return stream(prefill, step, batch, max_new_tokens, chosen, eos_token_id, device_decode)

    def _ragged_prefill(self, rows, prefill_rows):
        """Prompts of different lengths: each row prefilled alone (no padding enters a state, so
        a row's tokens are those it generates alone). Where no state grows, the rows' states
        stack along the batch and decode as one batch; K/V caches hold each row's own number of
        positions, so a model with them decodes row by row (a list of states)."""
        results = [prefill_rows(row[None]) for row in rows]
        logits = torch.cat([logits for logits, _ in results])
        states = [state for _, state in results]
        if any(spec.grows for spec in self._executable.specs):
            return logits, states
        return logits, State({name: torch.cat([s[name] for s in states]) for name in states[0]})

    def generate(
        self, input_ids, max_new_tokens: int, *, attention_mask=None, streamer=None, **sampling
    ):
        """Prompt + new tokens.

        Prompts: ids (b, l) -> a tensor (b, l + new); ids with an ``attention_mask`` (padding on
        either side, as tokenizers write it) -> the padded ids + new columns, (b, l + new); a
        list of id rows of any lengths -> a list of 1-D tensors; text (a string or a list of
        them, with the model's ``tokenizer``) -> the decoded text of prompt + new tokens,
        stopping at the tokenizer's EOS unless ``eos_token_id`` is given. Every row generates
        exactly the tokens it generates alone.

        Keywords: ``do_sample`` (default greedy), ``temperature``, ``top_k``, ``top_p``, ``seed``,
        ``eos_token_id`` (a row that produced it keeps emitting it; generation stops when every
        row has); ``streamer(token_column)`` is called for each new token; ``chunk_size`` and
        ``prefix_cache`` as for ``prefill`` (the prompt runs with ``last_only=True``).
        """
        if _is_text(input_ids):
            return self._generate_text(input_ids, max_new_tokens, streamer, sampling)
        self._require_states()
        ids, rows = prompt_rows(input_ids, self.vocab_size, attention_mask)
        columns = []
        chunk_size, prefix_cache = (
            sampling.pop("chunk_size", None),
            sampling.pop("prefix_cache", None),
        )
        for token in self._stream(ids, rows, max_new_tokens, chunk_size, prefix_cache, sampling):
            if streamer is not None:
                streamer(token)
            columns.append(token)
        new = torch.stack(columns, dim=1)
        if isinstance(input_ids, (list, tuple)):
            rows = list(ids) if rows is None else rows
            return [torch.cat([row, new[i]]) for i, row in enumerate(rows)]
        return torch.cat([(ids if rows is None else input_ids).long(), new], dim=1)

    # -- text --------------------------------------------------------------------------------
    @property
    def tokenizer(self):
        """The model's tokenizer (kept by ``compile``, saved in the artifact), or None."""
        saved = (self.manifest or {}).get("tokenizer")
        if self._tokenizer is None and saved and self._files is not None:
            self._tokenizer = load_saved_tokenizer(self._files, saved["files"])
        return self._tokenizer

    def _require_tokenizer(self):
        if self.tokenizer is None:
            raise InputError(
                "this model has no tokenizer, so it takes token ids, not text: compile it with "
                "tokenizer=... (or from a model folder that holds one), or tokenize the text "
                "yourself and pass the ids"
            )
        return self.tokenizer

    def _text_rows(self, prompts) -> list[torch.Tensor]:
        tokenizer = self._require_tokenizer()
        texts = [prompts] if isinstance(prompts, str) else list(prompts)
        return [encode(tokenizer, text, i) for i, text in enumerate(texts)]

    def _text_sampling(self, sampling: dict) -> dict:
        eos = self.tokenizer.eos_token_id
        inside = eos is not None and self.vocab_size is not None and 0 <= eos < self.vocab_size
        if "eos_token_id" not in sampling and inside:
            return {**sampling, "eos_token_id": eos}
        return dict(sampling)

    def _generate_text(self, prompts, max_new_tokens, streamer, sampling):
        rows = self._text_rows(prompts)
        sampling = self._text_sampling(sampling)
        out = self.generate(rows, max_new_tokens, streamer=streamer, **sampling)
        texts = [
            decode(
                self.tokenizer,
                torch.cat([row, before_eos(ids[row.numel() :], sampling.get("eos_token_id"))]),
            )
            for row, ids in zip(rows, out, strict=True)
        ]
        return texts[0] if isinstance(prompts, str) else texts

    def stream_text(self, prompt: str, max_new_tokens: int, *, streamer=None, **sampling):
        """Yield the text each new token adds to ``prompt`` (one prompt), as soon as it is
        chosen; stops at the tokenizer's EOS unless ``eos_token_id`` is given. Keywords as for
        ``generate`` (``streamer(token_column)`` sees every token, EOS included, also those
        that add no text yet)."""
        if not isinstance(prompt, str):
            raise InputError(f"stream_text takes one text prompt, got {type(prompt).__name__}")
        (row,) = self._text_rows(prompt)
        sampling = self._text_sampling(sampling)
        eos = check_eos_token_id(sampling.get("eos_token_id"), self.vocab_size) or ()
        pieces = TextStream(self.tokenizer, row)
        for token in self.stream(row[None], max_new_tokens, **sampling):
            if streamer is not None:
                streamer(token)
            if int(token[0]) in eos:
                break
            piece = pieces.add(int(token[0]))
            if piece:
                yield piece
        rest = pieces.flush()
        if rest:
            yield rest

    # -- artifacts --------------------------------------------------------------------------
    def save(self, out_dir: str, overwrite: bool = False) -> dict:
        """Write the target's artifact directory (model files + manifest.json), atomically;
        returns the manifest."""
        from ssmcc.lowering.registry import get_target
        from ssmcc.version import __version__

        implementation = get_target(self.target).module()
        manifest = {
            "target": self.target,
            **{k: v for k, v in self.info.items() if k != "streaming_refusal"},
            "streaming": self.info.get("streaming_refusal") is None,
            "streaming_refusal": self.info.get("streaming_refusal"),
            "chunk_size": self.chunk_size,
            "states": [s.to_dict() for s in self._executable.specs],
        }

        def write_files(folder: str) -> dict:
            entries = dict(implementation.save(self._executable, folder))
            versions = {"ssmcc": __version__, "torch": torch.__version__}
            if self.tokenizer is not None:
                taken = set(os.listdir(folder)) | {MANIFEST}
                entries["tokenizer"] = save_tokenizer(self.tokenizer, folder, taken)
            return {**entries, "versions": {**versions, **entries.get("versions", {})}}

        return write_artifact(out_dir, write_files, manifest, overwrite)

    def __repr__(self) -> str:
        if self.report is None:
            return f"CompiledModel(target={self.target}, artifact={self.artifact_dir})"
        return (
            f"CompiledModel(model={self.report.capture.model}, target={self.target}, "
            f"nodes={self.report.node_count}, ops={self.report.op_counts})"
        )
