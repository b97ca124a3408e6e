"""Triton launchers for the fused mixer ops: ``ssmcc::mamba_mixer(_step)`` (Mamba-1) and
``ssmcc::ssd_mixer(_step)`` (Mamba-2), each a chain of this package's kernels.

Math: exactly the ops' references (``ssmcc.ops.mamba_mixer``, ``ssmcc.ops.ssd_mixer``)::

    mamba_mixer  xc = act(conv(x)); dt_r, B, C = xc x_proj^T (rms each with bcdt_rms_eps);
                 dt = dt_r dt_proj^T; y = selective_scan(xc, dt, A, B, C, D, z, dt_bias)
    ssd_mixer    xBC = act(conv(xBC)); y = ssd_scan(x, dt, A, B, C, D, dt_bias, limits);
                 y = rmsnorm_gated(y, z, norm_weight)

Every piece is read where it lies: x, z, xBC and dt are strided views into the projection output
(no copies), the conv writes token-major float32 (what the projections and the scans read), the
scans write the output in the op's layout and dtype. Intermediates stay float32, as in the
references; only the mixer's output is rounded to the projection output's dtype.
"""

from __future__ import annotations

import torch

from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_fwd, causal_conv1d_update_fwd
from ssmcc.kernels.triton.linear import linear_fwd
from ssmcc.kernels.triton.rmsnorm_gated import rmsnorm_gated_fwd
from ssmcc.kernels.triton.selective_scan import selective_scan_fwd
from ssmcc.kernels.triton.ssd_scan import ssd_scan_fwd
from ssmcc.kernels.triton.state_update import selective_state_update_fwd, ssd_state_update_fwd
from ssmcc.ops.mamba_mixer import mamba_mixer_sizes
from ssmcc.ops.ssd_mixer import mixer_pieces, mixer_sizes, split_xbc

F32 = torch.float32


def _projections(
    xc, x_proj_weight, x_proj_scale, dt_proj_weight, dt_proj_scale, rank, state, bcdt_rms_eps
):
    """dt (..., d), B, C (..., n) float32 from the conv output xc (..., d) token-major."""
    proj = linear_fwd(xc, x_proj_weight, x_proj_scale, out_dtype=F32)
    if bcdt_rms_eps is not None:  # FalconMamba: rms of each piece, no weight
        normed = torch.empty_like(proj)
        for start, size in ((0, rank), (rank, state), (rank + state, state)):
            ones = torch.ones(size, dtype=F32, device=proj.device)
            piece = slice(start, start + size)
            rmsnorm_gated_fwd(
                proj[..., piece], None, ones, size, bcdt_rms_eps, out=normed[..., piece]
            )
        proj = normed
    dt_r, B, C = proj.split([rank, state, state], dim=-1)
    return linear_fwd(dt_r, dt_proj_weight, dt_proj_scale, out_dtype=F32), B, C


