"""ONNX emitters for the ssmcc ops: one ``ssmcc``-domain node per op.

Each emitter is a torch.onnx translation function (traced by onnxscript): it normalises the op's
arguments to the fixed-arity ONNX form of ``schemas.py`` — zeros for absent ``D``, ``delta_bias``,
``bias`` and states, B/C as (b, g, n, l) with one group count (``_common_groups``),
``has_z``/``activation`` attributes — and emits exactly one custom node. Each registers itself
against its op (``registration.onnx_emitter``: its node's schema checked against the op's
arguments at import); ``ONNX_TABLE`` (op name -> emitter) reads the registrations, these and
the standard-op emitters of ``emitters_standard.py`` and ``quantized.py``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import onnx
import onnxscript
from onnx import helper
from onnxscript import opset18 as op

import ssmcc.lowering.onnx.emitters_standard  # noqa: F401 (registers its emitters)
import ssmcc.lowering.onnx.quantized  # noqa: F401 (registers its emitters)
from ssmcc.lowering.onnx.registration import BACKEND, onnx_emitter
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION
from ssmcc.lowering.table import Emitter
from ssmcc.ops.activations import activation_code
from ssmcc.ops.backends import description, implementations

SSMCC = onnxscript.values.Opset(DOMAIN, VERSION)
# The fused Mamba-1 mixer's arguments its node carries under other names or in another node
MAMBA_ELSEWHERE = {
    "bcdt_rms_eps": "the rms_eps attribute (has_rms marks it set)",
    "x_proj_scale": "the QuantizedMambaMixer(Step) node",
    "dt_proj_scale": "the QuantizedMambaMixer(Step) node",
}
_ZERO = helper.make_tensor("value", onnx.TensorProto.FLOAT, [1], [0.0])


def _zeros(*dims):
    """Float zeros of a shape given as 1-element int64 tensors."""
    return op.ConstantOfShape(op.Concat(*dims, axis=0), value=_ZERO)


def _dim(tensor, axis: int):
    return op.Shape(tensor, start=axis, end=axis + 1)


def _groups(tensor, grouped_rank: int):
    """The group count of B or C: 1 when shared (rank ``grouped_rank - 1``), else dim 1 (an int,
    or a symbolic dim when the program left it dynamic)."""
    return 1 if len(tensor.shape) == grouped_rank - 1 else tensor.shape[1]


def _regroup(tensor, groups, target):
    """Grouped B or C (b, g, n, ...) as ``target`` groups, a multiple of ``groups`` (both 1-element
    int64 tensors): each group repeated target / g times, so channel c still reads the group
    c // (d / g)."""
    batch, rest = op.Shape(tensor, start=0, end=1), op.Shape(tensor, start=2)
    spread = op.Unsqueeze(tensor, [2])  # (b, g, 1, n, ...)
    repeated = op.Expand(spread, op.Concat(batch, groups, op.Div(target, groups), rest, axis=0))
    return op.Reshape(repeated, op.Concat(batch, target, rest, axis=0))


def _common_groups(B, C, A, grouped_rank: int):
    """B and C as (b, g, n, ...) with one group count g, as the ssmcc ONNX ops take them.

    The same count (or the same symbolic dim): kept. Two static counts: their least common
    multiple (it divides d, as both do). Otherwise one group per channel (d, from A (d, n)).
    So B and C may be grouped independently in the IR."""
    groups_b, groups_c = _groups(B, grouped_rank), _groups(C, grouped_rank)
    B, C = (op.Unsqueeze(t, [1]) if len(t.shape) == grouped_rank - 1 else t for t in (B, C))
    if groups_b == groups_c:
        return B, C
    if isinstance(groups_b, int) and isinstance(groups_c, int):
        target = op.Constant(value_ints=[math.lcm(groups_b, groups_c)])
    else:
        target = _dim(A, 0)
    return _regroup(B, _dim(B, 1), target), _regroup(C, _dim(C, 1), target)


