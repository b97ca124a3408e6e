"""Portable bodies of the ssmcc ONNX ops: model-local functions built from standard ONNX ops.

Any ONNX runtime runs a model that carries them; ONNX Runtime inlines a function when no kernel is
registered for its domain/op, and prefers a registered custom-op kernel when there is one.

``SelectiveScan`` (math in ``ssmcc.ops.selective_scan``)::

    dt  = delta + delta_bias[:, None];  dt = Softplus(dt) if delta_softplus
    h_t = Exp(dt_t[..., None] * A) * h_{t-1} + (dt_t * u_t)[..., None] * B_t    # ONNX Scan over l
    y_t = C_t @ h_t                                                              # sum over n
    out = y + D[:, None] * u;  out = out * z * Sigmoid(z) if has_z

Inside the loop the state is grouped and channels-innermost, (b, g, n, d/g), so B_t and C_t
broadcast to the channels of their group over contiguous spans; no (b, d, n, l) tensor is ever
materialised. The Scan reads its inputs position-major, (l, b, ...), along axis 0: the one axis
``onnx.reference`` runs, and the layout ONNX Runtime's Scan otherwise makes itself by a transpose.

``CausalConv1d``: ``xs = Concat(state, x)``;
``out = act(sum_j weight[:, j] * xs[:, :, j : j + l] + bias)`` (k unrolled; ``act`` the one the
``activation`` attribute names, ``activations.py``); the final state is the last k-1 columns of
``xs``.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

from ssmcc.lowering.onnx.activations import select_activation
from ssmcc.lowering.onnx.schemas import DOMAIN

INT64_MAX = 2**63 - 1


class _Body:
    """Collects nodes with unique output names."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self.count = 0

    def op(self, op_type: str, *inputs: str, outputs: int = 1, **attrs) -> str | list[str]:
        names = [f"{self.prefix}_{op_type.lower()}_{self.count}_{i}" for i in range(outputs)]
        self.count += 1
        self.nodes.append(helper.make_node(op_type, list(inputs), names, **attrs))
        return names[0] if outputs == 1 else names

    def const(self, values: list[int]) -> str:
        tensor = helper.make_tensor("value", TensorProto.INT64, [len(values)], values)
        return self.op("Constant", value=tensor)

    def attr_flag(self, attribute: str) -> str:
        """A bool scalar from an int attribute of the function (``ref_attr_name``)."""
        name = f"{self.prefix}_flag_{attribute}"
        node = helper.make_node("Constant", [], [name])
        node.attribute.append(
            onnx.AttributeProto(
                name="value_int", type=onnx.AttributeProto.INT, ref_attr_name=attribute
            )
        )
        self.nodes.append(node)
        return self.op("Cast", name, to=TensorProto.BOOL)

    def select(
        self, flag: str, then_value: str, else_value: str, then_nodes, else_nodes, output: str
    ) -> None:
        """``output = flag ? then_value : else_value``; each branch computes its own value."""
        then_graph = helper.make_graph(
            then_nodes, f"{output}_then", [], [helper.make_value_info(then_value, onnx.TypeProto())]
        )
        else_graph = helper.make_graph(
            else_nodes, f"{output}_else", [], [helper.make_value_info(else_value, onnx.TypeProto())]
        )
        self.nodes.append(
            helper.make_node("If", [flag], [output], then_branch=then_graph, else_branch=else_graph)
        )

    def softplus_if(self, attribute: str, value: str, output: str) -> None:
        """``output = Softplus(value)`` when the int attribute is 1, else ``value``."""
        self.select(
            self.attr_flag(attribute),
            f"{output}_soft",
            f"{output}_plain",
            [helper.make_node("Softplus", [value], [f"{output}_soft"])],
            [helper.make_node("Identity", [value], [f"{output}_plain"])],
            output,
        )

    def gate_if(self, attribute: str, value: str, gate: str, output: str) -> None:
        """``output = value * silu(gate)`` when the int attribute is 1, else ``value``."""
        self.select(
            self.attr_flag(attribute),
            f"{output}_gated",
            f"{output}_plain",
            [
                helper.make_node("Sigmoid", [gate], [f"{output}_sig"]),
                helper.make_node("Mul", [gate, f"{output}_sig"], [f"{output}_silu"]),
                helper.make_node("Mul", [value, f"{output}_silu"], [f"{output}_gated"]),
            ],
            [helper.make_node("Identity", [value], [f"{output}_plain"])],
            output,
        )

    def broadcast_shapes(self, x: str, B: str, A: str) -> tuple[str, str, str]:
        """Shapes taking B/C (b, g, n) to channels: (b, g, 1, n) -> (b, g, d/g, n) -> (b, d, n)."""
        b, d = _dim(self, x, 0), _dim(self, x, 1)
        g, n = _dim(self, B, 1), _dim(self, A, 1)
        grouped = self.op("Concat", b, g, self.const([1]), n, axis=0)
        expanded = self.op("Concat", b, g, self.op("Div", d, g), n, axis=0)
        return grouped, expanded, self.op("Concat", b, d, n, axis=0)


