"""The activations of ``ssmcc.ops.activations`` as standard ONNX ops, for the portable bodies.

Each form is written with the ops any ONNX runtime has (no ``Gelu``, which is opset 20)::

    silu       x * Sigmoid(x)
    gelu       (0.5 x) * (1 + Erf(x * (1 / sqrt(2))))
    gelu_tanh  (0.5 x) * (1 + Tanh(sqrt(2/pi) * (x + 0.044715 * x * x * x)))
    relu       Relu(x)
    relu2      Relu(x) * Relu(x)

The constants are float32 scalars brought to x's type with ``CastLike`` (the conv bodies take
float16 and bfloat16 too). ``select_activation`` picks the form a node's int attribute names at
run time: a chain of ``If`` on ``attribute == code``, so only the named form is computed.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ssmcc.ops.activations import FORMS, GELU_TANH_CUBIC, GELU_TANH_SCALE

INV_SQRT2 = 0.7071067811865476


def activation_value(body, form: str, x: str) -> str:
    """Append ``form`` (one of ``FORMS``) applied to ``x`` to ``body`` (anything with ``op``, as
    ``functions._Body``); the result's name."""

    def scalar(value: float) -> str:
        return body.op("CastLike", body.op("Constant", value_float=value), x)

    if form == "identity":
        return body.op("Identity", x)
    if form == "silu":
        return body.op("Mul", x, body.op("Sigmoid", x))
    if form in ("relu", "relu2"):
        relu = body.op("Relu", x)
        return relu if form == "relu" else body.op("Mul", relu, relu)
    half_x = body.op("Mul", x, scalar(0.5))
    if form == "gelu":
        inner = body.op("Erf", body.op("Mul", x, scalar(INV_SQRT2)))
    elif form == "gelu_tanh":
        cube = body.op("Mul", body.op("Mul", x, x), x)
        polynomial = body.op("Add", x, body.op("Mul", cube, scalar(GELU_TANH_CUBIC)))
        inner = body.op("Tanh", body.op("Mul", polynomial, scalar(GELU_TANH_SCALE)))
    else:
        raise ValueError(f"no ONNX form for activation {form!r}; forms: {FORMS}")
    return body.op("Mul", half_x, body.op("Add", inner, scalar(1.0)))


def attribute_int(body, attribute: str) -> str:
    """An int64 scalar holding the function's int attribute ``attribute`` (``ref_attr_name``)."""
    name = f"{body.prefix}_code_{attribute}"
    node = helper.make_node("Constant", [], [name])
    node.attribute.append(
        onnx.AttributeProto(name="value_int", type=onnx.AttributeProto.INT, ref_attr_name=attribute)
    )
    body.nodes.append(node)
    return name


def select_activation(body, attribute: str, value: str, output: str) -> None:
    """``output = FORMS[attribute](value)``: ``If`` code == 1 (silu) then that, else ``If`` code
    == 2 ... down to identity (codes outside ``FORMS``, which no emitter writes, included)."""
    code = attribute_int(body, attribute)
    subgraph = type(body)  # a fresh body of the same kind per branch (its own node names)
    rest = subgraph(f"{output}_identity")
    rest_value = activation_value(rest, "identity", value)
    for index in range(len(FORMS) - 1, 0, -1):
        form = FORMS[index]
        branch = subgraph(f"{output}_{form}")
        branch_value = activation_value(branch, form, value)
        level = subgraph(f"{output}_at_{form}")
        wanted = level.op(
            "Equal",
            code,
            level.op("Constant", value=helper.make_tensor("value", TensorProto.INT64, [], [index])),
        )
        chosen = output if index == 1 else f"{output}_from_{form}"
        level.nodes.append(
            helper.make_node(
                "If",
                [wanted],
                [chosen],
                then_branch=_graph(branch, branch_value, f"{output}_{form}_then"),
                else_branch=_graph(rest, rest_value, f"{output}_{form}_else"),
            )
        )
        rest, rest_value = level, chosen
    body.nodes.extend(rest.nodes)


def _graph(body, value: str, name: str) -> onnx.GraphProto:
    return helper.make_graph(
        body.nodes, name, [], [helper.make_value_info(value, onnx.TypeProto())]
    )
