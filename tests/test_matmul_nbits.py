"""The ONNX Runtime artifact's int8 prefill products as com.microsoft.MatMulNBits
(lowering/onnx/matmul_nbits.py): which chains are rewritten, into what, and that the result is
the quantised program's (the inline artifact keeps the standard form)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ssmcc
from ssmcc.lowering.onnx.matmul_nbits import _block_size, use_matmul_nbits
from ssmcc.ops.quantized_linear import quantize_weight
from tests.conftest import make_hf_model


@pytest.mark.parametrize(
    "in_features,groups,block",
    [
        (768, 1, 256),
        (1536, 1, 256),
        (96, 1, 32),
        (48, 1, 16),
        (24, 1, None),
        (128, 4, 32),
        (96, 4, None),
        (128, 16, None),
    ],
)
def test_block_size_is_a_power_of_two_of_at_least_16(in_features, groups, block):
    assert _block_size(in_features, groups) == block


def _chain(weight, scale, rows=5):
    """x (rows, k) @ Transpose(DequantizeLinear(weight, scale, axis=0)): the per-channel form."""
    n, k = weight.shape
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["dense"], axis=0),
        helper.make_node("Transpose", ["dense"], ["dense_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "dense_t"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, n])],
        [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "s")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _run(model, x):
    return ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]


def test_a_per_channel_chain_becomes_matmul_nbits_with_the_same_result():
    stored, scale = quantize_weight(torch.randn(37, 96), "int8")
    model = _chain(stored.numpy(), scale.reshape(-1).numpy())
    x = np.random.default_rng(0).standard_normal((5, 96)).astype(np.float32)
    expected = _run(model, x)
    assert use_matmul_nbits(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMulNBits") == 1 and not {"DequantizeLinear", "MatMul"} & set(ops)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attributes["bits"] == 8 and attributes["block_size"] == 32
    assert attributes["accuracy_level"] == 1  # float32 activations: never quantised
    # no second copy of the weight: MatMulNBits' bytes are computed from the int8 initializer
    int8 = [t for t in model.graph.initializer if t.data_type == TensorProto.INT8]
    assert [t.name for t in int8] == ["w"]
    assert not [t for t in model.graph.initializer if t.data_type == TensorProto.UINT8]
    np.testing.assert_allclose(_run(model, x), expected, rtol=1e-5, atol=1e-5)


def test_chains_it_cannot_express_are_left_as_they_are():
    stored, scale = quantize_weight(torch.randn(8, 24), "int8")  # K = 24: no block of >= 16
    model = _chain(stored.numpy(), scale.reshape(-1).numpy())
    assert use_matmul_nbits(model) == 0
    assert [n.op_type for n in model.graph.node] == ["DequantizeLinear", "Transpose", "MatMul"]
    unsigned = _chain(np.full((8, 32), 130, np.uint8), np.ones(8, np.float32))  # not int8
    assert use_matmul_nbits(unsigned) == 0


@pytest.mark.parametrize("scheme", ["int8", "int8-g32"])
def test_compiled_artifacts_use_it_on_onnxruntime_only(scheme):
    model = make_hf_model("mamba", hidden_size=64, vocab_size=300, seed=3)
    products = 2 * model.config.num_hidden_layers + 1
    ids = torch.randint(0, 300, (2, 19))
    reference = ssmcc.compile(model, target="torch", quantize=scheme, kernels="reference")
    with torch.no_grad():
        expected = reference.program.module()(ids)
    # the chunk graph's LM head sees one row per sequence: a QuantizedLinear node, not a GEMM
    keep = {"prefill": products, "chunk": products - 1}
    for option, counts in (("keep", keep), ("inline", {"prefill": 0, "chunk": 0})):
        compiled = ssmcc.compile(model, target="onnx", quantize=scheme, onnx_functions=option)
        for graph, count in counts.items():
            proto = onnx.load(
                f"{compiled.executable.folder}/{graph}.onnx", load_external_data=False
            )
            assert [n.op_type for n in proto.graph.node].count("MatMulNBits") == count, graph
        torch.testing.assert_close(compiled(ids), expected, rtol=1e-4, atol=1e-4)


def test_the_manifest_names_the_operator_sets_the_graphs_import(tmp_path):
    import json

    model = make_hf_model("mamba", hidden_size=64, vocab_size=300, seed=3)
    ssmcc.compile(model, target="onnx", quantize="int8").save(str(tmp_path / "a"))
    manifest = json.loads((tmp_path / "a" / "manifest.json").read_text())
    assert manifest["opset"] == {"": 20, "ssmcc": 1, "com.microsoft": 1}
