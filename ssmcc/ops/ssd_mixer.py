"""``ssmcc::ssd_mixer`` and ``ssmcc::ssd_mixer_step`` — a Mamba-2 mixer between its input and
output projections, fused: depthwise causal conv, SSD scan and gated RMSNorm in one op.

Shapes (b batch, l length, w projection width, h heads, p head dim, d = h p, g groups, n state,
c = d + 2 g n conv channels, k conv width)::

    zxbcdt        (b, l, w)      the input projection's output, read in place; its last axis
                                 holds z at [z_offset, +d) (no gate when z_offset < 0),
                                 xBC at [xbc_offset, +c) and dt at [dt_offset, +h)
    conv_weight   (c, k)         conv_bias (c,)?
    A (h,)   D (h,) or (h, p)?   dt_bias (h,)?   norm_weight (d,)
    conv_state    (b, c, k-1)?   ssm_state (b, h, p, n)?        (absent: zeros)
    -> y          (b, l, d)      dtype of zxbcdt
    -> conv_state (b, c, k-1)    float32, the conv's state after the last position
    -> ssm_state  (b, h, p, n)   float32, the scan's state after the last position

Math: exactly the unfused ops in sequence (``causal_conv1d``, ``ssd_scan``, ``rmsnorm_gated``)::

    xBC          = act(causal_conv1d(zxbcdt[..., xBC]^T, conv_weight, conv_bias, conv_state))^T
    x, B, C      = xBC split into [d, g n, g n]  ->  x (b, l, h, p), B and C (b, l, g, n)
    y, ssm_state = ssd_scan(x, zxbcdt[..., dt], A, B, C, D, None, dt_bias,
                            dt_softplus, dt_min, dt_max, ssm_state)
    y            = rmsnorm_gated(y (b, l, d), zxbcdt[..., z], norm_weight, norm_group_size,
                                 eps, norm_before_gate)

``act`` is the conv's ``activation`` (``ssmcc.ops.activations``: the config's ``hidden_act`` or
``mamba_hidden_act``); the gated norm's gate is silu(z) whatever it is, as in Hugging Face.

The chain runs in float32 from the projection output (intermediates are not rounded to its
dtype, as the unfused ops' outputs are: in bf16/fp16 the fused op is the more exact, within one
rounding of the unfused chain); ``y`` is rounded to zxbcdt's dtype once, at the end.

``ssd_mixer_step`` is the same at one position (``zxbcdt`` (b, w) -> ``y`` (b, d)) from given
states, through ``causal_conv1d_update`` and ``ssd_state_update``: the decode-time form.

Why one op: between its two projections a Mamba-2 layer is a chain of memory-bound steps
(split, transposes to and from the conv's channel-first layout, conv, split, scan, norm) that
each read and write the activation, and in decode each is one more dispatch. Every Hugging Face
Mamba-2 mixer (Mamba2, Bamba, NemotronH, Zamba2, GraniteMoeHybrid, FalconH1) has this structure;
mamba_ssm's ``mamba_split_conv1d_scan_combined`` fuses the same chain. ``fuse_scan_norm_mlp``
makes these ops from the unfused ones (rule ``ssd_mixer``).
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank, expect_same_shape, expect_vector
from ssmcc.ops.activations import activation_code
from ssmcc.ops.causal_conv1d import causal_conv1d_ref, causal_conv1d_update_ref
from ssmcc.ops.contracts import StateContract, StateSlot, register_state_contract
from ssmcc.ops.definition import define
from ssmcc.ops.rmsnorm_gated import rmsnorm_gated_ref
from ssmcc.ops.ssd_scan import ssd_scan_ref
from ssmcc.ops.ssd_state_update import ssd_state_update_ref

OP = "ssd_mixer"


def mixer_sizes(conv_weight: Tensor, A: Tensor, norm_weight: Tensor, groups: int) -> dict:
    """h, p, d, g, n, c, k of a mixer from its weights (see the module docstring)."""
    heads, inner, channels = A.shape[0], norm_weight.shape[0], conv_weight.shape[0]
    return dict(
        heads=heads,
        head_dim=inner // heads,
        inner=inner,
        groups=groups,
        state=(channels - inner) // (2 * groups),
        channels=channels,
        width=conv_weight.shape[1],
    )


def check_ssd_mixer_args(
    op,
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
    conv_state,
    ssm_state,
    time_axis: bool,
):
    """The shape rules of both ops (``time_axis``: zxbcdt is (b, l, w), else (b, w))."""
    rank = 3 if time_axis else 2
    layout = "(batch, length, width)" if time_axis else "(batch, width)"
    expect_rank(op, "zxbcdt", zxbcdt, (rank,), layout)
    expect_rank(op, "conv_weight", conv_weight, (2,), "(channels, kernel_width)")
    expect_rank(op, "A", A, (1,), "(heads,)")
    expect_rank(op, "norm_weight", norm_weight, (1,), "(inner,)")
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    heads, inner, channels = s["heads"], s["inner"], s["channels"]
    expect(
        groups >= 1 and heads % groups == 0, op, f"groups={groups} does not divide heads={heads}"
    )
    expect(
        inner % heads == 0, op, f"norm_weight has {inner} entries, not a multiple of heads={heads}"
    )
    expect(
        channels > inner and (channels - inner) % (2 * groups) == 0,
        op,
        f"conv_weight has {channels} channels; expected inner + 2 * groups * state with "
        f"inner={inner}, groups={groups}",
    )
    expect(s["width"] >= 1, op, f"conv_weight has kernel width {s['width']}, expected >= 1")
    width = zxbcdt.shape[-1]
    spans = [("xBC", xbc_offset, channels), ("dt", dt_offset, heads)]
    if z_offset >= 0:
        spans.append(("z", z_offset, inner))
    for name, offset, size in spans:
        expect(
            offset >= 0 and offset + size <= width,
            op,
            f"{name} at [{offset}, {offset + size}) does not fit zxbcdt's last axis of {width}",
        )
    expect_vector(op, "conv_bias", conv_bias, channels, "channels")
    expect_vector(op, "dt_bias", dt_bias, heads, "heads")
    if D is not None:
        expect_rank(op, "D", D, (1, 2), "(heads,) or (heads, head_dim)")
        want = (heads,) if D.dim() == 1 else (heads, s["head_dim"])
        expect_same_shape(op, "D", D, want, "(heads,) or (heads, head_dim)")
    expect(
        norm_group_size >= 1 and inner % norm_group_size == 0,
        op,
        f"norm_group_size {norm_group_size} does not divide inner={inner}",
    )
    batch = zxbcdt.shape[0]
    expect_same_shape(
        op,
        "conv_state",
        conv_state,
        (batch, channels, s["width"] - 1),
        "(batch, channels, kernel_width - 1)",
    )
    expect_same_shape(
        op,
        "ssm_state",
        ssm_state,
        (batch, heads, s["head_dim"], s["state"]),
        "(batch, heads, head_dim, state)",
    )


def mixer_pieces(zxbcdt: Tensor, s: dict, z_offset: int, xbc_offset: int, dt_offset: int):
    """(z or None, xBC, dt) as slices of the last axis."""
    z = None if z_offset < 0 else zxbcdt[..., z_offset : z_offset + s["inner"]]
    xbc = zxbcdt[..., xbc_offset : xbc_offset + s["channels"]]
    return z, xbc, zxbcdt[..., dt_offset : dt_offset + s["heads"]]


def split_xbc(xbc: Tensor, s: dict):
    """x (..., h, p), B and C (..., g, n) of the conv's output (..., c)."""
    gn = s["groups"] * s["state"]
    x, B, C = xbc.split([s["inner"], gn, gn], dim=-1)
    lead = xbc.shape[:-1]
    return (
        x.reshape(*lead, s["heads"], s["head_dim"]),
        B.reshape(*lead, s["groups"], s["state"]),
        C.reshape(*lead, s["groups"], s["state"]),
    )


