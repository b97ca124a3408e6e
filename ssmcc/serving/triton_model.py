"""The ``model.py`` of an ssmcc model in a Triton Inference Server repository (Python backend).

Copied as it is into ``REPO/<name>/1/model.py`` by ``ssmcc export-serving``; it loads the ssmcc
artifact beside it (``1/artifact``) with ``ssmcc.load`` and serves prefill chunks and decode
steps through one interface. A request carries ``input_ids`` (1, L) of one sequence and the
sequence batcher's controls ``START``, ``END`` and ``CORRID``; the response is the last position's
``logits`` (vocab,) and its greedy ``next_token`` (1,), or the request's own error.

Triton's implicit state is not implemented by the Python backend, so the per-layer states live
here, keyed by ``CORRID``, in ``ssmcc.serving.sequences.Sequences``, which checks each request
before it joins a batch (ids in the vocabulary, at most ``max_request_tokens`` of them, a known
sequence), batches requests of different sequences, and retries a failing batch request by
request so that one client's bad request never fails another's.

Parameters (``config.pbtxt``): ``threads`` (intra-op threads of the model's runtime),
``idle_timeout_s``, ``max_request_tokens`` (0: no limit), ``python_path``: the exporting
interpreter's ``sys.path``, read from the file when this module is imported and put first on the
stub's path before numpy is imported (the stub's interpreter has its own site-packages, whose
numpy must not shadow the environment's), with the ``.pth`` files of its site directories run (an
editable install of ssmcc is such a file, and ``ssmcc.kernels`` etc. import through it).
"""

from __future__ import annotations

import json
import os
import re
import site
import sys
import threading


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


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        parameters = _parameters(config)
        import torch

        import ssmcc
        from ssmcc.runtime.artifact import read_manifest
        from ssmcc.serving.sequences import Request, Sequences

        self.torch, self.Request = torch, Request
        threads = int(parameters.get("threads", "0") or 0) or None
        if threads:
            torch.set_num_threads(threads)
        folder = os.path.join(args["model_repository"], args["model_version"], "artifact")
        target = read_manifest(folder)["target"]
        options = {"threads": threads} if threads and target == "onnx" else {}
        self.sequences = Sequences(
            ssmcc.load(folder, **options),
            idle_s=float(parameters.get("idle_timeout_s", "0") or 0),
            max_request_tokens=int(parameters.get("max_request_tokens", "0") or 0) or None,
        )
        self.lock = threading.Lock()

    def _request(self, request):
        ids = pb_utils.get_input_tensor_by_name(request, "input_ids")
        return self.Request(
            ids=None if ids is None else ids.as_numpy(),
            corrid=_scalar(request, "CORRID"),
            start=bool(_scalar(request, "START")),
            end=bool(_scalar(request, "END")),
        )

    def _response(self, request, answer):
        """The outputs the request asked for (all when it names none), or its error."""
        if answer.error is not None:
            error = pb_utils.TritonError(answer.error)
            return pb_utils.InferenceResponse(output_tensors=[], error=error)
        row = answer.logits
        wanted = set(request.requested_output_names()) or {"logits", "next_token"}
        outputs = []
        if "logits" in wanted:
            outputs.append(pb_utils.Tensor("logits", row.numpy().astype(np.float32)))
        if "next_token" in wanted:
            token = np.array([int(row.argmax())], dtype=np.int64)
            outputs.append(pb_utils.Tensor("next_token", token))
        return pb_utils.InferenceResponse(output_tensors=outputs)

    def execute(self, requests):
        with self.lock, self.torch.inference_mode():
            answers = self.sequences.execute([self._request(r) for r in requests])
        return [self._response(r, a) for r, a in zip(requests, answers, strict=True)]

    def finalize(self):
        self.sequences.states.clear()
