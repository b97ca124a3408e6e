"""ONNX emitters for the ops of hybrid models' non-SSM layers, in standard ONNX ops:
``ssmcc.attention``, ``ssmcc.positions`` and ``ssmcc.moe_experts``.

None needs a custom node: attention is matrix products and a softmax that every runtime has
kernels for, positions a ``Range``, the experts matrix products. So a hybrid model's artifact runs
in stock ONNX Runtime (and OpenVINO) with or without the ssmcc library, which makes only its SSM
nodes faster.

Attention (shapes and math in ``ssmcc.ops.attention``), with ``K = Concat(past_key, key)``::

    scores  = MatMul(query as (b, g, h/g*l, d), K^T) * scale        -> (b, h, l, p+l)
    scores  = Where(j <= p + i, scores, -inf)                          causal, past included
    out     = MatMul(Softmax(scores) as (b, g, h/g*l, p+l), V)      -> (b, h, l, e)

in float32, the output cast like the query; the caches ``K``/``V`` are the op's other outputs.

Experts (math in ``ssmcc.ops.moe_experts``) are computed per expert on the tokens that chose it
(``NonZero`` of the router's top-k indices, ``Gather``, two ``MatMul``, ``ScatterND`` add): the
work of the chosen experts only, in standard ops. The expert loop is unrolled (about 15 nodes per
expert per layer). This is the form of programs with many tokens (prefill, chunk); a decode step's
experts are one ``ssmcc.MoeExperts`` node (``moe.py``).
"""

from __future__ import annotations

import onnx
from onnx import helper
from onnxscript import opset18 as op

from ssmcc.lowering.onnx.registration import onnx_emitter

_MINUS_INF = helper.make_tensor("value", onnx.TensorProto.FLOAT, [], [float("-inf")])
_INT_ZERO = helper.make_tensor("value", onnx.TensorProto.INT64, [1], [0])
_FLOAT_ZERO = helper.make_tensor("value", onnx.TensorProto.FLOAT, [1], [0.0])


def _dim(tensor, axis: int):
    return op.Shape(tensor, start=axis, end=axis + 1)


def _scalar(dim):
    return op.Squeeze(dim, [0])


@onnx_emitter("attention", "standard ONNX ops (MatMul, Softmax, causal Where)")
def emit_attention(query, key, value, scale, past_key=None, past_value=None):
    if past_key is None:
        keys, values = op.Identity(key), op.Identity(value)
    else:
        keys = op.Concat(past_key, key, axis=2)
        values = op.Concat(past_value, value, axis=2)
    batch, heads, length = _dim(query, 0), _dim(query, 1), _dim(query, 2)
    kv_heads, total = _dim(key, 1), _dim(keys, 2)
    minus_one = op.Constant(value_ints=[-1])
    grouped = op.Reshape(
        op.Cast(query, to=onnx.TensorProto.FLOAT),
        op.Concat(batch, kv_heads, minus_one, _dim(query, 3), axis=0),
    )
    keys_t = op.Transpose(op.Cast(keys, to=onnx.TensorProto.FLOAT), perm=[0, 1, 3, 2])
    scores = op.Mul(op.MatMul(grouped, keys_t), op.Constant(value_float=float(scale)))
    scores = op.Reshape(scores, op.Concat(batch, heads, length, total, axis=0))
    past = op.Sub(total, length)
    rows = op.Add(op.Unsqueeze(op.Range(0, _scalar(length), 1), [1]), past)  # (l, 1)
    visible = op.LessOrEqual(op.Range(0, _scalar(total), 1), rows)  # (l, p+l)
    scores = op.Where(visible, scores, op.Constant(value=_MINUS_INF))
    weights = op.Reshape(
        op.Softmax(scores, axis=-1), op.Concat(batch, kv_heads, minus_one, total, axis=0)
    )
    out = op.MatMul(weights, op.Cast(values, to=onnx.TensorProto.FLOAT))
    out = op.Reshape(out, op.Concat(batch, heads, length, _dim(value, 3), axis=0))
    return op.CastLike(out, query), keys, values


@onnx_emitter("positions", "standard ONNX ops (Range, Add)")
def emit_positions(input_ids, past_count=None):
    batch, length = _dim(input_ids, 0), _dim(input_ids, 1)
    if past_count is None:
        past_count = op.ConstantOfShape(
            op.Concat(batch, op.Constant(value_ints=[1]), axis=0), value=_INT_ZERO
        )
    offsets = op.Unsqueeze(op.Range(0, _scalar(length), 1), [0])  # (1, l)
    return op.Add(past_count, offsets), op.Add(past_count, length)