def scan_value(name: str, rank: int) -> onnx.ValueInfoProto:
    """A Scan body's input or output: float32 of a known rank, sizes left open (the ONNX target
    runs float32 programs). OpenVINO needs the rank to choose its kernels; ORT needs nothing."""
    return helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [None] * rank)


def _dim(body: _Body, tensor: str, axis: int) -> str:
    return body.op("Shape", tensor, start=axis, end=axis + 1)


def selective_scan_function(opset: int) -> onnx.FunctionProto:
    """The body for a model whose default-domain opset is ``opset`` (>= 18).

    The loop state is kept as (b, g, n, d/g): channels innermost, so every broadcast in a step
    runs over contiguous spans of d/g values (ONNX Runtime's broadcasting is slow when the
    innermost dimension is the broadcast one), and y_t is one MatMul, (b, g, 1, n) @ h_t. dt and
    dt * u are computed for all steps before the loop, position-major (delta and u transposed to
    (l, b, d) first; B and C to (l, b, g, n); y back to (b, d, l)). Each step: Mul, Exp, Mul, Mul,
    Add, MatMul.
    """
    body = _Body("ss")
    inputs = ["u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"]
    by_position = [2, 0, 1]  # (b, d, l) -> (l, b, d): Scan runs along axis 0
    dt_raw = body.op("Add", body.op("Transpose", "delta", perm=by_position), "delta_bias")
    body.softplus_if("delta_softplus", dt_raw, "dt")  # (l, b, d)
    dtu = body.op("Mul", "dt", body.op("Transpose", "u", perm=by_position))
    b, d, length = _dim(body, "u", 0), _dim(body, "u", 1), _dim(body, "u", 2)
    g, n = _dim(body, "B", 1), _dim(body, "A", 1)
    per_group, one = body.op("Div", d, g), body.const([1])
    by_group = body.op("Concat", length, b, g, one, per_group, axis=0)  # (l, b, g, 1, d/g)
    dt5, dtu5 = body.op("Reshape", "dt", by_group), body.op("Reshape", dtu, by_group)
    B_steps, C_steps = (body.op("Transpose", t, perm=[3, 0, 1, 2]) for t in ("B", "C"))
    B5 = body.op("Unsqueeze", B_steps, body.const([4]))  # (l, b, g, n, 1)
    C5 = body.op("Unsqueeze", C_steps, body.const([3]))  # (l, b, g, 1, n)
    A_grouped = body.op("Reshape", "A", body.op("Concat", g, per_group, n, axis=0))
    body.nodes.append(helper.make_node("Transpose", [A_grouped], ["A_by_state"], perm=[0, 2, 1]))
    h0_grouped = body.op("Reshape", "initial_state", body.op("Concat", b, g, per_group, n, axis=0))
    h0 = body.op("Transpose", h0_grouped, perm=[0, 1, 3, 2])  # (b, g, n, d/g)
    # A rides along as a loop-carried value passed through unchanged: a Scan body that read it
    # from the enclosing scope is valid ONNX, but OpenVINO's Scan accepts only explicit inputs.
    step_nodes = [
        helper.make_node("Identity", ["A_prev"], ["A_next"]),
        helper.make_node("Mul", ["dt_s", "A_prev"], ["rate"]),
        helper.make_node("Exp", ["rate"], ["decay"]),  # (b, g, n, d/g)
        helper.make_node("Mul", ["decay", "h_prev"], ["carried"]),
        helper.make_node("Mul", ["dtu_s", "B_s"], ["drive"]),
        helper.make_node("Add", ["carried", "drive"], ["h_next"]),
        helper.make_node("MatMul", ["C_s", "h_next"], ["y_s"]),  # (b, g, 1, d/g)
    ]
    step_graph = helper.make_graph(
        step_nodes,
        "selective_scan_step",
        [
            scan_value(v, rank)
            for v, rank in (
                ("h_prev", 4),
                ("A_prev", 3),
                ("dt_s", 4),
                ("dtu_s", 4),
                ("B_s", 4),
                ("C_s", 4),
            )
        ],
        [scan_value(v, rank) for v, rank in (("h_next", 4), ("A_next", 3), ("y_s", 4))],
    )
    body.nodes.append(
        helper.make_node(
            "Scan",
            [h0, "A_by_state", dt5, dtu5, B5, C5],
            ["h_last", "A_last", "y_grouped"],
            body=step_graph,
            num_scan_inputs=4,
        )
    )
    h_last = body.op("Transpose", "h_last", perm=[0, 1, 3, 2])
    body.nodes.append(
        helper.make_node("Reshape", [h_last, body.op("Concat", b, d, n, axis=0)], ["last_state"])
    )
    y_steps = body.op("Reshape", "y_grouped", body.op("Concat", length, b, d, axis=0))
    y_scan = body.op("Transpose", y_steps, perm=[1, 2, 0])  # (b, d, l)
    skip = body.op("Mul", body.op("Unsqueeze", "D", body.const([1])), "u")
    y = body.op("Add", y_scan, skip)
    body.gate_if("has_z", y, "z", "y_gated")
    body.nodes.append(helper.make_node("CastLike", ["y_gated", "u"], ["out"]))
    return helper.make_function(
        DOMAIN,
        "SelectiveScan",
        inputs,
        ["out", "last_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["delta_softplus", "has_z"],
    )


def selective_state_update_function(opset: int) -> onnx.FunctionProto:
    """One step: ``new = Exp(dt' A) * state + (dt' x) B``, ``y = sum(new * C) + D x``, gated."""
    body = _Body("su")
    inputs = ["state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"]
    body.softplus_if("dt_softplus", body.op("Add", "dt", "dt_bias"), "dt_final")
    grouped, expanded, channels = body.broadcast_shapes("x", "B", "A")

    def per_channel(value):
        return body.op(
            "Reshape", body.op("Expand", body.op("Reshape", value, grouped), expanded), channels
        )

    axis2 = body.const([2])
    dt3 = body.op("Unsqueeze", "dt_final", axis2)
    decay = body.op("Exp", body.op("Mul", dt3, "A"))
    drive = body.op(
        "Mul", body.op("Unsqueeze", body.op("Mul", "dt_final", "x"), axis2), per_channel("B")
    )
    body.nodes.append(
        helper.make_node("Add", [body.op("Mul", decay, "state"), drive], ["new_state"])
    )
    y = body.op("ReduceSum", body.op("Mul", "new_state", per_channel("C")), axis2, keepdims=0)
    y = body.op("Add", y, body.op("Mul", "D", "x"))
    body.gate_if("has_z", y, "z", "y_gated")
    body.nodes.append(helper.make_node("CastLike", ["y_gated", "x"], ["out"]))
    return helper.make_function(
        DOMAIN,
        "SelectiveStateUpdate",
        inputs,
        ["out", "new_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["dt_softplus", "has_z"],
    )


def causal_conv1d_update_function(opset: int) -> onnx.FunctionProto:
    """``xs = Concat(conv_state, x)``; ``out = act(ReduceSum(xs * weight) + bias)``; the new state
    is ``xs`` without its first column.

    The sum keeps its axis and a Squeeze drops it: with ``keepdims=0`` OpenVINO 2026.4's CPU
    plugin, given the inlined step graph of a Mamba-2 model, computed wrong outputs at batch > 1
    (batch 1 exact; the same node alone exact; ``tests/test_openvino.py`` keeps the case)."""
    body = _Body("cu")
    axis2 = body.const([2])
    xs = body.op("Concat", "conv_state", body.op("Unsqueeze", "x", axis2), axis=2)
    summed = body.op("ReduceSum", body.op("Mul", xs, "weight"), axis2, keepdims=1)
    pre = body.op("Add", body.op("Squeeze", summed, axis2), "bias")
    select_activation(body, "activation", pre, "activated")
    body.nodes.append(helper.make_node("CastLike", ["activated", "x"], ["out"]))
    body.nodes.append(
        helper.make_node(
            "Slice", [xs, body.const([1]), body.const([INT64_MAX]), axis2], ["new_state"]
        )
    )
    return helper.make_function(
        DOMAIN,
        "CausalConv1dUpdate",
        ["x", "conv_state", "weight", "bias"],
        ["out", "new_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["activation"],
    )


def causal_conv1d_function(opset: int, width: int) -> onnx.FunctionProto:
    """The body for kernel width ``width`` (the k loop is unrolled), default-domain ``opset``."""
    body = _Body("cc")
    xs = body.op("Concat", "initial_state", "x", axis=2)
    length = _dim(body, "x", 2)
    axis2, axis1 = body.const([2]), body.const([1])
    total = None
    for j in range(width):
        start = body.const([j])
        window = body.op("Slice", xs, start, body.op("Add", start, length), axis2)
        tap = body.op("Gather", "weight", body.const([j]), axis=1)  # (d, 1)
        term = body.op("Mul", body.op("Reshape", tap, body.const([1, -1, 1])), window)
        total = term if total is None else body.op("Add", total, term)
    pre = body.op("Add", total, body.op("Unsqueeze", "bias", axis1))
    select_activation(body, "activation", pre, "activated")
    body.nodes.append(helper.make_node("CastLike", ["activated", "x"], ["out"]))
    xs_len = _dim(body, xs, 2)
    state_start = body.op("Sub", xs_len, body.const([width - 1]))
    body.nodes.append(
        helper.make_node(
            "Slice", [xs, state_start, body.const([INT64_MAX]), axis2], ["final_state"]
        )
    )
    return helper.make_function(
        DOMAIN,
        "CausalConv1d",
        ["x", "weight", "bias", "initial_state"],
        ["out", "final_state"],
        body.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["activation"],
    )
