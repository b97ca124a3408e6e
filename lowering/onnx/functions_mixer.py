"""Portable bodies of the fused mixer ops: the unfused ssmcc ops they fuse, called as nodes of the
``ssmcc`` domain. Mamba-2 (math in ``ssmcc.ops.ssd_mixer``; d = h p, c = d + 2 g n)::

    SsdMixer:      z, xBC, dt = Slice(zxbcdt, ...) on the last axis
                   xBC, conv_state = ssmcc.CausalConv1d(Transpose(xBC), conv_weight, conv_bias,
                                                        conv_state)        then Transpose back
                   x, B, C = Split(xBC, [d, g n, g n]) as (b, l, h, p), (b, l, g, n), (b, l, g, n)
                   y, ssm_state = ssmcc.SsdScan(x, dt, A, B, C, D, -, dt_bias, ssm_state)
                   y = ssmcc.RmsNormGated(y as (b, l, d), z, norm_weight)
    SsdMixerStep:  the same at one position, through CausalConv1dUpdate and SsdStateUpdate.

Mamba-1 (``ssmcc.ops.mamba_mixer``; E = R + 2n)::

    MambaMixer:    x, z = Slice(zx, ...);  xc, conv_state = ssmcc.CausalConv1d(Transpose(x), ...)
                   dt_r, B, C = Split(Transpose(xc) @ x_proj_weight^T, [R, n, n])  (RMS-normed
                   when has_rms);  dt = dt_r @ dt_proj_weight^T
                   y, ssm_state = ssmcc.SelectiveScan(xc, dt^T, A, B^T, C^T, D, z^T, dt_bias)
                   y = Transpose(y)
    MambaMixerStep: the same at one position, through CausalConv1dUpdate and
                   SelectiveStateUpdate.
    QuantizedMambaMixer(Step): MambaMixer(Step)(..., ssmcc.Widen(x_proj_weight, x_proj_scale),
                   ssmcc.Widen(dt_proj_weight, dt_proj_scale), ...)

The called ops are model-local functions themselves (``functions.py``, ``functions_ssd.py``):
a runtime without the ssmcc kernels inlines both levels (ONNX Runtime does; for others,
``onnx.inliner.inline_local_functions`` flattens them), and a runtime with the kernels of the
called ops but not of the fused one still runs those kernels.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ssmcc.lowering.onnx.functions import _Body, _dim
from ssmcc.lowering.onnx.functions_ssd import _float_attr, _int_attr_1d
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

_ATTRIBUTES = [
    "groups",
    "z_offset",
    "has_z",
    "xbc_offset",
    "dt_offset",
    "norm_group_size",
    "eps",
    "norm_before_gate",
    "activation",
    "dt_softplus",
    "dt_min",
    "dt_max",
]
_INPUTS = [
    "zxbcdt",
    "conv_weight",
    "conv_bias",
    "A",
    "D",
    "dt_bias",
    "norm_weight",
    "conv_state",
    "ssm_state",
]
_OUTPUTS = ["y", "conv_state_out", "ssm_state_out"]


def _call(body: _Body, op_type: str, inputs: list, outputs: list, **references) -> None:
    """An ``ssmcc`` node whose attributes are the function's own (``name=outer name``)."""
    node = helper.make_node(op_type, inputs, outputs, domain=DOMAIN)
    for name, outer in references.items():
        kind = (
            onnx.AttributeProto.FLOAT if outer in ("eps", "dt_min", "dt_max", "rms_eps") else None
        )
        node.attribute.append(
            onnx.AttributeProto(
                name=name, type=kind or onnx.AttributeProto.INT, ref_attr_name=outer
            )
        )
    body.nodes.append(node)


def _pieces(body: _Body, axis: int):
    """(z, xBC, dt, sizes): slices of zxbcdt's ``axis`` and the sizes d, c, h, g n, g, n, p."""
    d, c, h = _dim(body, "norm_weight", 0), _dim(body, "conv_weight", 0), _dim(body, "A", 0)
    g = _int_attr_1d(body, "groups")
    gn = body.op("Div", body.op("Sub", c, d), body.const([2]))
    sizes = dict(d=d, c=c, h=h, gn=gn, g=g, n=body.op("Div", gn, g), p=body.op("Div", d, h))
    axes = body.const([axis])

    def piece(offset_attribute: str, size: str) -> str:
        start = _int_attr_1d(body, offset_attribute)
        return body.op("Slice", "zxbcdt", start, body.op("Add", start, size), axes)

    return piece("z_offset", d), piece("xbc_offset", c), piece("dt_offset", h), sizes


def _function(name: str, body: _Body, opset: int) -> onnx.FunctionProto:
    return helper.make_function(
        DOMAIN,
        name,
        _INPUTS,
        _OUTPUTS,
        body.nodes,
        [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, VERSION)],
        attributes=_ATTRIBUTES,
    )


def _norm(body: _Body, y: str, z: str) -> None:
    _call(
        body,
        "RmsNormGated",
        [y, z, "norm_weight"],
        ["y"],
        group_size="norm_group_size",
        eps="eps",
        norm_before_gate="norm_before_gate",
        has_z="has_z",
    )