def mamba_mixer_fwd(
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
    """``mamba_mixer`` on Triton: zx (b, l, w) -> (y (b, l, d), conv_state, ssm_state)."""
    batch, length, _ = zx.shape
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    dim, rank, state = s["channels"], s["rank"], s["state"]
    x = zx[..., x_offset : x_offset + dim].transpose(1, 2)
    z = None if z_offset < 0 else zx[..., z_offset : z_offset + dim].transpose(1, 2)
    xc = torch.empty((batch, length, dim), dtype=F32, device=zx.device)
    _, conv_last = causal_conv1d_fwd(
        x, conv_weight, conv_bias, conv_state, activation, out=xc.transpose(1, 2)
    )
    dt, B, C = _projections(
        xc, x_proj_weight, x_proj_scale, dt_proj_weight, dt_proj_scale, rank, state, bcdt_rms_eps
    )
    y = torch.empty((batch, length, dim), dtype=zx.dtype, device=zx.device)
    _, ssm_last = selective_scan_fwd(
        xc.transpose(1, 2),
        dt.transpose(1, 2),
        A,
        B.transpose(1, 2),
        C.transpose(1, 2),
        D,
        z,
        dt_bias,
        delta_softplus,
        ssm_state,
        out=y.transpose(1, 2),
    )
    return y, conv_last, ssm_last


def mamba_mixer_step_fwd(
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
    """``mamba_mixer_step`` on Triton: zx (b, w) -> (y (b, d), conv_state, ssm_state)."""
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    dim, rank, state = s["channels"], s["rank"], s["state"]
    x = zx[:, x_offset : x_offset + dim]
    z = None if z_offset < 0 else zx[:, z_offset : z_offset + dim]
    xc = torch.empty((zx.shape[0], dim), dtype=F32, device=zx.device)
    _, conv_new = causal_conv1d_update_fwd(
        x, conv_state, conv_weight, conv_bias, activation, out=xc
    )
    dt, B, C = _projections(
        xc, x_proj_weight, x_proj_scale, dt_proj_weight, dt_proj_scale, rank, state, bcdt_rms_eps
    )
    y, ssm_new = selective_state_update_fwd(
        ssm_state, xc, dt, A, B, C, D, z, dt_bias, delta_softplus, out_dtype=zx.dtype
    )
    return y, conv_new, ssm_new


def ssd_mixer_fwd(
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
    """``ssd_mixer`` on Triton: zxbcdt (b, l, w) -> (y (b, l, d), conv_state, ssm_state)."""
    batch, length, _ = zxbcdt.shape
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    inner, device = s["inner"], zxbcdt.device
    z, xbc, dt = mixer_pieces(zxbcdt, s, z_offset, xbc_offset, dt_offset)
    conv = torch.empty((batch, length, s["channels"]), dtype=F32, device=device)
    _, conv_last = causal_conv1d_fwd(
        xbc.transpose(1, 2),
        conv_weight,
        conv_bias,
        conv_state,
        activation,
        out=conv.transpose(1, 2),
    )
    x, B, C = split_xbc(conv, s)
    scanned = torch.empty((batch, length, s["heads"], s["head_dim"]), dtype=F32, device=device)
    _, ssm_last = ssd_scan_fwd(
        x, dt, A, B, C, D, None, dt_bias, dt_softplus, dt_min, dt_max, ssm_state, out=scanned
    )
    y = torch.empty((batch, length, inner), dtype=zxbcdt.dtype, device=device)
    rmsnorm_gated_fwd(
        scanned.view(batch, length, inner),
        z,
        norm_weight,
        norm_group_size,
        eps,
        norm_before_gate,
        out=y,
    )
    return y, conv_last, ssm_last


def ssd_mixer_step_fwd(
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
    """``ssd_mixer_step`` on Triton: zxbcdt (b, w) -> (y (b, d), conv_state, ssm_state)."""
    batch = zxbcdt.shape[0]
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    inner = s["inner"]
    z, xbc, dt = mixer_pieces(zxbcdt, s, z_offset, xbc_offset, dt_offset)
    conv = torch.empty((batch, s["channels"]), dtype=F32, device=zxbcdt.device)
    _, conv_new = causal_conv1d_update_fwd(
        xbc, conv_state, conv_weight, conv_bias, activation, out=conv
    )
    x, B, C = split_xbc(conv, s)
    scanned, ssm_new = ssd_state_update_fwd(
        ssm_state,
        x,
        dt,
        A,
        B,
        C,
        D,
        None,
        dt_bias,
        dt_softplus,
        dt_min,
        dt_max,
    )
    y = torch.empty((batch, inner), dtype=zxbcdt.dtype, device=zxbcdt.device)
    rmsnorm_gated_fwd(
        scanned.view(batch, inner), z, norm_weight, norm_group_size, eps, norm_before_gate, out=y
    )
    return y, conv_new, ssm_new