@onnx_emitter(
    "selective_scan",
    "ssmcc.SelectiveScan node + portable Scan body",
    node="SelectiveScan",
)
def emit_selective_scan(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    if D is None:
        D = _zeros(_dim(A, 0))
    if delta_bias is None:
        delta_bias = _zeros(_dim(A, 0))
    if initial_state is None:
        initial_state = _zeros(_dim(u, 0), _dim(u, 1), _dim(A, 1))
    has_z = z is not None
    B, C = _common_groups(B, C, A, grouped_rank=4)
    return SSMCC.SelectiveScan(
        u,
        delta,
        A,
        B,
        C,
        D,
        z if has_z else u,
        delta_bias,
        initial_state,
        delta_softplus=int(bool(delta_softplus)),
        has_z=int(has_z),
        _outputs=2,
    )


@onnx_emitter(
    "causal_conv1d",
    "ssmcc.CausalConv1d node + portable body",
    node="CausalConv1d",
)
def emit_causal_conv1d(x, weight, bias=None, initial_state=None, activation=None):
    if bias is None:
        bias = _zeros(_dim(weight, 0))
    if initial_state is None:
        width_minus_one = op.Sub(_dim(weight, 1), op.Constant(value_ints=[1]))
        initial_state = _zeros(_dim(x, 0), _dim(x, 1), width_minus_one)
    return SSMCC.CausalConv1d(
        x,
        weight,
        bias,
        initial_state,
        activation=activation_code("causal_conv1d", activation),
        _outputs=2,
    )


@onnx_emitter(
    "selective_state_update",
    "ssmcc.SelectiveStateUpdate node + portable body",
    node="SelectiveStateUpdate",
)
def emit_selective_state_update(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False
):
    if D is None:
        D = _zeros(_dim(A, 0))
    if dt_bias is None:
        dt_bias = _zeros(_dim(A, 0))
    has_z = z is not None
    B, C = _common_groups(B, C, A, grouped_rank=3)
    return SSMCC.SelectiveStateUpdate(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z if has_z else x,
        dt_bias,
        dt_softplus=int(bool(dt_softplus)),
        has_z=int(has_z),
        _outputs=2,
    )


@onnx_emitter(
    "causal_conv1d_update",
    "ssmcc.CausalConv1dUpdate node + portable body",
    node="CausalConv1dUpdate",
)
def emit_causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
    if bias is None:
        bias = _zeros(_dim(weight, 0))
    return SSMCC.CausalConv1dUpdate(
        x,
        conv_state,
        weight,
        bias,
        activation=activation_code("causal_conv1d_update", activation),
        _outputs=2,
    )


def _per_head_D(D, heads, head_dim):
    """D as the (h, p) the ONNX ops take: zeros when absent, (h,) repeated over p."""
    if D is None:
        return _zeros(heads, head_dim)
    if len(D.shape) == 1:
        return op.Expand(op.Unsqueeze(D, [1]), op.Concat(heads, head_dim, axis=0))
    return D


@onnx_emitter(
    "ssd_scan",
    "ssmcc.SsdScan node + portable Scan body",
    node="SsdScan",
)
def emit_ssd_scan(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
    initial_state=None,
):
    heads, head_dim = _dim(x, 2), _dim(x, 3)
    if dt_bias is None:
        dt_bias = _zeros(heads)
    if initial_state is None:
        initial_state = _zeros(_dim(x, 0), heads, head_dim, _dim(B, 3))
    has_z = z is not None
    return SSMCC.SsdScan(
        x,
        dt,
        A,
        B,
        C,
        _per_head_D(D, heads, head_dim),
        z if has_z else x,
        dt_bias,
        initial_state,
        dt_softplus=int(bool(dt_softplus)),
        has_z=int(has_z),
        dt_min=float(dt_min),
        dt_max=math.inf if dt_max is None else float(dt_max),
        _outputs=2,
    )


@onnx_emitter(
    "ssd_state_update",
    "ssmcc.SsdStateUpdate node + portable body",
    node="SsdStateUpdate",
)
def emit_ssd_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
):
    heads, head_dim = _dim(x, 1), _dim(x, 2)
    if dt_bias is None:
        dt_bias = _zeros(heads)
    has_z = z is not None
    return SSMCC.SsdStateUpdate(
        state,
        x,
        dt,
        A,
        B,
        C,
        _per_head_D(D, heads, head_dim),
        z if has_z else x,
        dt_bias,
        dt_softplus=int(bool(dt_softplus)),
        has_z=int(has_z),
        dt_min=float(dt_min),
        dt_max=math.inf if dt_max is None else float(dt_max),
        _outputs=2,
    )


@onnx_emitter(
    "rmsnorm_gated",
    "ssmcc.RmsNormGated node + portable body",
    node="RmsNormGated",
)
def emit_rmsnorm_gated(x, z, weight, group_size, eps=1e-6, norm_before_gate=False):
    has_z = z is not None
    return SSMCC.RmsNormGated(
        x,
        z if has_z else x,
        weight,
        group_size=int(group_size),
        eps=float(eps),
        norm_before_gate=int(bool(norm_before_gate)),
        has_z=int(has_z),
    )


