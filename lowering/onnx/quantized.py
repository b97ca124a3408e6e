"""ONNX form of the quantised-weight ops (math: ``ssmcc.ops.quantized_linear``).

A linear layer whose rows are known to be few (x's axes between the batch and the features are
static, e.g. a decode step's ``(b, 1, k)`` or a last-token LM head's ``(b, k)``) becomes one
``ssmcc`` node, which the ssmcc ORT library runs as a matrix-vector product that reads the small
weights and widens them in registers::

    QuantizedLinear(x[..., k], weight[n, k] int8, scale[n, G], bias[n]) -> y[..., n]
    HalfLinear(x[..., k], weight[n, k] bfloat16 | float16, scale[n, G], bias[n]) -> y[..., n]

Its portable body, and the form emitted inline where the rows include sequence positions
(prefill: a float32 GEMM dominates, which every runtime's own kernel does best), is standard ONNX::

    int8    W = Reshape(DequantizeLinear(Reshape(weight, (n G, g)), Reshape(scale, (n G,)), axis=0),
                        (n, k))                     the QDQ weight form runtimes recognise
    16-bit  W = ssmcc.Widen(weight, scale)          (body: Cast(weight, float) * scale)
    y       = MatMul(x, Transpose(W)) + bias

(per output channel, G = 1, the int8 weight is dequantised as it is; the activations are never
reshaped: ORT copies a reshaped activation, 170 ms of a 2048-token mamba-130m prefill).

An embedding is a gather in any runtime, so it is always standard ops (no custom node)::

    out = Reshape(Cast(Gather(weight, ids)) as (..., G, g) * Gather(scale, ids)[..., None],
                  (..., k))

``Widen`` makes the float32 weight on every call. ONNX Runtime with ssmcc's library runs it as a
kernel, so the 16-bit weights stay 16-bit in memory, shared by the sessions; where the library is
absent ONNX Runtime inlines the body and folds ``Cast`` of a 16-bit initializer into a float32 copy
per session (its speed, not its memory). ``DequantizeLinear`` it keeps, so int8 weights stay int8.
"""

from __future__ import annotations

import onnx
import onnxscript
from onnx import TensorProto, helper
from onnx.defs import OpSchema
from onnxscript import opset18 as op

from ssmcc.kernels.cpu.linear_binding import SMALL_KERNEL_MAX_ROWS
from ssmcc.lowering.onnx.registration import onnx_emitter
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

SSMCC = onnxscript.values.Opset(DOMAIN, VERSION)
_FLOAT = TensorProto.FLOAT


def _schema(name: str, weight_types: list[str], doc: str) -> OpSchema:
    def formal(name: str, type_str: str, doc: str) -> OpSchema.FormalParameter:
        return OpSchema.FormalParameter(name, type_str, doc)

    return OpSchema(
        name,
        DOMAIN,
        VERSION,
        doc=doc,
        inputs=[
            formal("x", "T", "(..., k)"),
            formal("weight", "W", "(n, k) stored weights"),
            formal("scale", "tensor(float)", "(n, G); W = weight * scale per group of k / G"),
            formal("bias", "tensor(float)", "(n,)"),
        ],
        outputs=[formal("y", "T", "(..., n) = x W^T + bias")],
        type_constraints=[
            ("T", ["tensor(float)"], "activations"),
            ("W", weight_types, "weight storage"),
        ],
    )


WIDEN_SCHEMA = OpSchema(
    "Widen",
    DOMAIN,
    VERSION,
    doc="The float32 weight W = weight * scale (per group of k / G columns), made on every call.",
    inputs=[
        OpSchema.FormalParameter("weight", "W", "(n, k) stored weights"),
        OpSchema.FormalParameter("scale", "tensor(float)", "(n, G)"),
    ],
    outputs=[OpSchema.FormalParameter("dense", "tensor(float)", "(n, k)")],
    type_constraints=[
        ("W", ["tensor(int8)", "tensor(bfloat16)", "tensor(float16)"], "weight storage")
    ],
)
SCHEMAS = [
    _schema("QuantizedLinear", ["tensor(int8)"], "Linear layer with int8 weights and scales."),
    _schema(
        "HalfLinear",
        ["tensor(bfloat16)", "tensor(float16)"],
        "Linear layer with 16-bit float weights (scale all ones).",
    ),
    WIDEN_SCHEMA,
]


def _few_rows(x) -> bool:
    """Whether x's rows are known to be few: every axis between the first (batch) and the last
    (features) is a static size, their product at most ``SMALL_KERNEL_MAX_ROWS``."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) < 2:
        return False
    rows = 1
    for dim in list(shape)[1:-1]:
        if not isinstance(dim, int):
            return False
        rows *= dim
    return rows <= SMALL_KERNEL_MAX_ROWS


def _is_int8(weight) -> bool:
    dtype = getattr(weight, "dtype", None)
    return dtype is not None and "INT8" in str(dtype).upper() and "UINT8" not in str(dtype).upper()


def _groups(scale) -> int | None:
    """The scale's group count when static."""
    shape = getattr(scale, "shape", None)
    return shape[1] if shape is not None and isinstance(shape[1], int) else None


