"""Portable bodies of the Mamba-2 ssmcc ONNX ops: model-local functions of standard ONNX ops.

``SsdScan`` (math in ``ssmcc.ops.ssd_scan``; h heads in g groups of h/g, p head dim, n state)::

    dt  = Clip(softplus?(dt + dt_bias), dt_min, dt_max)                          (b, l, h)
    per position, with the state grouped as (b, g, h/g, p, n) so B_t and C_t broadcast over the
    heads of their group:    (an ONNX Scan over axis 0 of position-major (l, b, ...) inputs)
        h_t = Exp(dt_t A) * h_{t-1} + (dt_t x_t) * B_t
        y_t = h_t @ C_t                                                           (sum over n)
    out = (y + D * x) * silu(z) if has_z

``SsdStateUpdate``: the same step once, from ``state``. ``RmsNormGated``: the gate before
(``norm_before_gate = 0``) or after the group-wise RMS normalisation, times ``weight``.

The scan body runs one Scan iteration per position; a chunked body (SSD's block decomposition,
matmuls inside each chunk) would run faster in stock runtimes and is left for later.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ssmcc.lowering.onnx.functions import _Body, _dim, scan_value
from ssmcc.lowering.onnx.schemas import DOMAIN

_DT_ATTRIBUTES = ["dt_softplus", "has_z", "dt_min", "dt_max"]


def _float_attr(body: _Body, attribute: str) -> str:
    """A float scalar from a float attribute of the function (``ref_attr_name``)."""
    name = f"{body.prefix}_attr_{attribute}"
    node = helper.make_node("Constant", [], [name])
    node.attribute.append(
        onnx.AttributeProto(
            name="value_float", type=onnx.AttributeProto.FLOAT, ref_attr_name=attribute
        )
    )
    body.nodes.append(node)
    return name


def _int_attr_1d(body: _Body, attribute: str) -> str:
    """A 1-element int64 tensor from an int attribute of the function."""
    name = f"{body.prefix}_attr_{attribute}"
    node = helper.make_node("Constant", [], [name])
    node.attribute.append(
        onnx.AttributeProto(name="value_int", type=onnx.AttributeProto.INT, ref_attr_name=attribute)
    )
    body.nodes.append(node)
    return body.op("Unsqueeze", name, body.const([0]))


def _step_size(body: _Body, dt: str, dt_bias: str) -> str:
    """``Clip(softplus?(dt + dt_bias), dt_min, dt_max)``."""
    body.softplus_if("dt_softplus", body.op("Add", dt, dt_bias), "dt_soft")
    return body.op("Clip", "dt_soft", _float_attr(body, "dt_min"), _float_attr(body, "dt_max"))


def _epilogue(body: _Body, y: str, x: str) -> None:
    """``out = CastLike((y + D x) * silu(z) if has_z, x)``; D is (h, p)."""
    body.gate_if("has_z", body.op("Add", y, body.op("Mul", "D", x)), "z", "y_gated")
    body.nodes.append(helper.make_node("CastLike", ["y_gated", x], ["out"]))


def ssd_scan_function(opset: int) -> onnx.FunctionProto:
    body = _Body("sd")
    b, length, h, p = (_dim(body, "x", axis) for axis in range(4))
    g, n = _dim(body, "B", 2), _dim(body, "B", 3)
    # the scanned values position-major, (l, b, ...): Scan runs along axis 0, the one axis
    # onnx.reference runs (ONNX Runtime's Scan transposes any other axis to 0 itself)
    by_position = lambda t: body.op("Transpose", t, perm=[1, 0, 2, 3])  # noqa: E731
    step = _step_size(body, body.op("Transpose", "dt", perm=[1, 0, 2]), "dt_bias")  # (l, b, h)
    per_group, one = body.op("Div", h, g), body.const([1])
    shape = lambda *dims: body.op("Concat", *dims, axis=0)  # noqa: E731
    decay = body.op(
        "Reshape",
        body.op("Exp", body.op("Mul", step, "A")),
        shape(length, b, g, per_group, one, one),
    )
    drive = body.op("Mul", body.op("Unsqueeze", step, body.const([3])), by_position("x"))
    drive = body.op("Reshape", drive, shape(length, b, g, per_group, p, one))
    B6 = body.op("Reshape", by_position("B"), shape(length, b, g, one, one, n))
    C6 = body.op("Reshape", by_position("C"), shape(length, b, g, one, n, one))
    h0 = body.op("Reshape", "initial_state", shape(b, g, per_group, p, n))
    step_nodes = [
        helper.make_node("Mul", ["decay_s", "h_prev"], ["carried"]),
        helper.make_node("Mul", ["drive_s", "B_s"], ["fed"]),
        helper.make_node("Add", ["carried", "fed"], ["h_next"]),
        helper.make_node("MatMul", ["h_next", "C_s"], ["y_s"]),  # (b, g, h/g, p, 1)
    ]
    step_graph = helper.make_graph(
        step_nodes,
        "ssd_scan_step",
        [scan_value(v, 5) for v in ("h_prev", "decay_s", "drive_s", "B_s", "C_s")],
        [scan_value(v, 5) for v in ("h_next", "y_s")],
    )
    body.nodes.append(
        helper.make_node(
            "Scan",
            [h0, decay, drive, B6, C6],
            ["h_last", "y_stacked"],
            body=step_graph,
            num_scan_inputs=4,
        )
    )
    body.nodes.append(helper.make_node("Reshape", ["h_last", shape(b, h, p, n)], ["final_state"]))
    y = by_position(body.op("Reshape", "y_stacked", shape(length, b, h, p)))
    _epilogue(body, y, "x")
    inputs = ["x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state"]
    return helper.make_function(
        DOMAIN,
        "SsdScan",
        inputs,
        ["out", "final_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=_DT_ATTRIBUTES,
    )


def ssd_state_update_function(opset: int) -> onnx.FunctionProto:
    body = _Body("su2")
    step = _step_size(body, "dt", "dt_bias")  # (b, h)
    b, h, p, n = (_dim(body, "state", axis) for axis in range(4))
    g = _dim(body, "B", 1)
    per_group, one = body.op("Div", h, g), body.const([1])
    shape = lambda *dims: body.op("Concat", *dims, axis=0)  # noqa: E731
    decay = body.op(
        "Reshape", body.op("Exp", body.op("Mul", step, "A")), shape(b, g, per_group, one, one)
    )
    drive = body.op("Mul", body.op("Unsqueeze", step, body.const([2])), "x")
    drive = body.op("Reshape", drive, shape(b, g, per_group, p, one))
    grouped = body.op("Reshape", "state", shape(b, g, per_group, p, n))
    fed = body.op("Mul", drive, body.op("Reshape", "B", shape(b, g, one, one, n)))
    new = body.op("Add", body.op("Mul", decay, grouped), fed)
    body.nodes.append(helper.make_node("Reshape", [new, shape(b, h, p, n)], ["new_state"]))
    y = body.op("MatMul", new, body.op("Reshape", "C", shape(b, g, one, n, one)))
    _epilogue(body, body.op("Reshape", y, shape(b, h, p)), "x")
    inputs = ["state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"]
    return helper.make_function(
        DOMAIN,
        "SsdStateUpdate",
        inputs,
        ["out", "new_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=_DT_ATTRIBUTES,
    )


def _gated(body: _Body, flag: str, value: str, output: str) -> None:
    """``output = flag ? value * silu(z) : value``."""
    body.select(
        flag,
        f"{output}_gated",
        f"{output}_plain",
        [
            helper.make_node("Sigmoid", ["z"], [f"{output}_sig"]),
            helper.make_node("Mul", ["z", f"{output}_sig"], [f"{output}_silu"]),
            helper.make_node("Mul", [value, f"{output}_silu"], [f"{output}_gated"]),
        ],
        [helper.make_node("Identity", [value], [f"{output}_plain"])],
        output,
    )


def rmsnorm_gated_function(opset: int) -> onnx.FunctionProto:
    body = _Body("rg")
    has_z, before = body.attr_flag("has_z"), body.attr_flag("norm_before_gate")
    _gated(body, body.op("And", has_z, body.op("Not", before)), "x", "gated_in")
    group = _int_attr_1d(body, "group_size")
    leading, d = body.op("Shape", "x", end=-1), body.op("Shape", "x", start=-1)
    grouped = body.op(
        "Reshape", "gated_in", body.op("Concat", leading, body.op("Div", d, group), group, axis=0)
    )
    mean_square = body.op(
        "ReduceMean", body.op("Mul", grouped, grouped), body.const([-1]), keepdims=1
    )
    scale = body.op("Sqrt", body.op("Add", mean_square, _float_attr(body, "eps")))
    normed = body.op("Reshape", body.op("Div", grouped, scale), body.op("Shape", "x"))
    _gated(body, body.op("And", has_z, before), body.op("Mul", normed, "weight"), "gated_out")
    body.nodes.append(helper.make_node("CastLike", ["gated_out", "x"], ["out"]))
    return helper.make_function(
        DOMAIN,
        "RmsNormGated",
        ["x", "z", "weight"],
        ["out"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["group_size", "eps", "norm_before_gate", "has_z"],
    )
