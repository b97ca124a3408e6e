"""Greedy decode of an ssmcc ONNX artifact in OpenVINO, for the decode benchmarks.

The artifact is compiled with ``onnx_functions="inline"`` (standard ONNX ops only, which
OpenVINO reads); its ``chunk`` graph runs the prompt (last-position logits) and its ``step``
graph one token at a time, the states fed back from each call's outputs, as ``CompiledModel``
does with ONNX Runtime. OpenVINO's CPU plugin runs with ``INFERENCE_PRECISION_HINT=f32`` and
``DYNAMIC_QUANTIZATION_GROUP_SIZE=0`` (the settings under which it matches ONNX Runtime within
1e-4: ``tests/test_openvino.py``), one stream, ``threads`` inference threads.
"""

from __future__ import annotations

import os
import tempfile

import numpy as np


class OpenVinoDecoder:
    def __init__(self, model, quantize: str, threads: int):
        import openvino as ov

        import ssmcc

        self._folder = tempfile.TemporaryDirectory(prefix="ssmcc-openvino-")
        folder = os.path.join(self._folder.name, "artifact")
        compiled = ssmcc.compile(model, "onnx", onnx_functions="inline", quantize=quantize)
        manifest = compiled.save(folder)
        config = {
            "INFERENCE_PRECISION_HINT": "f32",
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
            "NUM_STREAMS": "1",
            "INFERENCE_NUM_THREADS": str(threads),
        }
        core = ov.Core()
        self._graphs = {
            graph: core.compile_model(
                os.path.join(folder, manifest["graphs"][graph]["file"]), "CPU", config
            ).create_infer_request()
            for graph in ("chunk", "step")
        }
        self._states = manifest["states"]  # the graphs take input_ids, then these, in order

    def _zeros(self, batch: int) -> list[np.ndarray]:
        arrays = []
        for spec in self._states:
            shape = [batch] + [
                0 if axis in spec.get("grows", []) else size
                for axis, size in enumerate(spec["shape"][1:])
            ]
            dtype = np.int64 if spec.get("dtype") == "int64" else np.float32
            arrays.append(np.zeros(shape, dtype=dtype))
        return arrays

    def _run(self, graph: str, ids: np.ndarray, states: list[np.ndarray]):
        request = self._graphs[graph]
        request.infer([ids, *states])
        outputs = [request.get_output_tensor(i).data.copy() for i in range(1 + len(states))]
        return outputs[0], outputs[1:]

    def generate(self, prompt, new_tokens: int) -> np.ndarray:
        """Greedy tokens (b, new_tokens) after ``prompt`` (b, l): ids as a tensor or an array
        (timed like ``CompiledModel.generate`` by the decode benchmark)."""
        prompt = np.asarray(prompt, dtype=np.int64)
        logits, states = self._run("chunk", prompt, self._zeros(prompt.shape[0]))
        tokens = []
        for produced in range(new_tokens):
            token = logits.reshape(prompt.shape[0], -1).argmax(-1)[:, None].astype(np.int64)
            tokens.append(token)
            if produced + 1 < new_tokens:
                logits, states = self._run("step", token, states)
        return np.concatenate(tokens, axis=1)
