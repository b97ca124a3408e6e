"""Running an ssmcc ONNX model in ONNX Runtime, with or without the ssmcc custom-op library."""

from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort

# numpy views of weights.bin per ONNX element type (bfloat16 as its bits)
_VIEWS = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.BFLOAT16: np.uint16,
    onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8,
    onnx.TensorProto.INT16: np.int16,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.INT64: np.int64,
}


def custom_op_library(kernels: str) -> str | None:
    """The ssmcc ORT library for ``kernels="auto"`` when it builds here; None: portable bodies
    (``kernels="reference"``)."""
    if kernels == "reference":
        return None
    from ssmcc.kernels.cpu import build_ort_library

    return build_ort_library()


class SharedWeights:
    """One read-only memory map of a weights file, and one ``OrtValue`` per stored tensor over
    it, handed to every session of a model (``SessionOptions.add_initializer``: ONNX Runtime uses
    the caller's buffer as it is). Pages are read from the file when a kernel first touches
    them, and are the file's: one copy in memory however many sessions read them."""

    def __init__(self, path: str):
        self.path = path
        self._map = None
        self._values: dict[tuple, ort.OrtValue] = {}

    def initializers(self, graph_path: str) -> list[tuple[str, ort.OrtValue]]:
        """(name, value) for every initializer of the graph file stored in this weights file."""
        model = onnx.load(graph_path, load_external_data=False)
        found = []
        for tensor in model.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            if os.path.basename(info.get("location", "")) != os.path.basename(self.path):
                continue
            key = (
                int(info.get("offset", 0)),
                int(info["length"]),
                tensor.data_type,
                tuple(tensor.dims),
            )
            if key not in self._values:
                self._values[key] = self._value(*key)
            found.append((tensor.name, self._values[key]))
        return found

    def _value(self, offset: int, length: int, data_type: int, dims: tuple) -> ort.OrtValue:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        view = self._map[offset : offset + length].view(_VIEWS[data_type]).reshape(dims)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(view, data_type)


def make_session(
    path: str,
    kernels: str = "auto",
    threads: int | None = None,
    weights: SharedWeights | None = None,
):
    """An ORT CPU session for ``path``. With the ssmcc custom-op library registered its kernels
    run the ssmcc nodes; without it ORT inlines the portable function bodies. With ``weights``
    the session reads its stored initializers from that shared map and packs none of them, and
    runs its nodes in priority order (ONNX Runtime's default order runs every node that reads
    only initializers first: every ``Widen`` output of a 16-bit prefill graph alive at once, 2.5x
    the weights of mamba-130m bf16)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    library = custom_op_library(kernels)
    if library is not None:
        options.register_custom_ops_library(library)
    if weights is not None:
        for name, value in weights.initializers(os.fspath(path)):
            options.add_initializer(name, value)
        options.add_session_config_entry("session.disable_prepacking", "1")
        # run each weight's Widen just before its product, not all of them first
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    session.ssmcc_kernels = "ssmcc ORT library" if library else "portable function bodies"
    session.ssmcc_shared_weights = weights
    return session
