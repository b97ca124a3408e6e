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


def random_feeds(model: onnx.ModelProto, length: int, seed: int) -> dict:
    """Standard-normal float32 inputs for every graph input, each named (symbolic) dim set to
    ``length``, and ``A`` (a scan's decay) made negative."""
    rng = np.random.default_rng(seed)
    feeds = {
        v.name: rng.standard_normal(
            [length if d.dim_param else d.dim_value for d in v.type.tensor_type.shape.dim]
        ).astype(np.float32)
        for v in model.graph.input
    }
    feeds["A"] = -np.abs(feeds["A"])
    return feeds
