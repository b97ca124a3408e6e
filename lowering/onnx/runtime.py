"""Running an ssmcc ONNX model in ONNX Runtime, with or without the ssmcc custom-op library."""

from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import torch


def make_session(path: str, threads: int | None = None, library: str | None = None):
    """An ORT CPU session for ``path``; ``library``: the ssmcc custom-op library to register
    (its kernels then run the ssmcc nodes), or None for the portable function bodies."""
    options = ort.SessionOptions()
    if threads:
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
    if library is not None:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(os.fspath(path), options, providers=["CPUExecutionProvider"])


class OnnxRunner:
    """``runner(input_ids) -> logits`` (torch tensors in and out) over an ORT session."""

    def __init__(self, session, input_name: str = "input_ids"):
        self.session = session
        self.input_name = input_name

    def __call__(self, input_ids: torch.Tensor) -> torch.Tensor:
        feed = {self.input_name: np.ascontiguousarray(input_ids.numpy(), dtype=np.int64)}
        return torch.from_numpy(self.session.run(None, feed)[0])
