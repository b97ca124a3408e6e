"""Prefill products with int8 weights as ONNX Runtime's ``com.microsoft.MatMulNBits`` (8 bits).

The portable form of a quantised linear layer over many rows (``quantized.py``) is
``MatMul(x, Transpose(DequantizeLinear(W, s)))``: ONNX Runtime dequantises W into a float32
copy on every call and packs that copy again for its GEMM (1.2-1.3x the float32 prefill time of
mamba-130m at L=2048). ``MatMulNBits`` computes the same product from blocks of stored bytes::

    y[..., n] = sum_k x[..., k] (B[n, k] - 128) scale[n, k / bs]       B uint8 = W + 128

with its weights packed once, at session creation, for a float32 GEMM (``accuracy_level=1``: the
activations stay float32). The rewrite adds no weight to the file: B is computed in the graph
from the int8 initializer (``Cast``, ``Add``, ``Cast``, ``Reshape``), which ONNX Runtime folds
into a constant before packing it; the scale per block is a new initializer of N x K / bs
floats (the per-channel scale repeated). Measured on AMD EPYC Zen 5, 2 threads, x 2048 x 768,
W 3072 x 768: 25-28 ms, the float32 MatMul 25-27 ms, dequantise-then-MatMul 36-47 ms.

Only the ``onnx_functions="keep"`` artifact gets it (ONNX Runtime, with or without ssmcc's
library; stock onnxruntime ships the ``com.microsoft`` ops); the inline artifact, for other
runtimes, keeps the standard form. A chain whose block size would not be a power of two of at
least 16 (MatMulNBits' contract) stays as it is.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ssmcc.lowering.onnx.graph_edits import (
    remove_dead_nodes,
    remove_unused_initializers,
)

MS_DOMAIN = "com.microsoft"
MAX_BLOCK = 256  # per-channel scales: the largest power of two up to this dividing K


def _block_size(in_features: int, groups: int) -> int | None:
    """MatMulNBits' block: the group (a power of two >= 16), or for one scale per row the
    largest power of two <= MAX_BLOCK dividing K; None when neither exists."""
    if groups > 1:
        g = in_features // groups
        return g if g >= 16 and g & (g - 1) == 0 else None
    block = MAX_BLOCK
    while block >= 16:
        if in_features % block == 0:
            return block
        block //= 2
    return None


class _Graph:
    def __init__(self, graph: onnx.GraphProto, base_dir: str):
        self.base_dir = base_dir  # where external data is read from
        self.initializers = {t.name: t for t in graph.initializer}
        self.producer = {out: node for node in graph.node for out in node.output}

    def produced_by(self, name: str, op_type: str) -> onnx.NodeProto | None:
        node = self.producer.get(name)
        return node if node is not None and node.op_type == op_type and not node.domain else None

    def int8_weight(self, name: str) -> onnx.TensorProto | None:
        tensor = self.initializers.get(name)
        if tensor is None or tensor.data_type != TensorProto.INT8 or len(tensor.dims) != 2:
            return None
        return tensor


def _attribute(node: onnx.NodeProto, name: str):
    for attribute in node.attribute:
        if attribute.name == name:
            return helper.get_attribute_value(attribute)
    return None


def _match(g: _Graph, matmul: onnx.NodeProto):
    """(int8 initializer, n, k, scale (n, G)) when ``matmul``'s B is the transposed dequantised
    int8 weight (n, k), per channel (DequantizeLinear(W, s)) or per group (Reshape ->
    DequantizeLinear -> Reshape of W, the first Reshape possibly folded into W), with the scale a
    constant; else None."""
    transpose = g.produced_by(matmul.input[1], "Transpose")
    if transpose is None or list(_attribute(transpose, "perm") or []) != [1, 0]:
        return None
    dense = transpose.input[0]
    widen_back = g.produced_by(dense, "Reshape")
    dequantize = g.produced_by(widen_back.input[0] if widen_back else dense, "DequantizeLinear")
    if dequantize is None or len(dequantize.input) != 2 or _attribute(dequantize, "axis") != 0:
        return None
    flatten = g.produced_by(dequantize.input[0], "Reshape")
    weight = g.int8_weight(flatten.input[0] if flatten else dequantize.input[0])
    scale = g.initializers.get(dequantize.input[1])
    if weight is None or scale is None or scale.data_type != TensorProto.FLOAT:
        return None
    n, k = (int(d) for d in weight.dims)
    if widen_back is not None and flatten is None:  # the exporter folded W into (n G, g)
        shape = g.initializers.get(widen_back.input[1])
        if shape is None:
            return None
        n, k = (int(d) for d in numpy_helper.to_array(shape, g.base_dir))
    elif (flatten is None) != (widen_back is None):
        return None
    return weight, n, k, numpy_helper.to_array(scale, g.base_dir).reshape(n, -1)


def _rewrite(matmul: onnx.NodeProto, weight: onnx.TensorProto, n: int, k: int, scale, index: int):
    """The nodes and the scale initializer replacing ``matmul``, or None (no valid block)."""
    block = _block_size(k, scale.shape[1])
    if block is None:
        return None
    blocks = k // block
    per_block = np.repeat(scale, blocks // scale.shape[1], axis=1).astype(np.float32)
    prefix = f"nbits{index}"
    scales = numpy_helper.from_array(per_block.reshape(-1), f"{prefix}.scale")
    offset = numpy_helper.from_array(np.array(128, np.int16), f"{prefix}.offset")
    shape = numpy_helper.from_array(np.array([n, blocks, block], np.int64), f"{prefix}.shape")
    nodes = [
        helper.make_node("Cast", [weight.name], [f"{prefix}.wide"], to=TensorProto.INT16),
        helper.make_node("Add", [f"{prefix}.wide", offset.name], [f"{prefix}.shifted"]),
        helper.make_node("Cast", [f"{prefix}.shifted"], [f"{prefix}.bytes"], to=TensorProto.UINT8),
        helper.make_node("Reshape", [f"{prefix}.bytes", shape.name], [f"{prefix}.blocks"]),
        helper.make_node(
            "MatMulNBits",
            [matmul.input[0], f"{prefix}.blocks", scales.name],
            list(matmul.output),
            domain=MS_DOMAIN,
            K=k,
            N=n,
            bits=8,
            block_size=block,
            accuracy_level=1,  # float32 compute: the activations are never quantised
        ),
    ]
    return nodes, [scales, offset, shape]


def use_matmul_nbits(model: onnx.ModelProto, base_dir: str = "") -> int:
    """Rewrite, in place, every MatMul of x with a transposed dequantised int8 initializer into
    MatMulNBits; returns how many. Nodes left without readers are removed. External data is
    read relative to ``base_dir``."""
    g = _Graph(model.graph, base_dir)
    nodes, added, count = [], [], 0
    for node in model.graph.node:
        found = _match(g, node) if node.op_type == "MatMul" and not node.domain else None
        replacement = _rewrite(node, *found, count) if found else None
        if replacement is None:
            nodes.append(node)
            continue
        nodes.extend(replacement[0])
        added.extend(replacement[1])
        count += 1
    if not count:
        return 0
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(added)
    remove_dead_nodes(model.graph)
    remove_unused_initializers(model.graph)
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return count