@dataclasses.dataclass
class SsdMixerArgs:
    """The arguments of ``ssd_mixer`` and ``ssd_mixer_step``, in order (the step takes every one,
    its states required): the one list each backend's binding is checked against when it
    registers (``ssmcc.ops.backends``)."""

    zxbcdt: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    A: Tensor
    D: Tensor | None
    dt_bias: Tensor | None
    norm_weight: Tensor
    groups: int
    z_offset: int
    xbc_offset: int
    dt_offset: int
    norm_group_size: int
    eps: float = 1e-6
    norm_before_gate: bool = False
    activation: str | None = "silu"
    dt_softplus: bool = True
    dt_min: float = 0.0
    dt_max: float | None = None
    conv_state: Tensor | None = None
    ssm_state: Tensor | None = None


def ssd_mixer_ref(
    zxbcdt: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    norm_weight: Tensor,
    groups: int,
    z_offset: int,
    xbc_offset: int,
    dt_offset: int,
    norm_group_size: int,
    eps: float = 1e-6,
    norm_before_gate: bool = False,
    activation: str | None = "silu",
    dt_softplus: bool = True,
    dt_min: float = 0.0,
    dt_max: float | None = None,
    conv_state: Tensor | None = None,
    ssm_state: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: the unfused ops' references in sequence (see the module docstring)."""
    check_ssd_mixer_args(
        OP,
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
        conv_state,
        ssm_state,
        time_axis=True,
    )
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    z, xbc, dt = mixer_pieces(zxbcdt.float(), s, z_offset, xbc_offset, dt_offset)
    conv_out, conv_last = causal_conv1d_ref(
        xbc.transpose(1, 2), conv_weight, conv_bias, conv_state, activation
    )
    x, B, C = split_xbc(conv_out.transpose(1, 2), s)
    y, ssm_last = ssd_scan_ref(
        x, dt, A, B, C, D, None, dt_bias, dt_softplus, dt_min, dt_max, ssm_state
    )
    y = y.reshape(*y.shape[:2], s["inner"])
    y = rmsnorm_gated_ref(y, z, norm_weight, norm_group_size, eps, norm_before_gate)
    return y.to(zxbcdt.dtype), conv_last, ssm_last


def ssd_mixer_step_ref(
    zxbcdt: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    norm_weight: Tensor,
    groups: int,
    z_offset: int,
    xbc_offset: int,
    dt_offset: int,
    norm_group_size: int,
    eps: float,
    norm_before_gate: bool,
    activation: str | None,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float | None,
    conv_state: Tensor,
    ssm_state: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: ``causal_conv1d_update``, ``ssd_state_update``, ``rmsnorm_gated``."""
    check_ssd_mixer_args(
        "ssd_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
    )
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    z, xbc, dt = mixer_pieces(zxbcdt.float(), s, z_offset, xbc_offset, dt_offset)
    conv_out, conv_new = causal_conv1d_update_ref(
        xbc, conv_state, conv_weight, conv_bias, activation
    )
    x, B, C = split_xbc(conv_out, s)
    y, ssm_new = ssd_state_update_ref(
        ssm_state, x, dt, A, B, C, D, None, dt_bias, dt_softplus, dt_min, dt_max
    )
    y = rmsnorm_gated_ref(
        y.reshape(y.shape[0], s["inner"]), z, norm_weight, norm_group_size, eps, norm_before_gate
    )
    return y.to(zxbcdt.dtype), conv_new, ssm_new


@torch.library.custom_op("ssmcc::ssd_mixer", mutates_args=())
def ssd_mixer(
    zxbcdt: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    norm_weight: Tensor,
    groups: int,
    z_offset: int,
    xbc_offset: int,
    dt_offset: int,
    norm_group_size: int,
    eps: float = 1e-6,
    norm_before_gate: bool = False,
    activation: str | None = "silu",
    dt_softplus: bool = True,
    dt_min: float = 0.0,
    dt_max: float | None = None,
    conv_state: Tensor | None = None,
    ssm_state: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The fused Mamba-2 mixer; returns ``(y, conv_state, ssm_state)``. See the module docstring."""
    return ssd_mixer_ref(
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
    )


def _output_shapes(zxbcdt, conv_weight, A, norm_weight, groups, lead: tuple):
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    batch = zxbcdt.shape[0]
    return (
        zxbcdt.new_empty((*lead, s["inner"])),
        zxbcdt.new_empty((batch, s["channels"], s["width"] - 1), dtype=torch.float32),
        zxbcdt.new_empty((batch, s["heads"], s["head_dim"], s["state"]), dtype=torch.float32),
    )


@ssd_mixer.register_fake
def _ssd_mixer_fake(
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
    check_ssd_mixer_args(
        OP,
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
        conv_state,
        ssm_state,
        time_axis=True,
    )
    activation_code(OP, activation)
    return _output_shapes(zxbcdt, conv_weight, A, norm_weight, groups, tuple(zxbcdt.shape[:2]))


@torch.library.custom_op("ssmcc::ssd_mixer_step", mutates_args=())
def ssd_mixer_step(
    zxbcdt: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    norm_weight: Tensor,
    groups: int,
    z_offset: int,
    xbc_offset: int,
    dt_offset: int,
    norm_group_size: int,
    eps: float,
    norm_before_gate: bool,
    activation: str | None,
    dt_softplus: bool,
    dt_min: float,
    dt_max: float | None,
    conv_state: Tensor,
    ssm_state: Tensor,
) -> tuple[Tensor, Tensor, Tensor]:
    """One position of ``ssd_mixer`` from given states: ``(y (b, d), conv_state, ssm_state)``."""
    return ssd_mixer_step_ref(
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
    )


@ssd_mixer_step.register_fake
def _ssd_mixer_step_fake(
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
    check_ssd_mixer_args(
        "ssd_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
    )
    activation_code("ssd_mixer_step", activation)
    return _output_shapes(zxbcdt, conv_weight, A, norm_weight, groups, (zxbcdt.shape[0],))


def _mixer_step(states, zxbcdt, conv_state=None, ssm_state=None, **args):
    """``ssd_mixer`` over one position from ``states``: ``ssd_mixer_step``."""
    y, conv_new, ssm_new = ssd_mixer_step(
        zxbcdt[:, 0], conv_state=states[0], ssm_state=states[1], **args
    )
    return y.unsqueeze(1), conv_new, ssm_new


def _sizes(args: dict) -> dict:
    return mixer_sizes(args["conv_weight"], args["A"], args["norm_weight"], args["groups"])


register_state_contract(
    ssd_mixer,
    StateContract(
        slots=(
            StateSlot(
                kind="conv_state",
                arg="conv_state",
                output=1,
                shape=lambda args: (_sizes(args)["channels"], _sizes(args)["width"] - 1),
                dtype=lambda args: torch.float32,
            ),
            StateSlot(
                kind="ssm_state",
                arg="ssm_state",
                output=2,
                shape=lambda args: tuple(_sizes(args)[k] for k in ("heads", "head_dim", "state")),
                dtype=lambda args: torch.float32,
            ),
        ),
        step=_mixer_step,
        step_op="ssd_mixer_step",
    ),
)

SSD_MIXER = define(ssd_mixer, ssd_mixer_ref, SsdMixerArgs)
SSD_MIXER_STEP = define(ssd_mixer_step, ssd_mixer_step_ref, SsdMixerArgs)
