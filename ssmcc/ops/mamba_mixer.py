"""``ssmcc::mamba_mixer`` and ``ssmcc::mamba_mixer_step`` — a Mamba-1 mixer between its input and
output projections, fused: causal conv, x_proj, dt_proj and the selective scan in one op.

Shapes (b batch, l length, w projection width, d channels, k conv width, R dt rank, n state)::

    zx             (b, l, w)      the input projection's output, read in place; its last axis
                                  holds x at [x_offset, +d) and the gate z at [z_offset, +d)
                                  (no gate when z_offset < 0)
    conv_weight    (d, k)         conv_bias (d,)?
    x_proj_weight  (R + 2n, d)    dt_proj_weight (d, R)
    x_proj_scale   (R + 2n, Gx)?  dt_proj_scale  (d, Gd)?         (given: that weight stored small)
    A (d, n)   D (d,)?   dt_bias (d,)?   (dt_proj's bias, added inside the scan)
    conv_state     (b, d, k-1)?   ssm_state (b, d, n)?            (absent: zeros)
    -> y           (b, l, d)      dtype of zx, token-major (what the output projection reads)
    -> conv_state  (b, d, k-1)    float32
    -> ssm_state   (b, d, n)      float32

Math: the unfused chain of Hugging Face's Mamba / FalconMamba mixer, in float32::

    xc            = act(causal_conv1d(x^T, conv_weight, conv_bias, conv_state))     (b, d, l)
    dt_r, B, C    = split(xc^T @ x_proj_weight^T, [R, n, n])                         (b, l, .)
    dt_r, B, C    = rms(dt_r), rms(B), rms(C)      only with bcdt_rms_eps (FalconMamba), where
                                                   rms(v) = v / sqrt(mean(v^2) + eps), no weight
    dt            = dt_proj_weight @ dt_r^T                                          (b, d, l)
    y, ssm_state  = selective_scan(xc, dt, A, B^T, C^T, D, z^T, dt_bias, delta_softplus, ssm_state)
    y             = y^T                                                              (b, l, d)

``act`` is the conv's ``activation`` (``ssmcc.ops.activations``: the config's ``hidden_act``);
the scan's gate is silu(z) whatever it is, as Hugging Face's ``mamba_selective_scan`` computes.

A projection weight with a scale is stored small (``ssmcc.ops.quantized_linear``: int8, bfloat16
or float16, ``W[r, c] = weight[r, c] * scale[r, c // (cols / G)]``); ``quantize_weights`` makes
them. The math above reads ``W``.

``mamba_mixer_step`` is the same at one position (``zx`` (b, w) -> ``y`` (b, d)), through
``causal_conv1d_update`` and ``selective_state_update``: the decode-time form.

Why one op: a Mamba-1 layer between its two projections is a conv, two small projections and a
scan, joined by transposes (the conv and scan work channel-first, the projections
token-first), chunks and splits, each a pass over the activation; in decode each is a dispatch
and the layer is ~20 ONNX nodes. Fused, the step program is one op per layer between the two big
matmuls. ``fuse_scan_norm_mlp`` makes it from the unfused ops (rule ``mamba_mixer``).
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
from ssmcc.ops.quantized_linear import check_quantized_weight, dequantize_weight
from ssmcc.ops.selective_scan import selective_scan_ref
from ssmcc.ops.selective_state_update import selective_state_update_ref

OP = "mamba_mixer"


def mamba_mixer_sizes(
    conv_weight: Tensor, x_proj_weight: Tensor, dt_proj_weight: Tensor, A: Tensor
) -> dict:
    """d, k, R, n and the x_proj width R + 2n of a mixer from its weights."""
    return dict(
        channels=conv_weight.shape[0],
        width=conv_weight.shape[1],
        rank=dt_proj_weight.shape[1],
        state=A.shape[1],
        projected=x_proj_weight.shape[0],
    )


def check_mamba_mixer_args(
    op,
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
    conv_state,
    ssm_state,
    time_axis: bool,
    x_proj_scale=None,
    dt_proj_scale=None,
):
    """The shape rules of both ops (``time_axis``: zx is (b, l, w), else (b, w))."""
    rank = 3 if time_axis else 2
    expect_rank(op, "zx", zx, (rank,), "(batch, length, width)" if time_axis else "(batch, width)")
    expect_rank(op, "conv_weight", conv_weight, (2,), "(channels, kernel_width)")
    for name, weight, scale, layout in (
        ("x_proj", x_proj_weight, x_proj_scale, "(dt_rank + 2 * state, channels)"),
        ("dt_proj", dt_proj_weight, dt_proj_scale, "(channels, dt_rank)"),
    ):
        if scale is None:  # a float weight
            expect_rank(op, f"{name}_weight", weight, (2,), layout)
        else:  # stored small: int8 / bfloat16 / float16 (n, k) and its (n, G) scale
            check_quantized_weight(f"{op} ({name}_weight)", weight, scale)
    expect_rank(op, "A", A, (2,), "(channels, state)")
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    d = s["channels"]
    expect(s["width"] >= 1, op, f"conv_weight has kernel width {s['width']}, expected >= 1")
    expect(A.shape[0] == d, op, f"A has {A.shape[0]} rows, expected channels={d}")
    expect(
        x_proj_weight.shape[1] == d and s["projected"] == s["rank"] + 2 * s["state"],
        op,
        f"x_proj_weight is {tuple(x_proj_weight.shape)}, expected (dt_rank + 2 * state, "
        f"channels) = ({s['rank']} + 2 * {s['state']}, {d})",
    )
    expect(
        dt_proj_weight.shape[0] == d,
        op,
        f"dt_proj_weight has {dt_proj_weight.shape[0]} rows, expected channels={d}",
    )
    width = zx.shape[-1]
    spans = [("x", x_offset)] + ([("z", z_offset)] if z_offset >= 0 else [])
    for name, offset in spans:
        expect(
            offset >= 0 and offset + d <= width,
            op,
            f"{name} at [{offset}, {offset + d}) does not fit zx's last axis of {width}",
        )
    for name, vector in (("conv_bias", conv_bias), ("D", D), ("dt_bias", dt_bias)):
        expect_vector(op, name, vector, d, "channels")
    batch = zx.shape[0]
    expect_same_shape(
        op,
        "conv_state",
        conv_state,
        (batch, d, s["width"] - 1),
        "(batch, channels, kernel_width - 1)",
    )
    expect_same_shape(
        op, "ssm_state", ssm_state, (batch, d, s["state"]), "(batch, channels, state)"
    )


def _rms(v: Tensor, eps: float) -> Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def _dense(weight: Tensor, scale: Tensor | None) -> Tensor:
    """A projection's float32 ``W``: the weight, or ``weight * scale`` per group."""
    return weight.float() if scale is None else dequantize_weight(weight, scale)