def ssd_mixer_function(opset: int) -> onnx.FunctionProto:
    body = _Body("mx")
    z, xbc, dt, s = _pieces(body, axis=2)
    b, length = _dim(body, "zxbcdt", 0), _dim(body, "zxbcdt", 1)
    conv_out = f"{body.prefix}_conv_out"
    _call(
        body,
        "CausalConv1d",
        [body.op("Transpose", xbc, perm=[0, 2, 1]), "conv_weight", "conv_bias", "conv_state"],
        [conv_out, "conv_state_out"],
        activation="activation",
    )
    split = body.op("Concat", s["d"], s["gn"], s["gn"], axis=0)
    x, B, C = body.op(
        "Split", body.op("Transpose", conv_out, perm=[0, 2, 1]), split, axis=2, outputs=3
    )
    shape = lambda *dims: body.op("Concat", *dims, axis=0)  # noqa: E731
    x4 = body.op("Reshape", x, shape(b, length, s["h"], s["p"]))
    B4, C4 = (body.op("Reshape", t, shape(b, length, s["g"], s["n"])) for t in (B, C))
    y4 = f"{body.prefix}_y4"
    _call(
        body,
        "SsdScan",
        [x4, dt, "A", B4, C4, "D", x4, "dt_bias", "ssm_state"],
        [y4, "ssm_state_out"],
        dt_softplus="dt_softplus",
        dt_min="dt_min",
        dt_max="dt_max",
    )
    body.nodes[-1].attribute.append(helper.make_attribute("has_z", 0))
    _norm(body, body.op("Reshape", y4, shape(b, length, s["d"])), z)
    return _function("SsdMixer", body, opset)


def ssd_mixer_step_function(opset: int) -> onnx.FunctionProto:
    body = _Body("ms")
    z, xbc, dt, s = _pieces(body, axis=1)
    b = _dim(body, "zxbcdt", 0)
    conv_out = f"{body.prefix}_conv_out"
    _call(
        body,
        "CausalConv1dUpdate",
        [xbc, "conv_state", "conv_weight", "conv_bias"],
        [conv_out, "conv_state_out"],
        activation="activation",
    )
    split = body.op("Concat", s["d"], s["gn"], s["gn"], axis=0)
    x, B, C = body.op("Split", conv_out, split, axis=1, outputs=3)
    shape = lambda *dims: body.op("Concat", *dims, axis=0)  # noqa: E731
    x3 = body.op("Reshape", x, shape(b, s["h"], s["p"]))
    B3, C3 = (body.op("Reshape", t, shape(b, s["g"], s["n"])) for t in (B, C))
    y3 = f"{body.prefix}_y3"
    _call(
        body,
        "SsdStateUpdate",
        ["ssm_state", x3, dt, "A", B3, C3, "D", x3, "dt_bias"],
        [y3, "ssm_state_out"],
        dt_softplus="dt_softplus",
        dt_min="dt_min",
        dt_max="dt_max",
    )
    body.nodes[-1].attribute.append(helper.make_attribute("has_z", 0))
    _norm(body, body.op("Reshape", y3, shape(b, s["d"])), z)
    return _function("SsdMixerStep", body, opset)


_MAMBA_ATTRIBUTES = [
    "x_offset",
    "z_offset",
    "has_z",
    "activation",
    "delta_softplus",
    "has_rms",
    "rms_eps",
]
_MAMBA_INPUTS = [
    "zx",
    "conv_weight",
    "conv_bias",
    "x_proj_weight",
    "dt_proj_weight",
    "A",
    "D",
    "dt_bias",
    "conv_state",
    "ssm_state",
]


def _mamba_function(name: str, body: _Body, opset: int) -> onnx.FunctionProto:
    return helper.make_function(
        DOMAIN,
        name,
        _MAMBA_INPUTS,
        _OUTPUTS,
        body.nodes,
        [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, VERSION)],
        attributes=_MAMBA_ATTRIBUTES,
    )


def _rms_if(body: _Body, flag: str, eps: str, value: str, output: str) -> None:
    """``output = value / sqrt(mean(value^2, -1) + eps)`` when ``flag``, else ``value``."""
    axis = body.const([-1])
    body.select(
        flag,
        f"{output}_normed",
        f"{output}_plain",
        [
            helper.make_node("Mul", [value, value], [f"{output}_sq"]),
            helper.make_node("ReduceMean", [f"{output}_sq", axis], [f"{output}_ms"], keepdims=1),
            helper.make_node("Add", [f"{output}_ms", eps], [f"{output}_var"]),
            helper.make_node("Sqrt", [f"{output}_var"], [f"{output}_rms"]),
            helper.make_node("Div", [value, f"{output}_rms"], [f"{output}_normed"]),
        ],
        [helper.make_node("Identity", [value], [f"{output}_plain"])],
        output,
    )


