"""Portable bodies of the fused Mamba-2 mixer ops: the unfused ssmcc ops they fuse, called as
nodes of the ``ssmcc`` domain (math in ``ssmcc.ops.ssd_mixer``; d = h p, c = d + 2 g n)::

    SsdMixer:      z, xBC, dt = Slice(zxbcdt, ...) on the last axis
                   xBC, conv_state = ssmcc.CausalConv1d(Transpose(xBC), conv_weight, conv_bias,
                                                        conv_state)        then Transpose back
                   x, B, C = Split(xBC, [d, g n, g n]) as (b, l, h, p), (b, l, g, n), (b, l, g, n)
                   y, ssm_state = ssmcc.SsdScan(x, dt, A, B, C, D, -, dt_bias, ssm_state)
                   y = ssmcc.RmsNormGated(y as (b, l, d), z, norm_weight)
    SsdMixerStep:  the same at one position, through CausalConv1dUpdate and SsdStateUpdate.

The called ops are model-local functions themselves (``functions.py``, ``functions_ssd.py``):
a runtime without the ssmcc kernels inlines both levels (ONNX Runtime does; for others,
``onnx.inliner.inline_local_functions`` flattens them), and a runtime with the kernels of the
called ops but not of the fused one still runs those kernels.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ssmcc.lowering.onnx.functions import _Body, _dim
from ssmcc.lowering.onnx.functions_ssd import _int_attr_1d
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
        kind = onnx.AttributeProto.FLOAT if outer in ("eps", "dt_min", "dt_max") else None
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
