"""Running an ssmcc ONNX model in ONNX Runtime, with or without the ssmcc custom-op library."""

from __future__ import annotations

import os

import onnxruntime as ort


def custom_op_library(kernels: str) -> str | None:
    """The ssmcc ORT library for ``kernels="auto"`` when it builds here; None: portable bodies
    (``kernels="reference"``)."""
    if kernels == "reference":
        return None
    from ssmcc.kernels.cpu import build_ort_library

    return build_ort_library()


def make_session(path: str, kernels: str = "auto", threads: int | None = None):
    """An ORT CPU session for ``path``. With the ssmcc custom-op library registered its kernels
    run the ssmcc nodes; without it ORT inlines the portable function bodies."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    library = custom_op_library(kernels)
    if library is not None:
        options.register_custom_ops_library(library)
    session = ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])
    session.ssmcc_kernels = "ssmcc ORT library" if library else "portable function bodies"
    return session