def _mamba_projections(body: _Body, xc: str, axis: int):
    """(dt (.., d), B (.., n), C (.., n)): x_proj, the split, the optional norms, dt_proj."""
    R, n = _dim(body, "dt_proj_weight", 1), _dim(body, "A", 1)
    projected = body.op("MatMul", xc, body.op("Transpose", "x_proj_weight", perm=[1, 0]))
    pieces = body.op("Split", projected, body.op("Concat", R, n, n, axis=0), axis=axis, outputs=3)
    flag, eps = body.attr_flag("has_rms"), _float_attr(body, "rms_eps")
    for piece, name in zip(pieces, ("dt_r", "B", "C"), strict=True):
        _rms_if(body, flag, eps, piece, f"{body.prefix}_{name}")
    dt_r, B, C = (f"{body.prefix}_{name}" for name in ("dt_r", "B", "C"))
    dt = body.op("MatMul", dt_r, body.op("Transpose", "dt_proj_weight", perm=[1, 0]))
    return dt, B, C


def _mamba_slices(body: _Body, axis: int):
    d = _dim(body, "conv_weight", 0)
    axes = body.const([axis])

    def piece(offset_attribute: str) -> str:
        start = _int_attr_1d(body, offset_attribute)
        return body.op("Slice", "zx", start, body.op("Add", start, d), axes)

    return piece("x_offset"), piece("z_offset")


def mamba_mixer_function(opset: int) -> onnx.FunctionProto:
    body = _Body("mm")
    x, z = _mamba_slices(body, axis=2)
    xc = f"{body.prefix}_xc"  # (b, d, l)
    _call(
        body,
        "CausalConv1d",
        [body.op("Transpose", x, perm=[0, 2, 1]), "conv_weight", "conv_bias", "conv_state"],
        [xc, "conv_state_out"],
        activation="activation",
    )
    dt, B, C = _mamba_projections(body, body.op("Transpose", xc, perm=[0, 2, 1]), axis=2)
    channels_first = lambda t: body.op("Transpose", t, perm=[0, 2, 1])  # noqa: E731
    grouped = lambda t: body.op("Unsqueeze", channels_first(t), body.const([1]))  # noqa: E731
    y = f"{body.prefix}_y"
    _call(
        body,
        "SelectiveScan",
        [
            xc,
            channels_first(dt),
            "A",
            grouped(B),
            grouped(C),
            "D",
            channels_first(z),
            "dt_bias",
            "ssm_state",
        ],
        [y, "ssm_state_out"],
        delta_softplus="delta_softplus",
        has_z="has_z",
    )
    body.nodes.append(helper.make_node("Transpose", [y], ["y"], perm=[0, 2, 1]))
    return _mamba_function("MambaMixer", body, opset)


def mamba_mixer_step_function(opset: int) -> onnx.FunctionProto:
    body = _Body("mt")
    x, z = _mamba_slices(body, axis=1)
    xc = f"{body.prefix}_xc"  # (b, d)
    _call(
        body,
        "CausalConv1dUpdate",
        [x, "conv_state", "conv_weight", "conv_bias"],
        [xc, "conv_state_out"],
        activation="activation",
    )
    dt, B, C = _mamba_projections(body, xc, axis=1)
    grouped = lambda t: body.op("Unsqueeze", t, body.const([1]))  # noqa: E731
    _call(
        body,
        "SelectiveStateUpdate",
        ["ssm_state", xc, dt, "A", grouped(B), grouped(C), "D", z, "dt_bias"],
        ["y", "ssm_state_out"],
        dt_softplus="delta_softplus",
        has_z="has_z",
    )
    return _mamba_function("MambaMixerStep", body, opset)


def _quantized_mamba_function(name: str, inner: str, opset: int) -> onnx.FunctionProto:
    """``inner`` reading the two projection weights widened to float32 (``ssmcc.Widen``)."""
    body = _Body("qm")
    x_proj = body.op("Widen", "x_proj_weight", "x_proj_scale")
    dt_proj = body.op("Widen", "dt_proj_weight", "dt_proj_scale")
    body.nodes[-2].domain = body.nodes[-1].domain = DOMAIN
    inputs = list(_MAMBA_INPUTS)
    inputs[inputs.index("x_proj_weight")] = x_proj
    inputs[inputs.index("dt_proj_weight")] = dt_proj
    _call(body, inner, inputs, list(_OUTPUTS), **{a: a for a in _MAMBA_ATTRIBUTES})
    return helper.make_function(
        DOMAIN,
        name,
        _MAMBA_INPUTS + ["x_proj_scale", "dt_proj_scale"],
        _OUTPUTS,
        body.nodes,
        [helper.make_opsetid("", opset), helper.make_opsetid(DOMAIN, VERSION)],
        attributes=_MAMBA_ATTRIBUTES,
    )


def quantized_mamba_mixer_function(opset: int) -> onnx.FunctionProto:
    return _quantized_mamba_function("QuantizedMambaMixer", "MambaMixer", opset)


def quantized_mamba_mixer_step_function(opset: int) -> onnx.FunctionProto:
    return _quantized_mamba_function("QuantizedMambaMixerStep", "MambaMixerStep", opset)
