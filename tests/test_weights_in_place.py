"""Float32 products that read their weights where weights.bin stores them
(lowering/onnx/weights_in_place.py) and the sessions that share one map of the file
(lowering/onnx/runtime.py SharedWeights): which products are rewritten and into what, that the
results are unchanged (with ssmcc's library and with the portable body alone), the ssmcc ORT
library's Linear node against numpy, and a compiled artifact whose graphs share their weights."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ssmcc
from ssmcc.lowering.onnx.runtime import SharedWeights, custom_op_library
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION
from ssmcc.lowering.onnx.weights_in_place import read_weights_in_place
from tests.conftest import make_hf_model

TOLERANCE = dict(rtol=1e-5, atol=1e-4)  # float32 sums in another order


def _library():
    library = custom_op_library("auto")
    if library is None:
        pytest.skip("the ssmcc ORT library does not build here")
    return library


def _model(nodes, inputs, outputs, initializers):
    graph = helper.make_graph(nodes, "products", inputs, outputs, initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, VERSION)]
    )


def _products(rng, k=96, n=37):
    """y = x B (B an initializer (k, n)), z = u Transpose(W) (W (n, k)), x with a symbolic
    sequence axis, u with one row per sequence."""
    b = rng.standard_normal((k, n)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "b"], ["y"]),
        helper.make_node("Transpose", ["w"], ["w_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["u", "w_t"], ["z"]),
    ]
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k]),
        helper.make_tensor_value_info("u", TensorProto.FLOAT, ["batch", 1, k]),
    ]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", n]),
        helper.make_tensor_value_info("z", TensorProto.FLOAT, ["batch", 1, n]),
    ]
    return (
        _model(
            nodes,
            inputs,
            outputs,
            [numpy_helper.from_array(b, "b"), numpy_helper.from_array(w, "w")],
        ),
        b,
        w,
    )


def _run(model, feed, library=None):
    options = ort.SessionOptions()
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feed)


@pytest.mark.parametrize("with_library", [True, False], ids=["ssmcc-library", "portable-body"])
def test_products_read_the_weight_as_pytorch_stores_it_with_unchanged_results(with_library):
    library = _library() if with_library else None
    rng = np.random.default_rng(0)
    model, b, w = _products(rng)
    feed = {
        "x": rng.standard_normal((3, 11, 96)).astype(np.float32),
        "u": rng.standard_normal((3, 1, 96)).astype(np.float32),
    }
    before = _run(model, feed)

    assert read_weights_in_place(model) == 2
    kinds = {node.output[0]: (node.domain, node.op_type) for node in model.graph.node}
    assert kinds == {"y": ("com.microsoft", "FusedMatMul"), "z": (DOMAIN, "Linear")}
    stored = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    np.testing.assert_array_equal(stored["b"], b.T)  # (n, k): B stored transposed back
    np.testing.assert_array_equal(stored["w"], w)  # the tied weight as it was, no Transpose
    onnx.checker.check_model(model, full_check=True)
    after = _run(model, feed, library)
    for got, want in zip(after, before, strict=True):
        np.testing.assert_allclose(got, want, **TOLERANCE)


def test_a_tied_head_stored_transposed_is_stored_once_as_the_embedding():
    """torch.onnx may keep the head's (k, n) copy and make the embedding Transpose(B): after the
    rewrite the stored (n, k) weight is the embedding itself, no Transpose left."""
    rng = np.random.default_rng(2)
    b = rng.standard_normal((8, 5)).astype(np.float32)  # (k, n): the head, pre-transposed
    nodes = [
        helper.make_node("Transpose", ["b"], ["table"], perm=[1, 0]),
        helper.make_node("Gather", ["table", "ids"], ["h"]),
        helper.make_node("MatMul", ["h", "b"], ["logits"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 5])],
        [numpy_helper.from_array(b, "b")],
    )
    feed = {"ids": np.array([[0, 4, 2]], np.int64)}
    before = _run(model, feed)
    assert read_weights_in_place(model) == 1
    assert [n.op_type for n in model.graph.node] == ["Gather", "FusedMatMul"]
    (stored,) = model.graph.initializer
    np.testing.assert_array_equal(numpy_helper.to_array(stored), b.T)
    np.testing.assert_allclose(_run(model, feed)[0], before[0], **TOLERANCE)


@pytest.mark.parametrize("groups", [1, 4], ids=["per-channel", "per-group"])
def test_an_int8_weight_dequantised_per_call_is_read_without_a_transpose(groups):
    """quantized.py's int8 prefill form, x @ Transpose(DequantizeLinear(W, s)) (per group: W
    reshaped to (n G, g) and back around it), becomes FusedMatMul(transB) on the dequantised
    (n, k) weight: ONNX Runtime then holds the int8 initializer only, no float32 copy of it."""
    rng = np.random.default_rng(groups)
    n, k = 37, 64
    weight = rng.integers(-127, 128, (n, k), dtype=np.int8)
    scale = rng.uniform(0.001, 0.02, (n * groups,)).astype(np.float32)
    initializers = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(scale, "s")]
    if groups == 1:
        nodes = [helper.make_node("DequantizeLinear", ["w", "s"], ["dense"], axis=0)]
    else:
        initializers += [
            numpy_helper.from_array(np.array([n * groups, k // groups], np.int64), "flat_shape"),
            numpy_helper.from_array(np.array([n, k], np.int64), "shape"),
        ]
        nodes = [
            helper.make_node("Reshape", ["w", "flat_shape"], ["flat"]),
            helper.make_node("DequantizeLinear", ["flat", "s"], ["widened"], axis=0),
            helper.make_node("Reshape", ["widened", "shape"], ["dense"]),
        ]
    nodes += [
        helper.make_node("Transpose", ["dense"], ["dense_t"], perm=[1, 0]),
        helper.make_node("MatMul", ["x", "dense_t"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", n])],
        initializers,
    )
    feed = {"x": rng.standard_normal((2, 9, k)).astype(np.float32)}
    dense = (weight.reshape(n * groups, -1) * scale[:, None]).reshape(n, k)
    np.testing.assert_allclose(_run(model, feed)[0], feed["x"] @ dense.T, **TOLERANCE)

    assert read_weights_in_place(model) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops[-1] == "FusedMatMul" and "Transpose" not in ops and "MatMul" not in ops
    assert {t.name for t in model.graph.initializer} >= {"w", "s"}
    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(_run(model, feed)[0], feed["x"] @ dense.T, **TOLERANCE)


def test_a_widened_weight_under_a_transpose_of_every_axis_is_left_as_it_is():
    """Transpose without perm reverses every axis; FusedMatMul's transB swaps the last two only,
    so a widened weight of unknown rank is read in place only under an explicit perm [1, 0]."""
    rng = np.random.default_rng(3)
    weight = rng.integers(-127, 128, (2, 5, 8), dtype=np.int8)
    nodes = [
        helper.make_node("DequantizeLinear", ["w", "s"], ["dense"]),
        helper.make_node("Transpose", ["dense"], ["dense_t"]),
        helper.make_node("MatMul", ["x", "dense_t"], ["y"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 3, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(weight, "w"),
            numpy_helper.from_array(np.array(0.01, np.float32), "s"),
        ],
    )
    assert read_weights_in_place(model) == 0
    assert [n.op_type for n in model.graph.node] == ["DequantizeLinear", "Transpose", "MatMul"]


def test_a_weight_read_by_anything_but_products_is_left_as_it_is():
    rng = np.random.default_rng(1)
    b = rng.standard_normal((8, 5)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "b"], ["y"]),
        helper.make_node("Identity", ["b"], ["b_out"]),
    ]
    model = _model(
        nodes,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 5]),
            helper.make_tensor_value_info("b_out", TensorProto.FLOAT, [8, 5]),
        ],
        [numpy_helper.from_array(b, "b")],
    )
    assert read_weights_in_place(model) == 0
    assert [n.op_type for n in model.graph.node] == ["MatMul", "Identity"]


# rows: one (16-row tiles), and the 3-row tiles with none, one or two rows left over; the
# rewrite uses the node for few rows, but any count is right
@pytest.mark.parametrize("rows", [1, 2, 4, 5, 9, 300])
# out_features: under a tile, partial tiles (21 = 16 + 4 + 1, 37 = 2 x 16 + 4 + 1), several
@pytest.mark.parametrize("out_features", [3, 21, 37, 130])
def test_ort_library_linear_node_matches_numpy_at_any_rows(rows, out_features):
    library = _library()
    rng = np.random.default_rng(rows + out_features)
    k = 100  # not a multiple of the vector width: the scalar tail runs too
    w = rng.standard_normal((out_features, k)).astype(np.float32)
    model = _model(
        [helper.make_node("Linear", ["x", "w"], ["y"], domain=DOMAIN)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    x = rng.standard_normal((1, rows, k)).astype(np.float32)
    (y,) = _run(model, {"x": x}, library)
    np.testing.assert_allclose(y, x @ w.T, **TOLERANCE)


def test_ort_library_linear_node_names_a_mismatched_shape():
    library = _library()
    model = _model(
        [helper.make_node("Linear", ["x", "w"], ["y"], domain=DOMAIN)],
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.ones((4, 8), np.float32), "w")],
    )
    with pytest.raises(Exception, match=r"ssmcc\.Linear: x must be \(\.\.\., 8\)"):
        _run(model, {"x": np.ones((1, 7), np.float32)}, library)


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
@pytest.mark.parametrize("with_library", [True, False], ids=["ssmcc-library", "portable-body"])
def test_widen_makes_the_float32_weight_from_the_stored_one(scheme, with_library):
    """ssmcc.Widen (the library's kernel, and its portable body in stock ONNX Runtime) against
    the op library's dequantisation, for every storage it takes."""
    from ssmcc.lowering.onnx.quantized import WIDEN_SCHEMA, widen_function
    from ssmcc.lowering.onnx.schemas import register_schemas
    from ssmcc.ops.quantized_linear import dequantize_weight, quantize_weight

    library = _library() if with_library else None
    register_schemas((WIDEN_SCHEMA,))
    stored, scale = quantize_weight(torch.randn(37, 96) * 3, scheme)
    bits = stored.view(torch.int16) if stored.dtype == torch.bfloat16 else stored
    weight = numpy_helper.from_array(bits.numpy(), "weight")
    if stored.dtype == torch.bfloat16:
        weight.data_type = TensorProto.BFLOAT16
    model = _model(
        [helper.make_node("Widen", ["weight", "scale"], ["dense"], domain=DOMAIN)],
        [helper.make_tensor_value_info("scale", TensorProto.FLOAT, list(scale.shape))],
        [helper.make_tensor_value_info("dense", TensorProto.FLOAT, [37, 96])],
        [weight],
    )
    model.functions.append(widen_function(18))
    onnx.checker.check_model(model, full_check=True)
    (dense,) = _run(model, {"scale": scale.numpy()}, library)
    torch.testing.assert_close(torch.from_numpy(dense), dequantize_weight(stored, scale))


def test_compile_stores_each_weight_once_as_the_model_holds_it(tmp_path):
    """Export keeps the weights' transposes, so every tensor in weights.bin is one of the model's
    own, byte for byte (no transposed copy, the tied head and embedding once), and the file holds
    nothing else."""
    torch.manual_seed(0)
    model = make_hf_model("mamba")
    own = {t.detach().numpy().tobytes() for t in model.state_dict().values()}
    for form in ("keep", "inline"):
        ssmcc.compile(model, target="onnx", onnx_functions=form).save(tmp_path / form)
        stored = {}
        for graph in ("prefill", "chunk", "step"):
            for offset, length, _, _ in _stored_keys(tmp_path / form / f"{graph}.onnx"):
                stored[offset] = length
        data = (tmp_path / form / "weights.bin").read_bytes()
        chunks = {data[offset : offset + length] for offset, length in stored.items()}
        derived = {c for c in chunks if c not in own}
        # what is not a parameter is small and derived in the export (e.g. -exp(A_log) folded)
        assert all(len(c) < 16 * 1024 for c in derived), (form, [len(c) for c in derived])
        big = {t for t in own if len(t) >= 16 * 1024}
        assert big <= chunks, form  # every large weight stored as the model stores it
        assert len(data) <= sum(stored.values()) + 64 * len(stored), form  # nothing else


@pytest.mark.parametrize("quantize", ["none", "bf16"])
def test_compiled_graphs_share_one_map_of_the_weights(tmp_path, quantize):
    """Every float32 product of the keep artifact reads its weight in place; the prefill, chunk
    and step sessions of a loaded artifact get the same OrtValues (one per stored tensor) and its
    outputs equal those of the inline artifact, whose sessions load their own copies."""
    torch.manual_seed(0)
    model = make_hf_model("mamba")
    ids = torch.randint(0, model.config.vocab_size, (2, 13))
    compiled = {}
    for form in ("keep", "inline"):
        artifact = ssmcc.compile(model, target="onnx", quantize=quantize, onnx_functions=form)
        artifact.save(tmp_path / form)
        compiled[form] = ssmcc.load(tmp_path / form)
    keep = compiled["keep"]
    for graph, entry in keep.manifest["graphs"].items():
        assert entry["weights_in_place"], graph
        proto = onnx.load(tmp_path / "keep" / entry["file"], load_external_data=False)
        inits = {t.name for t in proto.graph.initializer}
        plain = [n.name for n in proto.graph.node if n.op_type == "MatMul" and n.input[1] in inits]
        assert not plain, (graph, plain)
    assert not any(e["weights_in_place"] for e in compiled["inline"].manifest["graphs"].values())
    if quantize == "bf16":  # 16-bit prefill products widen their weights on every call
        proto = onnx.load(tmp_path / "keep" / "prefill.onnx", load_external_data=False)
        inits = {t.name for t in proto.graph.initializer}
        assert "Widen" in [n.op_type for n in proto.graph.node]
        folded = [
            n.name
            for n in proto.graph.node
            if n.op_type in ("Cast", "Transpose") and n.input[0] in inits
        ]
        assert not folded  # nothing ONNX Runtime would fold into a float32 copy per session

    want = compiled["inline"].generate(ids, 6)
    torch.testing.assert_close(keep.generate(ids, 6), want)
    logits, _ = keep.prefill(ids)
    torch.testing.assert_close(logits, compiled["inline"].prefill(ids)[0], rtol=1e-5, atol=1e-5)
    executable = keep.executable
    sessions = [executable.session(g) for g in ("prefill", "chunk", "step")]
    shared = sessions[0].ssmcc_shared_weights
    assert isinstance(shared, SharedWeights)
    assert all(s.ssmcc_shared_weights is shared for s in sessions)
    assert shared.name == "weights.bin"
    on_disk = np.fromfile(tmp_path / "keep" / "weights.bin", dtype=np.uint8)
    assert np.array_equal(shared.data, on_disk) and not shared.data.flags.writeable
    stored = {
        key
        for g in ("prefill", "chunk", "step")
        for key in _stored_keys(tmp_path / "keep" / f"{g}.onnx")
    }
    assert len(shared._values) == len(stored)


def _stored_keys(path):
    proto = onnx.load(path, load_external_data=False)
    for tensor in proto.graph.initializer:
        if tensor.data_location == TensorProto.EXTERNAL:
            info = {e.key: e.value for e in tensor.external_data}
            yield int(info["offset"]), int(info["length"]), tensor.data_type, tuple(tensor.dims)
