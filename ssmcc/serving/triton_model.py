"""The ``model.py`` of an ssmcc model in a Triton Inference Server repository (Python backend).

Copied as it is into ``REPO/<name>/1/model.py`` by ``ssmcc export-serving``; it loads the ssmcc
artifact beside it (``1/artifact``) with ``ssmcc.load`` and serves prefill chunks and decode
steps through one interface. A request carries ``input_ids`` (1, L) of one sequence and the
sequence batcher's controls ``START``, ``END`` and ``CORRID``; the response is the last position's
``logits`` (vocab,) and its greedy ``next_token`` (1,).

Triton's implicit state is not implemented by the Python backend, so the per-layer states live
here, keyed by ``CORRID``:

- ``START``: the sequence begins from the zero state (a sequence ended and restarted with the same
  id starts afresh);
- a request of one token continues the sequence with the step program, a request of several
  tokens (a prompt, or a chunk of it) runs the chunked prefill from the sequence's state;
- requests of different sequences in one batch with the same token count run as one call, their
  states stacked along the batch (one by one where a state grows, as K/V caches do, whose lengths
  differ between sequences);
- ``END``: the state is freed after the response; a sequence idle for longer than the batcher's
  ``max_sequence_idle_microseconds`` (the ``idle_timeout_s`` parameter) is freed too, and a later
  request for it without ``START`` is answered with an error saying so.

Parameters (``config.pbtxt``): ``threads`` (intra-op threads of the model's runtime),
``idle_timeout_s``, ``python_path``: the exporting interpreter's ``sys.path``, read from the file
when this module is imported and put first on the stub's path before numpy is imported (the
stub's interpreter has its own site-packages, whose numpy must not shadow the environment's), with
the ``.pth`` files of its site directories run (an editable install of ssmcc is such a file, and
``ssmcc.kernels`` etc. import through it).
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
import threading
import time


def _use_python_path(python_path: str) -> None:
    """Put the exporting interpreter's path entries first on ``sys.path`` and run the ``.pth``
    files of those that are site directories (``site.addsitedir`` leaves an entry already on the
    path where it is)."""
    paths = [p for p in python_path.split(os.pathsep) if p]
    for path in reversed(paths):
        if path not in sys.path:
            sys.path.insert(0, path)
    for path in paths:
        if os.path.isdir(path) and any(name.endswith(".pth") for name in os.listdir(path)):
            site.addsitedir(path)


def _configured_python_path() -> str:
    """The ``python_path`` parameter of this model's ``config.pbtxt`` (``REPO/<name>/``)."""
    model_folder = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    config = os.path.join(model_folder, "config.pbtxt")
    try:
        with open(config) as f:
            text = f.read()
    except OSError:
        return ""
    found = re.search(r'key:\s*"python_path"\s*value:\s*\{\s*string_value:\s*"([^"]*)"', text)
    return found.group(1) if found else ""


# Before numpy is imported: the stub's interpreter has its own site-packages, whose numpy (or any
# other package) must not shadow the one of the environment that exported the repository.
_use_python_path(_configured_python_path())

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