def _mixer_inputs(zxbcdt, conv_weight, conv_bias, A, D, dt_bias, groups, conv_state, ssm_state):
    """Zeros for the absent inputs; D as (h, p). Weight shapes are static."""
    channels, width = conv_weight.shape
    heads, batch = A.shape[0], _dim(zxbcdt, 0)
    constant = lambda v: op.Constant(value_ints=[int(v)])  # noqa: E731
    if conv_bias is None:
        conv_bias = _zeros(constant(channels))
    if dt_bias is None:
        dt_bias = _zeros(constant(heads))
    return conv_bias, dt_bias, constant, batch, channels, width, heads


def _mixer_attributes(
    groups,
    z_offset,
    xbc_offset,
    dt_offset,
    norm_group_size,
    eps,
    norm_before_gate,
    activation,
    dt_softplus,
    dt_min,
    dt_max,
) -> dict:
    return dict(
        groups=int(groups),
        z_offset=max(int(z_offset), 0),
        has_z=int(z_offset >= 0),
        xbc_offset=int(xbc_offset),
        dt_offset=int(dt_offset),
        norm_group_size=int(norm_group_size),
        eps=float(eps),
        norm_before_gate=int(bool(norm_before_gate)),
        activation=activation_code("ssd_mixer", activation),
        dt_softplus=int(bool(dt_softplus)),
        dt_min=float(dt_min),
        dt_max=math.inf if dt_max is None else float(dt_max),
        _outputs=3,
    )


@onnx_emitter(
    "ssd_mixer",
    "ssmcc.SsdMixer node + portable body of the ops it fuses",
    node="SsdMixer",
)
def emit_ssd_mixer(
    zxbcdt,
    conv_weight,
    conv_bias,
    A,
    D,
    dt_bias,
    norm_weight,
    groups,
    z_offset,
    xbc_offset,
    dt_offset,
    norm_group_size,
    eps=1e-6,
    norm_before_gate=False,
    activation="silu",
    dt_softplus=True,
    dt_min=0.0,
    dt_max=None,
    conv_state=None,
    ssm_state=None,
):
    conv_bias, dt_bias, constant, batch, channels, width, heads = _mixer_inputs(
        zxbcdt, conv_weight, conv_bias, A, D, dt_bias, groups, conv_state, ssm_state
    )
    inner = norm_weight.shape[0]
    head_dim, state = inner // heads, (channels - inner) // (2 * groups)
    if conv_state is None:
        conv_state = _zeros(batch, constant(channels), constant(width - 1))
    if ssm_state is None:
        ssm_state = _zeros(batch, constant(heads), constant(head_dim), constant(state))
    return SSMCC.SsdMixer(
        zxbcdt,
        conv_weight,
        conv_bias,
        A,
        _per_head_D(D, constant(heads), constant(head_dim)),
        dt_bias,
        norm_weight,
        conv_state,
        ssm_state,
        **_mixer_attributes(
            groups,
            z_offset,
            xbc_offset,
            dt_offset,
            norm_group_size,
            eps,
            norm_before_gate,
            activation,
            dt_softplus,
            dt_min,
            dt_max,
        ),
    )


@onnx_emitter(
    "ssd_mixer_step",
    "ssmcc.SsdMixerStep node + portable body of the ops it fuses",
    node="SsdMixerStep",
)
def emit_ssd_mixer_step(
    zxbcdt,
    conv_weight,
    conv_bias,
    A,
    D,
    dt_bias,
    norm_weight,
    groups,
    z_offset,
    xbc_offset,
    dt_offset,
    norm_group_size,
    eps,
    norm_before_gate,
    activation,
    dt_softplus,
    dt_min,
    dt_max,
    conv_state,
    ssm_state,
):
    conv_bias, dt_bias, constant, _, _, _, heads = _mixer_inputs(
        zxbcdt, conv_weight, conv_bias, A, D, dt_bias, groups, conv_state, ssm_state
    )
    head_dim = norm_weight.shape[0] // heads
    return SSMCC.SsdMixerStep(
        zxbcdt,
        conv_weight,
        conv_bias,
        A,
        _per_head_D(D, constant(heads), constant(head_dim)),
        dt_bias,
        norm_weight,
        conv_state,
        ssm_state,
        **_mixer_attributes(
            groups,
            z_offset,
            xbc_offset,
            dt_offset,
            norm_group_size,
            eps,
            norm_before_gate,
            activation,
            dt_softplus,
            dt_min,
            dt_max,
        ),
    )


