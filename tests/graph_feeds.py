"""Inputs for an ssmcc ONNX graph run by hand (ONNX Runtime, OpenVINO, ``onnx.reference``)."""

from __future__ import annotations

import numpy as np
import onnx


def token_feeds(model: onnx.ModelProto, batch: int, length: int, vocab: int, seed: int) -> dict:
    """Token ids and non-zero states; a K/V cache (its 'past' axis) holds 5 positions, and a
    position counter (int64) says 5 tokens came before."""
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        dims = value.type.tensor_type.shape.dim
        if value.name == "input_ids":
            feeds[value.name] = rng.integers(0, vocab, (batch, length)).astype(np.int64)
            continue
        shape = [batch] + [d.dim_value if d.HasField("dim_value") else 5 for d in dims[1:]]
        if value.type.tensor_type.elem_type == onnx.TensorProto.INT64:
            feeds[value.name] = np.full(shape, 5, dtype=np.int64)
        else:
            feeds[value.name] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return feeds