def _parameters(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _scalar(request, name: str) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return int(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else 0


class _Batch:
    """States returned for a batch of sequences; each sequence refers to its row (freed when no
    sequence refers to it any more)."""

    def __init__(self, state):
        self.state = state

    def __len__(self) -> int:
        return self.state.batch

    def row(self, row: int):
        return type(self.state)({n: t[row : row + 1] for n, t in self.state.items()})


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = _parameters(config)
        import torch

        import ssmcc
        from ssmcc.runtime.state import State

        self.torch, self.State = torch, State
        threads = int(parameters.get("threads", "0") or 0) or None
        if threads:
            torch.set_num_threads(threads)
        folder = os.path.join(args["model_repository"], args["model_version"], "artifact")
        with open(os.path.join(folder, "manifest.json")) as f:
            target = json.load(f)["target"]
        options = {"threads": threads} if threads and target == "onnx" else {}
        self.model = ssmcc.load(folder, **options)
        self.specs = self.model.executable.specs
        self.batched_steps = not any(spec.grows for spec in self.specs)
        self.idle_s = float(parameters.get("idle_timeout_s", "0") or 0)
        self.states: dict[int, tuple[_Batch, int]] = {}  # CORRID -> its row of a batch
        self.last_used: dict[int, float] = {}
        self.lock = threading.Lock()

    def _expire(self, now: float) -> None:
        if self.idle_s <= 0:
            return
        for corrid in [c for c, t in self.last_used.items() if now - t > self.idle_s]:
            self.states.pop(corrid, None)
            self.last_used.pop(corrid, None)

    def _response(self, request, logits):
        """The outputs the request asked for (all when it names none)."""
        row = logits.reshape(-1).float()
        wanted = set(request.requested_output_names()) or {"logits", "next_token"}
        outputs = []
        if "logits" in wanted:
            outputs.append(pb_utils.Tensor("logits", row.numpy().astype(np.float32)))
        if "next_token" in wanted:
            token = np.array([int(row.argmax())], dtype=np.int64)
            outputs.append(pb_utils.Tensor("next_token", token))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def _error(self, message: str):
        return pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError(message))

    def _read(self, request):
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
        ids = self.torch.from_numpy(np.ascontiguousarray(ids.reshape(1, -1)).astype(np.int64))
        corrid, start = _scalar(request, "CORRID"), _scalar(request, "START")
        if ids.shape[1] == 0:
            raise ValueError(f"sequence {corrid}: input_ids holds no token")
        if start:
            self.states.pop(corrid, None)
        elif corrid not in self.states:
            raise LookupError(
                f"sequence {corrid} is unknown or has expired (freed at END or after "
                f"{self.idle_s:g} s idle): start it again with sequence_start=True and its "
                "prompt"
            )
        return ids, corrid, start, _scalar(request, "END")

    def _stacked(self, group):
        """The group's states as one batch. A group that is exactly the batch an earlier call
        returned (the same sequences in the same order: decode in steady state) reuses it as it
        is; otherwise each sequence's rows are concatenated (zeros at START). For mamba-130m x 16
        sequences, copying the states apart and back together took 29 ms a step beside the
        step's 77 ms."""
        places = [None if start else self.states[corrid] for _, _, corrid, start in group]
        first = places[0]
        if first is not None and len(first[0]) == len(group):
            if all(p is not None and p[0] is first[0] and p[1] == r for r, p in enumerate(places)):
                return first[0].state
        rows = [self.State.zeros(self.specs, 1) if p is None else p[0].row(p[1]) for p in places]
        if len(rows) == 1:
            return rows[0]
        return self.State({s.name: self.torch.cat([r[s.name] for r in rows]) for s in self.specs})

    def _run(self, group, requests, responses) -> None:
        """One call for requests of distinct sequences with the same token count: their states
        stacked along the batch (``_stacked``), ``step`` for one token, else the chunked
        ``prefill`` (last position's logits); each sequence then refers to its row of the
        returned batch."""
        ids = self.torch.cat([item[1] for item in group])
        stacked = self._stacked(group)
        if ids.shape[1] == 1 and not all(start for *_, start in group):
            logits, state = self.model.step(ids[:, 0], stacked)
        else:
            logits, state = self.model.prefill(ids, stacked, last_only=True)
        batch = _Batch(state)
        for row, (i, _, corrid, _) in enumerate(group):
            self.states[corrid] = (batch, row)
            responses[i] = self._response(requests[i], logits[row])

    def _groups(self, items):
        """Rounds of groups: within a round each sequence appears once (a sequence's later
        request waits for the next round); a group shares a token count, and holds one request
        where a state grows (K/V caches of different lengths do not stack)."""
        while items:
            seen, now, later = set(), [], []
            for item in items:
                (later if item[2] in seen else now).append(item)
                seen.add(item[2])
            by_length: dict[int, list] = {}
            for item in now:
                if self.batched_steps:
                    by_length.setdefault(item[1].shape[1], []).append(item)
                else:
                    yield [item]
            yield from by_length.values()
            items = later

    def execute(self, requests):
        with self.lock, self.torch.inference_mode():
            return self._execute(requests)

    def _execute(self, requests):
        now = time.monotonic()
        self._expire(now)
        responses = [None] * len(requests)
        items, ended = [], []
        for i, request in enumerate(requests):
            try:
                ids, corrid, start, end = self._read(request)
            except Exception as error:  # an answer per request, never a dead model
                responses[i] = self._error(f"{type(error).__name__}: {error}")
                continue
            self.last_used[corrid] = now
            items.append((i, ids, corrid, start))
            if end:
                ended.append(corrid)
        for group in self._groups(items):
            try:
                self._run(group, requests, responses)
            except Exception as error:
                for i, *_ in group:
                    responses[i] = self._error(f"{type(error).__name__}: {error}")
        for corrid in ended:
            self.states.pop(corrid, None)
            self.last_used.pop(corrid, None)
        return responses

    def finalize(self):
        self.states.clear()
