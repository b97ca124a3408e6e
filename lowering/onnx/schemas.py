"""ONNX schemas of the ``ssmcc`` domain (version 1), registered with ``onnx.defs``.

The ONNX form of each op has a fixed arity so that its portable function body (``functions.py``)
never meets an absent input: the emitters materialise neutral values (zeros) for absent ``D``,
``delta_bias``, ``bias`` and states, and pass ``has_z = 0`` with ``u`` standing in for an absent
gate. Shapes (b batch, d channels, l length, g groups, n state, k conv width)::

    SelectiveScan(u[b,d,l], delta[b,d,l], A[d,n], B[b,g,n,l], C[b,g,n,l], D[d], z[b,d,l],
                  delta_bias[d], initial_state[b,d,n]; delta_softplus, has_z)
        -> out[b,d,l], last_state[b,d,n]
    CausalConv1d(x[b,d,l], weight[d,k], bias[d], initial_state[b,d,k-1]; activation)
        -> out[b,d,l], final_state[b,d,k-1]

    SelectiveStateUpdate(state[b,d,n], x[b,d], dt[b,d], A[d,n], B[b,g,n], C[b,g,n], D[d], z[b,d],
                         dt_bias[d]; dt_softplus, has_z) -> out[b,d], new_state[b,d,n]
    CausalConv1dUpdate(x[b,d], conv_state[b,d,k-1], weight[d,k], bias[d]; activation)
        -> out[b,d], new_state[b,d,k-1]

B and C share one group count g, which divides d (channel c reads group c // (d / g)); the
emitters bring IR ops whose B and C are grouped differently to a common count. The ssmcc ORT
kernels check every input's shape against these and fail the run naming the input otherwise.
``activation``: the conv's activation, a code of ``ssmcc.ops.activations`` (0 identity,
1 silu, 2 gelu, 3 gelu_tanh, 4 relu, 5 relu2).

Mamba-2 (h heads of p channels, g groups dividing h)::

    SsdScan(x[b,l,h,p], dt[b,l,h], A[h], B[b,l,g,n], C[b,l,g,n], D[h,p], z[b,l,h,p], dt_bias[h],
            initial_state[b,h,p,n]; dt_softplus, has_z, dt_min, dt_max) -> out, final_state
    SsdStateUpdate(state[b,h,p,n], x[b,h,p], dt[b,h], A[h], B[b,g,n], C[b,g,n], D[h,p], z[b,h,p],
                   dt_bias[h]; dt_softplus, has_z, dt_min, dt_max) -> out[b,h,p], new_state
    RmsNormGated(x[...,d], z[...,d], weight[d]; group_size, eps, norm_before_gate, has_z) -> out

The fused Mamba-2 mixer (d = h p, c = d + 2 g n; see ``ssmcc.ops.ssd_mixer``)::

    SsdMixer(zxbcdt[b,l,w], conv_weight[c,k], conv_bias[c], A[h], D[h,p], dt_bias[h],
             norm_weight[d], conv_state[b,c,k-1], ssm_state[b,h,p,n]; groups, z_offset, has_z,
             xbc_offset, dt_offset, norm_group_size, eps, norm_before_gate, activation,
             dt_softplus, dt_min, dt_max) -> y[b,l,d], conv_state, ssm_state
    SsdMixerStep: the same with zxbcdt[b,w] -> y[b,d], conv_state, ssm_state

The fused Mamba-1 mixer (E = R + 2n; see ``ssmcc.ops.mamba_mixer``)::

    MambaMixer(zx[b,l,w], conv_weight[d,k], conv_bias[d], x_proj_weight[E,d],
               dt_proj_weight[d,R], A[d,n], D[d], dt_bias[d], conv_state[b,d,k-1],
               ssm_state[b,d,n]; x_offset, z_offset, has_z, activation, delta_softplus, has_rms,
               rms_eps) -> y[b,l,d], conv_state, ssm_state
    MambaMixerStep: the same with zx[b,w] -> y[b,d], conv_state, ssm_state
    QuantizedMambaMixer(Step): the same with x_proj_weight / dt_proj_weight stored small (int8,
               bfloat16 or float16) and two more inputs, x_proj_scale[E,Gx], dt_proj_scale[d,Gd]
               (W = weight * scale per group; ``ssmcc.ops.quantized_linear``)

Registration is process-wide and idempotent.
"""

