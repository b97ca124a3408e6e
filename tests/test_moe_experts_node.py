"""``ssmcc.MoeExperts`` / ``QuantizedMoeExperts``: a MoE layer's experts for few tokens as one ONNX
node (lowering/onnx/moe.py), run by the ssmcc ORT library's kernel (kernels/cpu/moe_experts.h) and
by its portable body in stock ONNX Runtime and OpenVINO, against a float64 per-token loop of the
op's math; and the emitter choosing it for decode steps only."""

from __future__ import annotations

import collections
import os

import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ssmcc
from ssmcc.lowering.onnx.moe import (
    SCHEMAS,
    few_tokens,
    moe_experts_function,
    quantized_moe_experts_function,
)
from ssmcc.lowering.onnx.quantized import WIDEN_SCHEMA, widen_function
from ssmcc.lowering.onnx.runtime import custom_op_library
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION, register_schemas
from ssmcc.ops.moe_experts import ACTIVATIONS, activate, moe_experts_ref
from ssmcc.ops.quantized_linear import dequantize_weight, quantize_weight
from tests.test_ops_hybrid import _moe_inputs as _inputs

OPSET = 20
TOLERANCE = dict(rtol=1e-5, atol=2e-5)  # float32 sums in another order than float64's


def _library():
    library = custom_op_library("auto")
    if library is None:
        pytest.skip("the ssmcc ORT library does not build here")
    return library


def _oracle(hidden, index, weights, up, down, activation, gated):
    """float64, token by token; indices outside the experts add nothing."""
    out = torch.zeros(hidden.shape, dtype=torch.float64)
    for t in range(hidden.shape[0]):
        for e, w in zip(index[t].tolist(), weights[t].double(), strict=True):
            if not 0 <= e < up.shape[0]:
                continue
            projected = up[e].double() @ hidden[t].double()
            if gated:
                gate, value = projected.chunk(2)
                active = activate(gate, activation) * value
            else:
                active = activate(projected, activation)
            out[t] += w * (down[e].double() @ active)
    return out


def stored(experts: torch.Tensor, scheme: str):
    """(E, rows, cols) experts quantised per expert: (stored, scale, the dequantised float32)."""
    pairs = [quantize_weight(w, scheme) for w in experts]
    weight, scale = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
    dense = torch.stack([dequantize_weight(w, s) for w, s in zip(weight, scale, strict=True)])
    return weight, scale, dense


def _initializer(stored: torch.Tensor, name: str) -> onnx.TensorProto:
    if stored.dtype == torch.bfloat16:  # numpy has no bfloat16: its bits, retyped
        tensor = numpy_helper.from_array(stored.view(torch.int16).numpy(), name)
        tensor.data_type = TensorProto.BFLOAT16
        return tensor
    return numpy_helper.from_array(stored.numpy(), name)


def _model(activation, gated, up, down, up_scale=None, down_scale=None) -> onnx.ModelProto:
    """One node reading the experts as initializers; hidden, index and weights are inputs."""
    register_schemas((*SCHEMAS, WIDEN_SCHEMA))
    quantized = up_scale is not None
    names = ["hidden", "top_k_index", "top_k_weights", "up"]
    names += ["up_scale", "down", "down_scale"] if quantized else ["down"]
    initializers = [_initializer(up, "up"), _initializer(down, "down")]
    if quantized:
        initializers += [_initializer(up_scale, "up_scale"), _initializer(down_scale, "down_scale")]
    node = helper.make_node(
        "QuantizedMoeExperts" if quantized else "MoeExperts",
        names,
        ["out"],
        domain=DOMAIN,
        activation=ACTIVATIONS.index(activation),
        gated=int(gated),
    )
    graph = helper.make_graph(
        [node],
        "experts",
        [
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["t", up.shape[2]]),
            helper.make_tensor_value_info("top_k_index", TensorProto.INT64, ["t", "k"]),
            helper.make_tensor_value_info("top_k_weights", TensorProto.FLOAT, ["t", "k"]),
        ],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["t", up.shape[2]])],
        initializers,
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, VERSION)],
    )
    # callees before their callers, as lower_to_onnx lists them (onnx.reference needs it)
    functions = [moe_experts_function]
    if quantized:
        functions = [widen_function, moe_experts_function, quantized_moe_experts_function]
    model.functions.extend(make(OPSET) for make in functions)
    onnx.checker.check_model(model, full_check=True)
    return model


def _run(model, hidden, index, weights, library):
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    if library:
        options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options)
    feed = {
        "hidden": hidden.numpy(),
        "top_k_index": index.numpy(),
        "top_k_weights": weights.numpy(),
    }
    return torch.from_numpy(session.run(None, feed)[0])


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("with_library", [True, False], ids=["ssmcc-library", "portable-body"])
def test_float_experts_match_the_per_token_loop(activation, gated, with_library):
    """Odd sizes (hidden 37, width 19: partial GEMV blocks and vector tails), 5 tokens choosing
    3 of 6 experts each (some experts unchosen, several tokens per expert)."""
    library = _library() if with_library else None
    hidden, index, weights, up, down = _inputs(5, 6, 3, 37, 19, gated, seed=len(activation))
    model = _model(activation, gated, up, down)
    out = _run(model, hidden, index, weights, library)
    expected = _oracle(hidden, index, weights, up, down, activation, gated)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    reference = moe_experts_ref(hidden, index, weights, up, down, activation, gated)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("tokens,k", [(1, 1), (1, 2), (3, 2), (8, 4), (40, 2)])
