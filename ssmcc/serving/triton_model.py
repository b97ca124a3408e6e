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
- a request of one token continues the sequence with the step program; requests of one token from
  different sequences in the same batch run as one batched step (their states stacked along the
  batch; one by one where a state grows, as K/V caches do);
- a request of several tokens (a prompt, or a chunk of it) runs the chunked prefill from the
  sequence's state;
- ``END``: the state is freed after the response; a sequence idle for longer than the batcher's
  ``max_sequence_idle_microseconds`` (the ``idle_timeout_s`` parameter) is freed too, and a later
  request for it without ``START`` is answered with an error saying so.

Parameters (``config.pbtxt``): ``threads`` (intra-op threads of the model's runtime),
``idle_timeout_s``, ``python_path`` (prepended to ``sys.path`` before ssmcc is imported).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _parameters(config: dict) -> dict[str, str]:
    return {k: v.get("string_value", "") for k, v in config.get("parameters", {}).items()}


def _scalar(request, name: str) -> int:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return int(tensor.as_numpy().reshape(-1)[0]) if tensor is not None else 0


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = _parameters(config)
        for path in reversed(parameters.get("python_path", "").split(os.pathsep)):
            if path and path not in sys.path:
                sys.path.insert(0, path)
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
        self.states: dict[int, object] = {}
        self.last_used: dict[int, float] = {}
        self.lock = threading.Lock()

    def _expire(self, now: float) -> None:
        if self.idle_s <= 0:
            return
        for corrid in [c for c, t in self.last_used.items() if now - t > self.idle_s]:
            self.states.pop(corrid, None)
            self.last_used.pop(corrid, None)

    def _response(self, logits):
        row = logits.reshape(-1).float().numpy()
        return pb_utils.InferenceResponse(
            output_tensors=[
                pb_utils.Tensor("logits", row.astype(np.float32)),
                pb_utils.Tensor("next_token", np.array([int(row.argmax())], dtype=np.int64)),
            ]
        )

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

    def _steps(self, group, responses):
        """One batched step over the group's sequences (each one token, distinct sequences)."""
        tokens = self.torch.cat([ids for _, ids, _ in group])[:, 0]
        states = [self.states[corrid] for _, _, corrid in group]
        stacked = self.State(
            {s.name: self.torch.cat([st[s.name] for st in states]) for s in self.specs}
        )
        logits, state = self.model.step(tokens, stacked)
        for row, (i, _, corrid) in enumerate(group):
            self.states[corrid] = self.State({n: state[n][row : row + 1].clone() for n in state})
            responses[i] = self._response(logits[row])

    def execute(self, requests):
        with self.lock, self.torch.inference_mode():
            return self._execute(requests)

    def _execute(self, requests):
        now = time.monotonic()
        self._expire(now)
        responses = [None] * len(requests)
        ended, group = [], []
        for i, request in enumerate(requests):
            try:
                ids, corrid, start, end = self._read(request)
                self.last_used[corrid] = now
                if end:
                    ended.append(corrid)
                one_token = ids.shape[1] == 1 and corrid in self.states
                if one_token and self.batched_steps and all(c != corrid for *_, c in group):
                    group.append((i, ids, corrid))
                    continue
                if group:  # keep each sequence's requests in order
                    self._steps(group, responses)
                    group = []
                if one_token:
                    logits, self.states[corrid] = self.model.step(ids[:, 0], self.states[corrid])
                else:
                    logits, self.states[corrid] = self.model.prefill(
                        ids, self.states.get(corrid), last_only=True
                    )
                responses[i] = self._response(logits[0])
            except Exception as error:  # an answer per request, never a dead model
                responses[i] = self._error(f"{type(error).__name__}: {error}")
        if group:
            try:
                self._steps(group, responses)
            except Exception as error:
                for i, *_ in group:
                    responses[i] = self._error(f"{type(error).__name__}: {error}")
        for corrid in ended:
            self.states.pop(corrid, None)
            self.last_used.pop(corrid, None)
        return responses

    def finalize(self):
        self.states.clear()
