"""ONNX form of a MoE layer's experts where the tokens are few (math: ``ssmcc.ops.moe_experts``).

A decode step gives the experts one token per sequence. The standard-op form
(``emitters_standard.emit_moe_experts``: per expert NonZero, Gather, two MatMul, ScatterND add) is
about 15 nodes per expert per layer, most of them running on zero or one row (1,440 of the 1,798
nodes of a 12-layer, 8-expert step graph). Where the tokens are few the emitter writes one
``ssmcc`` node per layer instead::

    MoeExperts(hidden[t, d], top_k_index[t, k] int64, top_k_weights[t, k], up[E, u, d],
               down[E, d, i]; activation, gated) -> out[t, d]
    QuantizedMoeExperts(hidden, top_k_index, top_k_weights, up[E, u, d] stored small,
               up_scale[E, u, G], down[E, d, i] stored small, down_scale[E, d, G'];
               activation, gated) -> out[t, d]

(u = 2i when gated; ``activation`` indexes ``ACTIVATIONS``). The ssmcc ORT library runs them as
matrix-vector products over the chosen experts only (``kernels/cpu/moe_experts.h``). Their
portable body gathers the chosen experts' matrices, which costs a copy of them per call but
needs no loop and no data-dependent shapes::

    valid = 0 <= index < E;  index = Where(valid, index, 0);  w = Where(valid, weights, 0)
    h     = MatMul(Gather(up, index), x[:, None, :, None])              (t, k, u)
    a     = act(h[..., :i]) * (h[..., i:] if gated else 1)              (t, k, i)
    out   = ReduceSum(MatMul(Gather(down, index), a[..., None]) * w[..., None], axis k)

``QuantizedMoeExperts``'s body is ``MoeExperts`` on the experts widened by ``ssmcc.Widen`` (all of
them; the library's kernel reads the chosen ones in their small form).

Where the tokens are many (prefill, chunk) the standard-op form stays: each expert's rows go
through ONNX Runtime's GEMM, which beats a matrix-vector product there.
"""

from __future__ import annotations

import onnx
import onnxscript
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from ssmcc.kernels.cpu.linear_binding import SMALL_KERNEL_MAX_ROWS
from ssmcc.lowering.onnx.activations import activation_value, attribute_int
from ssmcc.lowering.onnx.functions import _Body, _dim
from ssmcc.lowering.onnx.functions_ssd import _int_attr_1d
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION
from ssmcc.ops.moe_experts import ACTIVATIONS

SSMCC = onnxscript.values.Opset(DOMAIN, VERSION)
_ATTRIBUTES = ["activation", "gated"]
_INPUTS = ["hidden", "top_k_index", "top_k_weights", "up", "down"]
_QUANTIZED_INPUTS = ["hidden", "top_k_index", "top_k_weights", "up", "up_scale", "down"]
_QUANTIZED_INPUTS += ["down_scale"]


def _schema(name: str, quantized: bool) -> OpSchema:
    formal = OpSchema.FormalParameter
    weight = "W" if quantized else "tensor(float)"
    inputs = [
        formal("hidden", "tensor(float)", "(tokens, hidden)"),
        formal("top_k_index", "tensor(int64)", "(tokens, k): the router's experts"),
        formal("top_k_weights", "tensor(float)", "(tokens, k): the router's weights"),
        formal("up", weight, "(experts, u, hidden); u = 2 width when gated ([gate; up])"),
    ]
    if quantized:
        inputs.append(formal("up_scale", "tensor(float)", "(experts, u, G)"))
    inputs.append(formal("down", weight, "(experts, hidden, width)"))
    if quantized:
        inputs.append(formal("down_scale", "tensor(float)", "(experts, hidden, G')"))
    return OpSchema(
        name,
        DOMAIN,
        VERSION,
        doc="The chosen experts of a MoE layer, weighted and summed per token "
        "(ssmcc.ops.moe_experts).",
        inputs=inputs,
        outputs=[formal("out", "tensor(float)", "(tokens, hidden)")],
        type_constraints=[("W", ["tensor(int8)", "tensor(bfloat16)", "tensor(float16)"], "")]
        if quantized
        else [],
        attributes=[
            OpSchema.Attribute(
                "activation", OpSchema.AttrType.INT, "index into " + ", ".join(ACTIVATIONS)
            ),
            OpSchema.Attribute("gated", OpSchema.AttrType.INT, "1: up holds [gate; up] rows"),
        ],
    )


SCHEMAS = [_schema("MoeExperts", False), _schema("QuantizedMoeExperts", True)]


def few_tokens(tokens, batch) -> bool:
    """Whether a MoE layer's token count (dim 0 of its hidden rows, an int or a symbolic size) is
    known to be few: a static size of at most ``SMALL_KERNEL_MAX_ROWS``, or the program's batch size
    itself (one token per sequence: a decode step)."""
    if isinstance(tokens, int):
        return tokens <= SMALL_KERNEL_MAX_ROWS
    return batch is not None and str(tokens) == str(batch)