def test_any_token_count_and_top_k(tokens, k):
    """The node is emitted for few tokens; any count is computed right (widths above one task's
    block of rows: 2 x 70 up rows, 200 down rows)."""
    library = _library()
    hidden, index, weights, up, down = _inputs(tokens, 8, k, 200, 70, True, seed=tokens)
    model = _model("silu", True, up, down)
    for lib in (library, None):
        out = _run(model, hidden, index, weights, lib)
        expected = _oracle(hidden, index, weights, up, down, "silu", True)
        torch.testing.assert_close(out.double(), expected, **TOLERANCE)


@pytest.mark.parametrize("with_library", [True, False], ids=["ssmcc-library", "portable-body"])
def test_indices_outside_the_experts_add_nothing(with_library):
    """Expert parallelism's sentinel (an index < 0 or >= E) contributes zero, as in the op."""
    library = _library() if with_library else None
    hidden, index, weights, up, down = _inputs(4, 5, 2, 16, 8, True, seed=3)
    index[0, 1], index[2, 0], index[3] = -1, 5, torch.tensor([7, -3])
    out = _run(_model("gelu", True, up, down), hidden, index, weights, library)
    expected = _oracle(hidden, index, weights, up, down, "gelu", True)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    assert out[3].abs().max() == 0


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
@pytest.mark.parametrize("with_library", [True, False], ids=["ssmcc-library", "portable-body"])
def test_stored_experts_match_the_loop_on_the_dequantised_weights(scheme, with_library):
    library = _library() if with_library else None
    hidden, index, weights, up, down = _inputs(3, 4, 2, 64, 32, True, seed=7)
    (up_q, up_s, dense_up), (down_q, down_s, dense_down) = stored(up, scheme), stored(down, scheme)
    model = _model("silu", True, up_q, down_q, up_s, down_s)
    out = _run(model, hidden, index, weights, library)
    expected = _oracle(hidden, index, weights, dense_up, dense_down, "silu", True)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    reference = moe_experts_ref(hidden, index, weights, up_q, down_q, "silu", True, up_s, down_s)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_a_mismatched_shape_is_named():
    library = _library()
    hidden, index, weights, up, down = _inputs(2, 3, 2, 8, 6, True, seed=0)
    model = _model("silu", True, up, down)
    with pytest.raises(Exception, match=r"ssmcc\.MoeExperts: top_k_weights must have shape"):
        _run(model, hidden, index, weights[:, :1], library)
    bad = _model("silu", True, up[:, :10], down)  # 10 rows: neither 2 x 6 nor 6
    with pytest.raises(Exception, match=r"ssmcc\.MoeExperts: up must have shape"):
        _run(bad, hidden, index, weights, library)


def test_few_tokens_means_static_and_small_or_one_per_sequence():
    assert few_tokens(1, "s0") and few_tokens(8, None)
    assert not few_tokens(9, "s0")
    assert few_tokens("s0", "s0")  # a decode step: one token per row of the batch
    assert not few_tokens("s0*s1", "s0") and not few_tokens("s1", "s0")


@pytest.mark.slow
def test_hybrid_step_graph_runs_the_experts_as_one_node_per_layer(tmp_path):
    """granite-hybrid-tiny: every MoE layer of the step graph is one MoeExperts node (no
    per-expert blocks), prefill and chunk keep the standard form; the step graph's logits equal
    the torch target's with the library and with the portable body."""
    from ssmcc.presets import build_preset

    model = build_preset("granite-hybrid-tiny").eval()
    layers = model.config.num_hidden_layers
    compiled = ssmcc.compile(model, target="onnx")
    folder = str(tmp_path / "artifact")
    compiled.save(folder)
    ops = {}
    for graph in ("prefill", "chunk", "step"):
        proto = onnx.load(os.path.join(folder, f"{graph}.onnx"), load_external_data=False)
        ops[graph] = collections.Counter(n.op_type for n in proto.graph.node)
    assert ops["step"]["MoeExperts"] == layers and ops["step"]["NonZero"] == 0
    for graph in ("prefill", "chunk"):
        assert ops[graph]["MoeExperts"] == 0 and ops[graph]["NonZero"] > 0
    reference = ssmcc.compile(model, target="torch")
    ids = torch.randint(
        0, model.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(0)
    )
    expected, state = reference.prefill(ids[:, :6])
    for kernels in ("auto", "reference"):
        loaded = ssmcc.load(folder, kernels=kernels)
        _, got_state = loaded.prefill(ids[:, :6])
        want_state = state
        for i in range(6, 11):
            got, got_state = loaded.step(ids[:, i], got_state)
            want, want_state = reference.step(ids[:, i], want_state)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