def _activate(x, activation: str):
    if activation == "silu":
        return op.Mul(x, op.Sigmoid(x))
    if activation == "gelu":
        return op.Mul(op.Mul(x, 0.5), op.Add(op.Erf(op.Mul(x, 0.7071067811865476)), 1.0))
    if activation == "gelu_tanh":
        cube = op.Mul(op.Mul(x, x), x)
        inner = op.Mul(op.Add(x, op.Mul(cube, 0.044715)), 0.7978845608028654)
        return op.Mul(op.Mul(x, 0.5), op.Add(op.Tanh(inner), 1.0))
    if activation == "relu":
        return op.Relu(x)
    return op.Mul(op.Relu(x), op.Relu(x))  # relu2


def _expert_ffn(x, up_e, down_e, width: int, activation: str, gated: bool):
    """One expert on the rows ``x`` (n, d): up (u, d), down (d, i) -> (n, d)."""
    projected = op.MatMul(x, op.Transpose(up_e, perm=[1, 0]))
    if gated:
        gate = op.Slice(
            projected, op.Constant(value_ints=[0]), op.Constant(value_ints=[width]), [1]
        )
        value = op.Slice(
            projected, op.Constant(value_ints=[width]), op.Constant(value_ints=[2 * width]), [1]
        )
        active = op.Mul(_activate(gate, activation), value)
    else:
        active = _activate(projected, activation)
    return op.MatMul(active, op.Transpose(down_e, perm=[1, 0]))


def _experts_float(weights, scale):
    """(E, rows, cols) expert weights as float: int8 through DequantizeLinear (per group of
    cols / G, as ``ssmcc.quantized_linear``; the weights stay int8 initializers), 16-bit floats
    through Cast and Mul, float ones through Cast."""
    if scale is None:
        return op.Cast(weights, to=onnx.TensorProto.FLOAT)
    experts, rows, cols = (int(d) for d in weights.shape)
    groups = int(scale.shape[2])
    if "INT8" in str(weights.dtype).upper():
        flat = op.Reshape(weights, op.Constant(value_ints=[experts * rows * groups, -1]))
        widened = op.DequantizeLinear(flat, op.Reshape(scale, op.Constant(value_ints=[-1])), axis=0)
    else:
        grouped = op.Reshape(
            op.Cast(weights, to=onnx.TensorProto.FLOAT),
            op.Constant(value_ints=[experts, rows, groups, -1]),
        )
        widened = op.Mul(grouped, op.Unsqueeze(scale, [3]))
    return op.Reshape(widened, op.Constant(value_ints=[experts, rows, cols]))


@onnx_emitter(
    "moe_experts",
    "ssmcc.MoeExperts / QuantizedMoeExperts node where the tokens are few (decode) + portable "
    "body; standard ONNX ops elsewhere (per expert: NonZero, Gather, MatMul, ScatterND add)",
)
def emit_moe_experts(
    hidden,
    top_k_index,
    top_k_weights,
    up,
    down,
    activation="silu",
    gated=True,
    up_scale=None,
    down_scale=None,
):
    """Per expert (unrolled: the expert count is the weights' static dim 0): the (token, slot)
    pairs that chose it (NonZero), those tokens' rows, the expert's two products, the router
    weight, and a ScatterND add into the output. Every token chooses an expert at most once, so
    one expert's scatter never adds twice to a row."""
    x = op.Cast(hidden, to=onnx.TensorProto.FLOAT)
    index = op.Cast(top_k_index, to=onnx.TensorProto.INT64)
    weights = op.Cast(top_k_weights, to=onnx.TensorProto.FLOAT)
    up_f, down_f = _experts_float(up, up_scale), _experts_float(down, down_scale)
    out = op.ConstantOfShape(op.Shape(x), value=_FLOAT_ZERO)
    for expert in range(int(up.shape[0])):
        which = op.Constant(value_int=expert)
        chosen = op.NonZero(op.Equal(index, which))  # (2, n): token, slot
        tokens = op.Gather(chosen, op.Constant(value_int=0), axis=0)  # (n,)
        weight = op.GatherND(weights, op.Transpose(chosen, perm=[1, 0]))  # (n,)
        rows = _expert_ffn(
            op.Gather(x, tokens, axis=0),
            op.Gather(up_f, which, axis=0),
            op.Gather(down_f, which, axis=0),
            int(down.shape[2]),
            activation,
            gated,
        )
        out = op.ScatterND(
            out, op.Unsqueeze(tokens, [1]), op.Mul(rows, op.Unsqueeze(weight, [1])), reduction="add"
        )
    return op.CastLike(out, hidden)
