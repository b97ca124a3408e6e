"""``CompiledModel``: what ``ssmcc.compile`` returns, and its report."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid

import torch
from torch.export import ExportedProgram

from ssmcc.capture.inputs import check_token_ids
from ssmcc.capture.report import CaptureReport
from ssmcc.chunked import run_chunks
from ssmcc.errors import InputError, SSMCCError
from ssmcc.generation import Sampling, stream
from ssmcc.passes.chunk_state_passing import DEFAULT_CHUNK_SIZE, check_chunk_size
from ssmcc.prefix_cache import PrefixCache
from ssmcc.state import State, check_state


@dataclasses.dataclass
class CompileReport:
    target: str
    capture: CaptureReport
    pipeline: str
    passes_run: list[str]
    rule_hits: dict[str, int]
    node_count: int
    op_counts: dict[str, int]
    compile_seconds: float
    findings: list[str] = dataclasses.field(default_factory=list)  # scans not rewritten, and why

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """Human-readable summary, as ``ssmcc inspect`` prints it."""
        cap = self.capture
        lines = [
            f"model:          {cap.model}",
            f"routes:         {', '.join(cap.routes) or 'none'}",
            f"SSM layers:     {len(cap.ssm_layers)}",
        ]
        lines += [f"  {layer}" for layer in cap.ssm_layers]
        dims = "; ".join(f"{name}: ({', '.join(d)})" for name, d in cap.dynamic_dims.items())
        lines += [
            f"inputs:         {dims}",
            f"graph nodes:    {cap.node_count} captured -> {self.node_count} after passes",
            "ssmcc ops:      "
            + (", ".join(f"{op} x{n}" for op, n in self.op_counts.items()) or "none"),
            f"pipeline:       {self.pipeline} ({', '.join(self.passes_run) or 'no passes'})",
            "rule hits:      "
            + (", ".join(f"{rule} {n}" for rule, n in self.rule_hits.items()) or "none"),
            f"target:         {self.target}",
            f"time:           capture {cap.capture_seconds:.2f}s, "
            f"total {self.compile_seconds:.2f}s",
        ]
        lines += [f"note:           {note}" for note in cap.notes]
        if self.findings:
            lines.append(f"not rewritten:  {len(self.findings)} scan-like structure(s)")
            lines += [f"  {finding}" for finding in self.findings]
        return "\n".join(lines)


class CompiledModel:
    """A model compiled by ssmcc for one target.

    - ``compiled(input_ids) -> logits`` (b, l, vocab), like the model's forward;
    - ``prefill(input_ids, state=None) -> (logits, State)``: the prompt, from ``state`` or zeros,
      in chunks of ``chunk_size`` tokens (bounded activation memory); ``last_only=True`` returns
      only the last position's logits (b, vocab), and ``prefix_cache`` reuses cached prefixes;
    - ``step(token_ids, state) -> (logits (b, vocab), State)``: one token per row;
    - ``generate(input_ids, max_new_tokens, ...)`` and ``stream(...)``: greedy or sampled tokens.

    Every input is checked (dtype, rank, vocabulary, state names/shapes/batch) before anything
    runs. ``program``/``report``: the IR after passes and what capture and the passes did (None
    for a model opened with ``ssmcc.load``); ``manifest``: the saved artifact's description.
    """

    def __init__(
        self,
        runner,
        target: str,
        vocab_size: int | None,
        token_model: bool,
        program: ExportedProgram | None = None,
        report: CompileReport | None = None,
        manifest: dict | None = None,
        artifact_dir: str | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        static_length: int | None = None,
    ):
        self.chunk_size = check_chunk_size(chunk_size)
        self.static_length = static_length  # token count a static-length capture runs at
        self.program = program
        self.report = report
        self.manifest = manifest
        self.target = target
        self.vocab_size = vocab_size
        self.artifact_dir = artifact_dir
        self._runner = runner
        self._token_model = token_model
        self.model_id = _model_identity(manifest)

    @classmethod
    def from_artifact(
        cls, runner, manifest: dict, artifact_dir: str, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> CompiledModel:
        return cls(
            runner,
            manifest["target"],
            manifest.get("vocab_size"),
            manifest.get("vocab_size") is not None,
            manifest=manifest,
            artifact_dir=artifact_dir,
            chunk_size=chunk_size,
            static_length=manifest.get("static_length"),
        )

    @torch.inference_mode()
    def __call__(self, *args):
        if self._token_model:
            if len(args) != 1:
                raise TypeError("call a compiled language model with one argument: input_ids")
            input_ids = check_token_ids(args[0], self.vocab_size)
            if self.static_length is not None and input_ids.shape[1] != self.static_length:
                raise InputError(
                    f"this model was captured at a static length of {self.static_length} tokens "
                    f"(routing off), got input_ids of length {input_ids.shape[1]}; compile with "
                    "route=True (the default) for any length, or with example ids of this length"
                )
            return self._runner.logits(input_ids)
        return self._runner.logits(*args)

    # -- streaming decode -------------------------------------------------------------------
    @property
    def state_specs(self) -> list[dict]:
        """Name, shape (``batch`` first) and dtype of every state tensor, in program order."""
        self._require_states()
        return self._runner.specs

    def _require_states(self) -> None:
        if not self._token_model:
            raise SSMCCError(
                "prefill/step/generate need a language model (token ids in, logits "
                "out); this compiled model is a plain module"
            )
        if self.static_length is not None:
            raise SSMCCError(
                f"prefill/step/generate need a program whose length is dynamic; this one was "
                f"captured at a static length of {self.static_length} tokens (routing off). "
                "Compile with route=True (the default) to stream"
            )

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
        specs = self._runner.specs
        tensors = (
            State.zeros(specs, ids.shape[0]).tensors(specs)
            if state is None
            else check_state(state, specs, ids.shape[0])
        )
        if prefix_cache is not None:
            self._check_prefix_cache(prefix_cache, state, last_only)
        run = self._runner.prefill_last if last_only else self._runner.prefill
        outputs, new = run_chunks(run, ids, tensors, chunk_size, prefix_cache, self.model_id)
        logits = outputs[-1] if last_only else torch.cat(outputs, dim=1)
        return logits, State(dict(zip([s["name"] for s in specs], new, strict=True)))

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
        state_bytes = sum(4 * int(torch.Size(s["shape"][1:]).numel()) for s in self._runner.specs)
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
        specs = self._runner.specs
        logits, new = self._runner.step(ids, check_state(state, specs, ids.shape[0]))
        return logits, State(dict(zip([s["name"] for s in specs], new, strict=True)))

    def stream(
        self,
        input_ids,
        max_new_tokens: int,
        *,
        chunk_size: int | None = None,
        prefix_cache: PrefixCache | None = None,
        **sampling,
    ):
        """Yield each new token column (b,) as soon as it is chosen. Keyword arguments as for
        ``generate`` (without ``streamer``)."""
        self._require_states()
        eos_token_id = sampling.pop("eos_token_id", None)

        def prefill(ids):
            return self.prefill(
                ids, chunk_size=chunk_size, last_only=True, prefix_cache=prefix_cache
            )

        return stream(
            prefill,
            self.step,
            check_token_ids(input_ids, self.vocab_size),
            max_new_tokens,
            Sampling(**sampling),
            eos_token_id,
        )

    def generate(
        self, input_ids, max_new_tokens: int, *, streamer=None, **sampling
    ) -> torch.Tensor:
        """Prompt + new tokens (b, l + new).

        Keywords: ``do_sample`` (default greedy), ``temperature``, ``top_k``, ``top_p``, ``seed``,
        ``eos_token_id``; ``streamer(token_column)`` is called for each new token;
        ``chunk_size`` and ``prefix_cache`` as for ``prefill`` (the prompt runs with
        ``last_only=True``).
        """
        columns = []
        for token in self.stream(input_ids, max_new_tokens, **sampling):
            if streamer is not None:
                streamer(token)
            columns.append(token)
        return torch.cat([input_ids.long(), torch.stack(columns, dim=1)], dim=1)

    # -- artifacts --------------------------------------------------------------------------
    def save(self, out_dir: str, overwrite: bool = False) -> None:
        """Write the artifact directory (model files + manifest.json), atomically."""
        if self.artifact_dir is None:
            raise SSMCCError(
                f"target {self.target!r} has no saved form yet; compile with target='onnx' "
                "to get a deployable artifact"
            )
        from ssmcc.onnx_target import copy_artifact

        copy_artifact(self.artifact_dir, out_dir, overwrite)

    def __repr__(self) -> str:
        if self.report is None:
            return f"CompiledModel(target={self.target}, artifact={self.artifact_dir})"
        return (
            f"CompiledModel(model={self.report.capture.model}, target={self.target}, "
            f"nodes={self.report.node_count}, ops={self.report.op_counts})"
        )


def _model_identity(manifest: dict | None) -> str:
    """What prefix-cache keys name the model by: an artifact's content (the SHA-256 of its files'
    hashes, so two loads of one artifact share cached prefixes); otherwise this compiled object
    (a compiled torch model's weights may change after compiling another)."""
    if manifest is not None and "files" in manifest:
        text = json.dumps(manifest["files"], sort_keys=True)
        return "artifact:" + hashlib.sha256(text.encode()).hexdigest()
    return "compiled:" + uuid.uuid4().hex