def _projections(xc: Tensor, x_proj, dt_proj, s: dict, bcdt_rms_eps):
    """(dt (.., d), B (.., n), C (.., n)) from the conv output xc (.., d), token-major;
    ``x_proj`` / ``dt_proj``: (weight, scale or None)."""
    dt_r, B, C = (xc @ _dense(*x_proj).T).split([s["rank"], s["state"], s["state"]], -1)
    if bcdt_rms_eps is not None:
        dt_r, B, C = (_rms(v, bcdt_rms_eps) for v in (dt_r, B, C))
    return dt_r @ _dense(*dt_proj).T, B, C


@dataclasses.dataclass
class MambaMixerArgs:
    """The arguments of ``mamba_mixer`` and ``mamba_mixer_step``, in order (the step takes every
    one, its states required): the one list each backend's binding is checked against when it
    registers (``ssmcc.ops.backends``)."""

    zx: Tensor
    conv_weight: Tensor
    conv_bias: Tensor | None
    x_proj_weight: Tensor
    dt_proj_weight: Tensor
    A: Tensor
    D: Tensor | None
    dt_bias: Tensor | None
    x_offset: int
    z_offset: int
    activation: str | None = "silu"
    delta_softplus: bool = True
    bcdt_rms_eps: float | None = None
    conv_state: Tensor | None = None
    ssm_state: Tensor | None = None
    x_proj_scale: Tensor | None = None
    dt_proj_scale: Tensor | None = None