def emit_moe_experts_node(
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
    """One ``MoeExperts`` (float32 experts) or ``QuantizedMoeExperts`` node."""
    from onnxscript import opset18 as op

    x = op.Cast(hidden, to=TensorProto.FLOAT)
    index = op.Cast(top_k_index, to=TensorProto.INT64)
    weights = op.Cast(top_k_weights, to=TensorProto.FLOAT)
    attributes = dict(activation=ACTIVATIONS.index(activation), gated=int(bool(gated)))
    if up_scale is None and down_scale is None:
        out = SSMCC.MoeExperts(x, index, weights, up, down, **attributes)
    else:
        out = SSMCC.QuantizedMoeExperts(
            x, index, weights, up, up_scale, down, down_scale, **attributes
        )
    return op.CastLike(out, hidden)


def _activation(body: _Body, g: str) -> str:
    """``ACTIVATIONS[activation](g)``: every form computed (``activations.py``), the attribute's
    one selected."""
    code = attribute_int(body, "activation")
    forms = {form: activation_value(body, form, g) for form in ACTIVATIONS}
    chosen = forms[ACTIVATIONS[-1]]
    for index in range(len(ACTIVATIONS) - 2, -1, -1):
        which = body.op(
            "Equal",
            code,
            body.op("Constant", value=helper.make_tensor("value", TensorProto.INT64, [], [index])),
        )
        chosen = body.op("Where", which, forms[ACTIVATIONS[index]], chosen)
    return chosen


def moe_experts_function(opset: int) -> onnx.FunctionProto:
    """``MoeExperts``'s portable body (module docstring)."""
    body = _Body("moe")
    experts = body.op("Squeeze", _dim(body, "up", 0), body.const([0]))
    zero = body.op("Constant", value=helper.make_tensor("value", TensorProto.INT64, [], [0]))
    valid = body.op(
        "And",
        body.op("GreaterOrEqual", "top_k_index", zero),
        body.op("Less", "top_k_index", experts),
    )
    index = body.op("Where", valid, "top_k_index", zero)
    weights = body.op("Where", valid, "top_k_weights", body.op("Constant", value_float=0.0))
    x = body.op("Unsqueeze", "hidden", body.const([1, 3]))  # (t, 1, d, 1)
    last = body.const([3])
    h = body.op("Squeeze", body.op("MatMul", body.op("Gather", "up", index, axis=0), x), last)
    width = _dim(body, "down", 2)
    gated = _int_attr_1d(body, "gated")  # (1,)
    axis = body.const([2])
    gate = body.op("Slice", h, body.const([0]), width, axis)
    start = body.op("Mul", gated, width)  # gated: the up rows follow the gate rows
    value = body.op("Slice", h, start, body.op("Add", start, width), axis)
    factor = body.op(
        "Where",
        body.op("Cast", body.op("Squeeze", gated, body.const([0])), to=TensorProto.BOOL),
        value,
        body.op("Constant", value_float=1.0),
    )
    active = body.op("Mul", _activation(body, gate), factor)  # (t, k, i)
    y = body.op(
        "Squeeze",
        body.op(
            "MatMul", body.op("Gather", "down", index, axis=0), body.op("Unsqueeze", active, last)
        ),
        last,
    )  # (t, k, d)
    weighted = body.op("Mul", y, body.op("Unsqueeze", weights, body.const([2])))
    body.op("ReduceSum", weighted, body.const([1]), keepdims=0)
    body.nodes[-1].output[0] = "out"
    return helper.make_function(
        DOMAIN,
        "MoeExperts",
        _INPUTS,
        ["out"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=_ATTRIBUTES,
    )


def _widened(body: _Body, weight: str, scale: str) -> str:
    """An (E, rows, cols) stored weight as float32: ``ssmcc.Widen`` of its (E rows, cols) form."""
    minus_one = body.const([-1])
    flat = body.op("Reshape", weight, body.op("Concat", minus_one, _dim(body, weight, 2), axis=0))
    scales = body.op("Reshape", scale, body.op("Concat", minus_one, _dim(body, scale, 2), axis=0))
    dense = body.op("Widen", flat, scales)
    body.nodes[-1].domain = DOMAIN
    return body.op("Reshape", dense, body.op("Shape", weight))


def quantized_moe_experts_function(opset: int) -> onnx.FunctionProto:
    """``QuantizedMoeExperts``'s portable body: ``MoeExperts`` on the widened experts."""
    body = _Body("qmoe")
    up, down = _widened(body, "up", "up_scale"), _widened(body, "down", "down_scale")
    node = helper.make_node(
        "MoeExperts", ["hidden", "top_k_index", "top_k_weights", up, down], ["out"], domain=DOMAIN
    )
    for name in _ATTRIBUTES:
        node.attribute.append(
            onnx.AttributeProto(name=name, type=onnx.AttributeProto.INT, ref_attr_name=name)
        )
    body.nodes.append(node)
    return helper.make_function(
        DOMAIN,
        "QuantizedMoeExperts",
        _QUANTIZED_INPUTS,
        ["out"],
        body.nodes,
        [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, VERSION)],
        attributes=_ATTRIBUTES,
    )