from __future__ import annotations

import onnx
from onnx.defs import OpSchema

DOMAIN = "ssmcc"
VERSION = 1
# The ``activation`` attribute's codes: ``ssmcc.ops.activations`` (0 and 1 as ever: artifacts
# written when those were the only two read the same).
ACTIVATION_CODES = "0 identity, 1 silu, 2 gelu (erf), 3 gelu_tanh, 4 relu, 5 relu2"

_FLOAT_TYPES = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]


def _inputs(names: list[tuple[str, str]]) -> list[OpSchema.FormalParameter]:
    return [OpSchema.FormalParameter(name, "T", doc) for name, doc in names]


def _int_attr(name: str, doc: str) -> OpSchema.Attribute:
    return OpSchema.Attribute(name, OpSchema.AttrType.INT, doc, required=True)


# Every ssmcc op may carry the attributes by which TensorRT's ONNX parser binds a node to a plugin
# (the tensorrt target sets them; lowering/tensorrt/graphs.py).
_PLUGIN_ATTRIBUTES = (
    OpSchema.Attribute(
        "plugin_namespace", OpSchema.AttrType.STRING, "TensorRT: the plugin's namespace",
        required=False,
    ),
    OpSchema.Attribute(
        "plugin_version", OpSchema.AttrType.STRING, "TensorRT: the plugin's version",
        required=False,
    ),
)


def _schema(name: str, domain: str, version: int, *, attributes=(), **fields) -> OpSchema:
    return OpSchema(name, domain, version, attributes=[*attributes, *_PLUGIN_ATTRIBUTES], **fields)