def _mamba_mixer_node(
    node,
    zx,
    conv_weight,
    conv_bias,
    x_proj_weight,
    dt_proj_weight,
    A,
    D,
    dt_bias,
    x_offset,
    z_offset,
    activation,
    delta_softplus,
    bcdt_rms_eps,
    conv_state,
    ssm_state,
    x_proj_scale=None,
    dt_proj_scale=None,
):
    """``node`` (MambaMixer or MambaMixerStep), or its quantized form ``quantized`` when both
    projections have scales; one projection stored small alone is widened by ``ssmcc.Widen``
    before a float node (quantize_weights stores both or, when another op reads one, neither)."""
    node, quantized = node
    channels, width = conv_weight.shape
    state, batch = A.shape[1], _dim(zx, 0)
    constant = lambda v: op.Constant(value_ints=[int(v)])  # noqa: E731
    zeros = lambda *dims: _zeros(*(constant(v) if isinstance(v, int) else v for v in dims))  # noqa: E731
    if conv_state is None:
        conv_state = zeros(batch, channels, width - 1)
    if ssm_state is None:
        ssm_state = zeros(batch, channels, state)
    scales = []
    if x_proj_scale is not None and dt_proj_scale is not None:
        node, scales = quantized, [x_proj_scale, dt_proj_scale]
    else:
        if x_proj_scale is not None:
            x_proj_weight = SSMCC.Widen(x_proj_weight, x_proj_scale)
        if dt_proj_scale is not None:
            dt_proj_weight = SSMCC.Widen(dt_proj_weight, dt_proj_scale)
    return node(
        zx,
        conv_weight,
        zeros(channels) if conv_bias is None else conv_bias,
        x_proj_weight,
        dt_proj_weight,
        A,
        zeros(channels) if D is None else D,
        zeros(channels) if dt_bias is None else dt_bias,
        conv_state,
        ssm_state,
        *scales,
        x_offset=int(x_offset),
        z_offset=max(int(z_offset), 0),
        has_z=int(z_offset >= 0),
        activation=activation_code("mamba_mixer", activation),
        delta_softplus=int(bool(delta_softplus)),
        has_rms=int(bcdt_rms_eps is not None),
        rms_eps=float(bcdt_rms_eps or 0.0),
        _outputs=3,
    )


@onnx_emitter(
    "mamba_mixer",
    "ssmcc.MambaMixer node + portable body of the ops it fuses",
    node="MambaMixer", elsewhere=MAMBA_ELSEWHERE,
)
def emit_mamba_mixer(
    zx,
    conv_weight,
    conv_bias,
    x_proj_weight,
    dt_proj_weight,
    A,
    D,
    dt_bias,
    x_offset,
    z_offset,
    activation="silu",
    delta_softplus=True,
    bcdt_rms_eps=None,
    conv_state=None,
    ssm_state=None,
    x_proj_scale=None,
    dt_proj_scale=None,
):
    return _mamba_mixer_node(
        (SSMCC.MambaMixer, SSMCC.QuantizedMambaMixer),
        zx,
        conv_weight,
        conv_bias,
        x_proj_weight,
        dt_proj_weight,
        A,
        D,
        dt_bias,
        x_offset,
        z_offset,
        activation,
        delta_softplus,
        bcdt_rms_eps,
        conv_state,
        ssm_state,
        x_proj_scale,
        dt_proj_scale,
    )


@onnx_emitter(
    "mamba_mixer_step",
    "ssmcc.MambaMixerStep node + portable body of the ops it fuses",
    node="MambaMixerStep", elsewhere=MAMBA_ELSEWHERE,
)
def emit_mamba_mixer_step(
    zx,
    conv_weight,
    conv_bias,
    x_proj_weight,
    dt_proj_weight,
    A,
    D,
    dt_bias,
    x_offset,
    z_offset,
    activation,
    delta_softplus,
    bcdt_rms_eps,
    conv_state,
    ssm_state,
    x_proj_scale=None,
    dt_proj_scale=None,
):
    return _mamba_mixer_node(
        (SSMCC.MambaMixerStep, SSMCC.QuantizedMambaMixerStep),
        zx,
        conv_weight,
        conv_bias,
        x_proj_weight,
        dt_proj_weight,
        A,
        D,
        dt_bias,
        x_offset,
        z_offset,
        activation,
        delta_softplus,
        bcdt_rms_eps,
        conv_state,
        ssm_state,
        x_proj_scale,
        dt_proj_scale,
    )


class _Table(Mapping):
    """op name -> ``Emitter`` (description, emit function), read from the registrations."""

    def __getitem__(self, name: str) -> Emitter:
        return Emitter(description(BACKEND, name), implementations(BACKEND)[name])

    def __iter__(self):
        return iter(implementations(BACKEND))

    def __len__(self) -> int:
        return len(implementations(BACKEND))


ONNX_TABLE = _Table()
ONNX_UNSUPPORTED: dict[str, str] = {}