@onnx_emitter(
    "quantized_linear",
    "ssmcc.QuantizedLinear / HalfLinear node where rows are few (decode), + portable body; "
    "standard DequantizeLinear (or Cast) + MatMul where rows include positions (prefill)",
)
def emit_quantized_linear(x, weight, scale, bias=None):
    int8 = _is_int8(weight)
    if _few_rows(x):
        if bias is None:
            bias = op.ConstantOfShape(
                op.Shape(weight, start=0, end=1),
                value=helper.make_tensor("value", _FLOAT, [1], [0.0]),
            )
        name = "QuantizedLinear" if int8 else "HalfLinear"
        return getattr(SSMCC, name)(x, weight, scale, bias)
    minus_one = op.Constant(value_ints=[-1])
    if int8 and _groups(scale) == 1:  # per output channel: the weight as it is
        dense = op.DequantizeLinear(weight, op.Reshape(scale, minus_one), axis=0)
    elif int8:
        rows, groups = op.Shape(weight, start=0, end=1), op.Shape(scale, start=1, end=2)
        flat = op.Reshape(weight, op.Concat(op.Mul(rows, groups), minus_one, axis=0))
        widened = op.DequantizeLinear(flat, op.Reshape(scale, minus_one), axis=0)
        dense = op.Reshape(widened, op.Shape(weight))
    else:  # widened on every call, never folded into a float32 copy per session
        dense = SSMCC.Widen(weight, scale)
    # MatMul takes x (..., k) as it is: no reshapes of the activations (ORT copies them)
    y = op.MatMul(x, op.Transpose(dense, perm=[1, 0]))
    return y if bias is None else op.Add(y, bias)


@onnx_emitter("quantized_embedding", "standard ONNX ops (Gather, Cast, Mul)")
def emit_quantized_embedding(ids, weight, scale):
    rows = op.Cast(op.Gather(weight, ids, axis=0), to=_FLOAT)
    scales = op.Gather(scale, ids, axis=0)
    grouped = op.Reshape(
        rows,
        op.Concat(
            op.Shape(ids), op.Shape(scale, start=1, end=2), op.Constant(value_ints=[-1]), axis=0
        ),
    )
    widened = op.Mul(grouped, op.Unsqueeze(scales, op.Constant(value_ints=[-1])))
    return op.Reshape(widened, op.Concat(op.Shape(ids), op.Shape(weight, start=1, end=2), axis=0))


def _linear_function(name: str, opset: int, int8: bool) -> onnx.FunctionProto:
    """The portable body: the standard form of the module docstring."""

    def node(op_type, inputs, output, **attrs):
        return helper.make_node(op_type, inputs, [output], **attrs)

    def const(output, values):
        tensor = helper.make_tensor("value", TensorProto.INT64, [len(values)], values)
        return node("Constant", [], output, value=tensor)

    nodes = [const("minus_one", [-1]), node("Shape", ["weight"], "wshape")]
    if int8:
        nodes += [
            node("Shape", ["weight"], "rows", start=0, end=1),
            node("Shape", ["scale"], "groups", start=1, end=2),
            node("Mul", ["rows", "groups"], "row_groups"),
            node("Concat", ["row_groups", "minus_one"], "flat_shape", axis=0),
            node("Reshape", ["weight", "flat_shape"], "flat"),
            node("Reshape", ["scale", "minus_one"], "flat_scale"),
            node("DequantizeLinear", ["flat", "flat_scale"], "widened", axis=0),
            node("Reshape", ["widened", "wshape"], "dense"),
        ]
    else:
        nodes += [
            node("Cast", ["weight"], "wide", to=_FLOAT),
            node("Mul", ["wide", "scale"], "dense"),
        ]
    nodes += [
        node("Transpose", ["dense"], "dense_t", perm=[1, 0]),
        node("MatMul", ["x", "dense_t"], "product"),
        node("Add", ["product", "bias"], "y"),
    ]
    return helper.make_function(
        DOMAIN,
        name,
        ["x", "weight", "scale", "bias"],
        ["y"],
        nodes,
        [helper.make_opsetid("", opset)],
    )


def widen_function(opset: int) -> onnx.FunctionProto:
    """``Widen``'s portable body: per group of g = k / G columns, ``Cast(weight) * scale``."""

    def node(op_type, inputs, output, **attrs):
        return helper.make_node(op_type, inputs, [output], **attrs)

    def const(output, value):
        tensor = helper.make_tensor("value", TensorProto.INT64, [1], [value])
        return node("Constant", [], output, value=tensor)

    nodes = [
        const("minus_one", -1),
        const("one", 1),
        node("Shape", ["weight"], "wshape"),
        node("Shape", ["weight"], "rows", start=0, end=1),
        node("Shape", ["scale"], "groups", start=1, end=2),
        node("Mul", ["rows", "groups"], "row_groups"),
        node("Concat", ["row_groups", "minus_one"], "flat_shape", axis=0),
        node("Cast", ["weight"], "wide", to=_FLOAT),
        node("Reshape", ["wide", "flat_shape"], "flat"),
        node("Concat", ["row_groups", "one"], "scale_shape", axis=0),
        node("Reshape", ["scale", "scale_shape"], "flat_scale"),
        node("Mul", ["flat", "flat_scale"], "scaled"),
        node("Reshape", ["scaled", "wshape"], "dense"),
    ]
    return helper.make_function(
        DOMAIN, "Widen", ["weight", "scale"], ["dense"], nodes, [helper.make_opsetid("", opset)]
    )


def quantized_linear_function(opset: int) -> onnx.FunctionProto:
    return _linear_function("QuantizedLinear", opset, int8=True)


def half_linear_function(opset: int) -> onnx.FunctionProto:
    return _linear_function("HalfLinear", opset, int8=False)