SCHEMAS = [
    _schema(
        "SelectiveScan",
        DOMAIN,
        VERSION,
        doc="Mamba-1 selective scan (see ssmcc.ops.selective_scan).",
        inputs=_inputs(
            [
                ("u", "(b, d, l)"),
                ("delta", "(b, d, l)"),
                ("A", "(d, n)"),
                ("B", "(b, g, n, l)"),
                ("C", "(b, g, n, l), the g of B"),
                ("D", "(d,)"),
                ("z", "(b, d, l); ignored when has_z = 0"),
                ("delta_bias", "(d,)"),
                ("initial_state", "(b, d, n)"),
            ]
        ),
        outputs=_inputs([("out", "(b, d, l)"), ("last_state", "(b, d, n)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=[
            _int_attr("delta_softplus", "1: dt = softplus(delta + delta_bias)"),
            _int_attr("has_z", "1: out = y * silu(z)"),
        ],
    ),
    _schema(
        "CausalConv1d",
        DOMAIN,
        VERSION,
        doc="Depthwise causal conv over a sequence (see ssmcc.ops.causal_conv1d).",
        inputs=_inputs(
            [
                ("x", "(b, d, l)"),
                ("weight", "(d, k)"),
                ("bias", "(d,)"),
                ("initial_state", "(b, d, k-1)"),
            ]
        ),
        outputs=_inputs([("out", "(b, d, l)"), ("final_state", "(b, d, k-1)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=[_int_attr("activation", ACTIVATION_CODES)],
    ),
]


SCHEMAS += [
    _schema(
        "SelectiveStateUpdate",
        DOMAIN,
        VERSION,
        doc="One selective-scan step (see ssmcc.ops.selective_state_update).",
        inputs=_inputs(
            [
                ("state", "(b, d, n)"),
                ("x", "(b, d)"),
                ("dt", "(b, d)"),
                ("A", "(d, n)"),
                ("B", "(b, g, n)"),
                ("C", "(b, g, n), the g of B"),
                ("D", "(d,)"),
                ("z", "(b, d); ignored when has_z = 0"),
                ("dt_bias", "(d,)"),
            ]
        ),
        outputs=_inputs([("out", "(b, d)"), ("new_state", "(b, d, n)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=[
            _int_attr("dt_softplus", "1: dt = softplus(dt + dt_bias)"),
            _int_attr("has_z", "1: out = y * silu(z)"),
        ],
    ),
    _schema(
        "CausalConv1dUpdate",
        DOMAIN,
        VERSION,
        doc="One step of the depthwise causal conv (see ssmcc.ops.causal_conv1d_update).",
        inputs=_inputs(
            [
                ("x", "(b, d)"),
                ("conv_state", "(b, d, k-1)"),
                ("weight", "(d, k)"),
                ("bias", "(d,)"),
            ]
        ),
        outputs=_inputs([("out", "(b, d)"), ("new_state", "(b, d, k-1)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=[_int_attr("activation", ACTIVATION_CODES)],
    ),
]


def _float_attr(name: str, doc: str) -> OpSchema.Attribute:
    return OpSchema.Attribute(name, OpSchema.AttrType.FLOAT, doc, required=True)


_DT_ATTRIBUTES = [
    _int_attr("dt_softplus", "1: dt = softplus(dt + dt_bias)"),
    _int_attr("has_z", "1: out = y * silu(z)"),
    _float_attr("dt_min", "dt is clamped to [dt_min, dt_max] after softplus"),
    _float_attr("dt_max", "upper clamp of dt (inf: none)"),
]

SCHEMAS += [
    _schema(
        "SsdScan",
        DOMAIN,
        VERSION,
        doc="Mamba-2 SSD scan (see ssmcc.ops.ssd_scan).",
        inputs=_inputs(
            [
                ("x", "(b, l, h, p)"),
                ("dt", "(b, l, h)"),
                ("A", "(h,)"),
                ("B", "(b, l, g, n)"),
                ("C", "(b, l, g, n), B's shape"),
                ("D", "(h, p)"),
                ("z", "(b, l, h, p); ignored when has_z = 0"),
                ("dt_bias", "(h,)"),
                ("initial_state", "(b, h, p, n)"),
            ]
        ),
        outputs=_inputs([("out", "(b, l, h, p)"), ("final_state", "(b, h, p, n)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=_DT_ATTRIBUTES,
    ),
    _schema(
        "SsdStateUpdate",
        DOMAIN,
        VERSION,
        doc="One SSD step (see ssmcc.ops.ssd_state_update).",
        inputs=_inputs(
            [
                ("state", "(b, h, p, n)"),
                ("x", "(b, h, p)"),
                ("dt", "(b, h)"),
                ("A", "(h,)"),
                ("B", "(b, g, n)"),
                ("C", "(b, g, n), B's shape"),
                ("D", "(h, p)"),
                ("z", "(b, h, p); ignored when has_z = 0"),
                ("dt_bias", "(h,)"),
            ]
        ),
        outputs=_inputs([("out", "(b, h, p)"), ("new_state", "(b, h, p, n)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=_DT_ATTRIBUTES,
    ),
    _schema(
        "RmsNormGated",
        DOMAIN,
        VERSION,
        doc="Gated RMSNorm over groups of the last axis (see ssmcc.ops.rmsnorm_gated).",
        inputs=_inputs(
            [("x", "(..., d)"), ("z", "(..., d); ignored when has_z = 0"), ("weight", "(d,)")]
        ),
        outputs=_inputs([("out", "(..., d)")]),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=[
            _int_attr("group_size", "channels per normalised group (divides d)"),
            _float_attr("eps", "added to the mean square"),
            _int_attr("norm_before_gate", "1: w * norm(x) * silu(z); 0: w * norm(x * silu(z))"),
            _int_attr("has_z", "1: gated"),
        ],
    ),
]


_MIXER_ATTRIBUTES = [
    _int_attr("groups", "g: groups of B and C"),
    _int_attr("z_offset", "z at [z_offset, z_offset + d) of zxbcdt's last axis"),
    _int_attr("has_z", "1: the norm is gated by z"),
    _int_attr("xbc_offset", "xBC at [xbc_offset, xbc_offset + c)"),
    _int_attr("dt_offset", "dt at [dt_offset, dt_offset + h)"),
    _int_attr("norm_group_size", "channels per normalised group (divides d)"),
    _float_attr("eps", "added to the mean square"),
    _int_attr("norm_before_gate", "1: w * norm(y) * silu(z); 0: w * norm(y * silu(z))"),
    _int_attr("activation", "of the conv: " + ACTIVATION_CODES),
    *[a for a in _DT_ATTRIBUTES if a.name != "has_z"],
]


def _mixer_schema(name: str, proj: str, y: str, doc: str) -> OpSchema:
    return OpSchema(
        name,
        DOMAIN,
        VERSION,
        doc=doc,
        inputs=_inputs(
            [
                ("zxbcdt", proj),
                ("conv_weight", "(c, k)"),
                ("conv_bias", "(c,)"),
                ("A", "(h,)"),
                ("D", "(h, p)"),
                ("dt_bias", "(h,)"),
                ("norm_weight", "(d,)"),
                ("conv_state", "(b, c, k-1)"),
                ("ssm_state", "(b, h, p, n)"),
            ]
        ),
        outputs=_inputs(
            [("y", y), ("conv_state_out", "(b, c, k-1)"), ("ssm_state_out", "(b, h, p, n)")]
        ),
        type_constraints=[("T", _FLOAT_TYPES, "floating point")],
        attributes=_MIXER_ATTRIBUTES,
    )


SCHEMAS += [
    _mixer_schema(
        "SsdMixer", "(b, l, w)", "(b, l, d)", "Fused Mamba-2 mixer (ssmcc.ops.ssd_mixer)."
    ),
    _mixer_schema("SsdMixerStep", "(b, w)", "(b, d)", "One position of SsdMixer."),
]


_MAMBA_MIXER_ATTRIBUTES = [
    _int_attr("x_offset", "x at [x_offset, x_offset + d) of zx's last axis"),
    _int_attr("z_offset", "z at [z_offset, z_offset + d)"),
    _int_attr("has_z", "1: y is gated by silu(z)"),
    _int_attr("activation", "of the conv: " + ACTIVATION_CODES),
    _int_attr("delta_softplus", "1: dt = softplus(dt + dt_bias)"),
    _int_attr("has_rms", "1: dt_r, B and C are RMS-normalised (FalconMamba)"),
    _float_attr("rms_eps", "eps of those norms"),
]


_STORED_TYPES = ["tensor(int8)", "tensor(bfloat16)", "tensor(float16)"]


def _mamba_mixer_schema(
    name: str, proj: str, y: str, doc: str, quantized: bool = False
) -> OpSchema:
    inputs = _inputs(
        [
            ("zx", proj),
            ("conv_weight", "(d, k)"),
            ("conv_bias", "(d,)"),
            ("x_proj_weight", "(R + 2n, d)"),
            ("dt_proj_weight", "(d, R)"),
            ("A", "(d, n)"),
            ("D", "(d,)"),
            ("dt_bias", "(d,)"),
            ("conv_state", "(b, d, k-1)"),
            ("ssm_state", "(b, d, n)"),
        ]
    )
    constraints = [("T", _FLOAT_TYPES, "floating point")]
    if quantized:
        inputs[3] = OpSchema.FormalParameter("x_proj_weight", "W", "(R + 2n, d) stored small")
        inputs[4] = OpSchema.FormalParameter("dt_proj_weight", "V", "(d, R) stored small")
        inputs += [
            OpSchema.FormalParameter("x_proj_scale", "tensor(float)", "(R + 2n, Gx)"),
            OpSchema.FormalParameter("dt_proj_scale", "tensor(float)", "(d, Gd)"),
        ]
        constraints += [("W", _STORED_TYPES, "x_proj storage"), ("V", _STORED_TYPES, "dt_proj")]
    return OpSchema(
        name,
        DOMAIN,
        VERSION,
        doc=doc,
        inputs=inputs,
        outputs=_inputs(
            [("y", y), ("conv_state_out", "(b, d, k-1)"), ("ssm_state_out", "(b, d, n)")]
        ),
        type_constraints=constraints,
        attributes=_MAMBA_MIXER_ATTRIBUTES,
    )


SCHEMAS += [
    _mamba_mixer_schema(
        "MambaMixer", "(b, l, w)", "(b, l, d)", "Fused Mamba-1 mixer (ssmcc.ops.mamba_mixer)."
    ),
    _mamba_mixer_schema("MambaMixerStep", "(b, w)", "(b, d)", "One position of MambaMixer."),
    _mamba_mixer_schema(
        "QuantizedMambaMixer",
        "(b, l, w)",
        "(b, l, d)",
        "MambaMixer with x_proj / dt_proj stored small, widened in the kernel.",
        quantized=True,
    ),
    _mamba_mixer_schema(
        "QuantizedMambaMixerStep",
        "(b, w)",
        "(b, d)",
        "One position of QuantizedMambaMixer.",
        quantized=True,
    ),
]


def register_schemas(extra: tuple = ()) -> None:
    """Register ``SCHEMAS`` and ``extra`` (schemas defined beside their emitters)."""
    for schema in [*SCHEMAS, *extra]:
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)