def mamba_mixer_ref(
    zx: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    x_offset: int,
    z_offset: int,
    activation: str | None = "silu",
    delta_softplus: bool = True,
    bcdt_rms_eps: float | None = None,
    conv_state: Tensor | None = None,
    ssm_state: Tensor | None = None,
    x_proj_scale: Tensor | None = None,
    dt_proj_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: the unfused chain (see the module docstring), in float32."""
    check_mamba_mixer_args(
        OP,
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
        conv_state,
        ssm_state,
        time_axis=True,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    d, proj = s["channels"], zx.float()
    x = proj[..., x_offset : x_offset + d]
    z = None if z_offset < 0 else proj[..., z_offset : z_offset + d]
    xc, conv_last = causal_conv1d_ref(
        x.transpose(1, 2), conv_weight, conv_bias, conv_state, activation
    )
    dt, B, C = _projections(
        xc.transpose(1, 2),
        (x_proj_weight, x_proj_scale),
        (dt_proj_weight, dt_proj_scale),
        s,
        bcdt_rms_eps,
    )
    y, ssm_last = selective_scan_ref(
        xc,
        dt.transpose(1, 2),
        A,
        B.transpose(1, 2),
        C.transpose(1, 2),
        D,
        None if z is None else z.transpose(1, 2),
        dt_bias,
        delta_softplus,
        ssm_state,
    )
    return y.transpose(1, 2).to(zx.dtype), conv_last, ssm_last


def mamba_mixer_step_ref(
    zx: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    x_offset: int,
    z_offset: int,
    activation: str | None,
    delta_softplus: bool,
    bcdt_rms_eps: float | None,
    conv_state: Tensor,
    ssm_state: Tensor,
    x_proj_scale: Tensor | None = None,
    dt_proj_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: ``causal_conv1d_update``, the projections, ``selective_state_update``."""
    check_mamba_mixer_args(
        "mamba_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    d, proj = s["channels"], zx.float()
    x = proj[..., x_offset : x_offset + d]
    z = None if z_offset < 0 else proj[..., z_offset : z_offset + d]
    xc, conv_new = causal_conv1d_update_ref(x, conv_state, conv_weight, conv_bias, activation)
    dt, B, C = _projections(
        xc, (x_proj_weight, x_proj_scale), (dt_proj_weight, dt_proj_scale), s, bcdt_rms_eps
    )
    y, ssm_new = selective_state_update_ref(
        ssm_state, xc, dt, A, B, C, D, z, dt_bias, delta_softplus
    )
    return y.to(zx.dtype), conv_new, ssm_new


@torch.library.custom_op("ssmcc::mamba_mixer", mutates_args=())
def mamba_mixer(
    zx: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    x_offset: int,
    z_offset: int,
    activation: str | None = "silu",
    delta_softplus: bool = True,
    bcdt_rms_eps: float | None = None,
    conv_state: Tensor | None = None,
    ssm_state: Tensor | None = None,
    x_proj_scale: Tensor | None = None,
    dt_proj_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """The fused Mamba-1 mixer; returns ``(y, conv_state, ssm_state)``. See the module docstring."""
    return mamba_mixer_ref(
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


def _outputs(zx, conv_weight, x_proj_weight, dt_proj_weight, A, lead: tuple):
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    batch, d = zx.shape[0], s["channels"]
    return (
        zx.new_empty((*lead, d)),
        zx.new_empty((batch, d, s["width"] - 1), dtype=torch.float32),
        zx.new_empty((batch, d, s["state"]), dtype=torch.float32),
    )


@mamba_mixer.register_fake
def _mamba_mixer_fake(
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
    check_mamba_mixer_args(
        OP,
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
        conv_state,
        ssm_state,
        time_axis=True,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    activation_code(OP, activation)
    return _outputs(zx, conv_weight, x_proj_weight, dt_proj_weight, A, tuple(zx.shape[:2]))


@torch.library.custom_op("ssmcc::mamba_mixer_step", mutates_args=())
def mamba_mixer_step(
    zx: Tensor,
    conv_weight: Tensor,
    conv_bias: Tensor | None,
    x_proj_weight: Tensor,
    dt_proj_weight: Tensor,
    A: Tensor,
    D: Tensor | None,
    dt_bias: Tensor | None,
    x_offset: int,
    z_offset: int,
    activation: str | None,
    delta_softplus: bool,
    bcdt_rms_eps: float | None,
    conv_state: Tensor,
    ssm_state: Tensor,
    x_proj_scale: Tensor | None = None,
    dt_proj_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One position of ``mamba_mixer`` from given states: ``(y (b, d), conv_state, ssm_state)``."""
    return mamba_mixer_step_ref(
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


@mamba_mixer_step.register_fake
def _mamba_mixer_step_fake(
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
    check_mamba_mixer_args(
        "mamba_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    activation_code("mamba_mixer_step", activation)
    return _outputs(zx, conv_weight, x_proj_weight, dt_proj_weight, A, (zx.shape[0],))


def _mixer_step(states, zx, conv_state=None, ssm_state=None, **args):
    """``mamba_mixer`` over one position from ``states``: ``mamba_mixer_step``."""
    y, conv_new, ssm_new = mamba_mixer_step(
        zx[:, 0], conv_state=states[0], ssm_state=states[1], **args
    )
    return y.unsqueeze(1), conv_new, ssm_new


register_state_contract(
    mamba_mixer,
    StateContract(
        slots=(
            StateSlot(
                kind="conv_state",
                arg="conv_state",
                output=1,
                shape=lambda args: (
                    tuple(args["conv_weight"].shape[:1]) + (args["conv_weight"].shape[1] - 1,)
                ),
                dtype=lambda args: torch.float32,
            ),
            StateSlot(
                kind="ssm_state",
                arg="ssm_state",
                output=2,
                shape=lambda args: tuple(args["A"].shape),
                dtype=lambda args: torch.float32,
            ),
        ),
        step=_mixer_step,
        step_op="mamba_mixer_step",
    ),
)

MAMBA_MIXER = define(mamba_mixer, mamba_mixer_ref, MambaMixerArgs)
MAMBA_MIXER_STEP = define(mamba_mixer_step, mamba_mixer_step_ref, MambaMixerArgs)
