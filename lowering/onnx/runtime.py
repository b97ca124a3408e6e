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


def external_locations(model: onnx.ModelProto) -> set[str]:
    """The files a model's initializers read external data from."""
    return {
        info.get("location", "")
        for tensor in model.graph.initializer
        if tensor.data_location == onnx.TensorProto.EXTERNAL
        for info in [{entry.key: entry.value for entry in tensor.external_data}]
    }


class SharedWeights:
    """One read-only uint8 array holding a weights file (a loaded artifact's verified copy, or a
    compile's private file mapped), and one ``OrtValue`` per stored tensor over it, handed to
    every session of a model (``SessionOptions.add_initializer``: ONNX Runtime uses the caller's
    buffer as it is): one copy in memory however many sessions read them."""

    def __init__(self, name: str, data: np.ndarray):
        self.name = name
        self.data = data
        self._values: dict[tuple, ort.OrtValue] = {}

    def initializers(self, model: onnx.ModelProto) -> list[tuple[str, ort.OrtValue]]:
        """(name, value) for every initializer of the graph stored in this weights file."""
        found = []
        for tensor in model.graph.initializer:
            if tensor.data_location != onnx.TensorProto.EXTERNAL:
                continue
            info = {entry.key: entry.value for entry in tensor.external_data}
            if info.get("location", "") != self.name:
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
        view = self.data[offset : offset + length].view(_VIEWS[data_type]).reshape(dims)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(view, data_type)


def make_session(
    model: str | os.PathLike | bytes,
    kernels: str = "auto",
    threads: int | None = None,
    weights: SharedWeights | None = None,
    external: dict[str, np.ndarray] | None = None,
):
    """An ORT CPU session for ``model``: a path (ONNX Runtime reads it and its external data
    from disk) or the model's bytes, whose external data files ``external`` holds in memory
    (name -> uint8 array; ONNX Runtime never opens a file). With the ssmcc custom-op library
    registered its kernels run the ssmcc nodes; without it ORT inlines the portable function
    bodies. With ``weights`` the session reads its stored initializers from that shared array
    and packs none of them, and runs its nodes in priority order (ONNX Runtime's default order
    runs every node that reads only initializers first: every ``Widen`` output of a 16-bit
    prefill graph alive at once, 2.5x the weights of mamba-130m bf16)."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    library = custom_op_library(kernels)
    if library is not None:
        options.register_custom_ops_library(library)
    if external:
        names = sorted(external)
        options.add_external_initializers_from_files_in_memory(
            names, [external[n] for n in names], [external[n].nbytes for n in names]
        )
    if weights is not None:
        proto = onnx.load_from_string(model) if isinstance(model, bytes) else onnx.load(
            os.fspath(model), load_external_data=False
        )
        for name, value in weights.initializers(proto):
            options.add_initializer(name, value)
        options.add_session_config_entry("session.disable_prepacking", "1")
        # run each weight's Widen just before its product, not all of them first
        options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    source = model if isinstance(model, bytes) else os.fspath(model)
    session = ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    session.ssmcc_kernels = "ssmcc ORT library" if library else "portable function bodies"
    session.ssmcc_shared_weights = weights
    return session
