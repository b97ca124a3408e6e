"""Triton kernels for one recurrent step: ``ssmcc::selective_state_update`` (Mamba-1, a state per
channel) and ``ssmcc::ssd_state_update`` (Mamba-2, a state per head and head-dim row).

Math, in float32, for each state row r (a channel c, or a head i's row p) and state index j::

    dt'       = softplus(dt + dt_bias), then clamp(dt', dt_min, dt_max)  (each when requested)
    new[r,j]  = exp(dt' a[r,j]) state[r,j] + dt' x[r] B[j]
    y[r]      = sum_j C[j] new[r,j] + D[r] x[r],   out[r] = y[r] silu(z[r])

Mamba-1: dt, D, bias per channel, ``a = A[c, :]``, B and C each of the channel's group (their
group counts may differ). Mamba-2: dt, A, bias per head (a scalar ``a``), D per head or per
(head, row), B/C of the head's group. One kernel serves both: a program owns ``block_d`` rows of
one (batch, head) — Mamba-1 is the one-head case with per-row dt, A and D — so the state is read
and written once.

``state_indices`` (b,) int32/int64: the state is a pool (slots, ...) and batch row i reads and
writes slot ``state_indices[i]`` in place (negative: a padding row, skipped, its out zeros); the
captured decode (``lowering/triton/pooled_step.py``) calls it so.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2
from ssmcc.kernels.triton.slots import check_pool


@triton.jit
def _state_update_kernel(
    # pointers
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, out_ptr, new_ptr,
    slots_ptr,
    # sizes
    rows, nstate, b_channels_per_group, c_channels_per_group, dt_min, dt_max,
    # strides: state/new (b, h, r, n); x, z, out (b, h, r); dt (b, h, r); A (h, r, n);
    # B, C (b, g, n); D, bias (h, r)
    s_sb, s_sh, s_sr, s_sn, s_xb, s_xh, s_xr, s_tb, s_th, s_tr, s_ah, s_ar, s_an,
    s_bb, s_bg, s_bn, s_cb, s_cg, s_cn, s_dh, s_dr, s_zb, s_zh, s_zr, s_ih, s_ir,
    s_ob, s_oh, s_or, s_nb, s_nh, s_nr, s_nn,
    # meta-parameters
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP_MAX: tl.constexpr,
    SLOTS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    r = tl.program_id(2) * BLOCK_R + tl.arange(0, BLOCK_R)
    j = tl.arange(0, BLOCK_N)
    in_rows = r < rows
    if SLOTS:  # the row's slot of the state pool, in every lane
        slot = tl.load(slots_ptr + b + r * 0)
        mask_r = in_rows & (slot >= 0)
        slot = tl.where(slot >= 0, slot, 0)
    else:
        slot = b + r * 0
        mask_r = in_rows
    mask = mask_r[:, None] & (j[None, :] < nstate)
    channel = h * rows + r  # B/C group of each row: channel // channels per group
    gb = channel // b_channels_per_group
    gc = channel // c_channels_per_group
    x = tl.load(x_ptr + b * s_xb + h * s_xh + r * s_xr, mask=mask_r, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptr + b * s_tb + h * s_th + r * s_tr, mask=mask_r, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt = dt + tl.load(bias_ptr + h * s_ih + r * s_ir, mask=mask_r, other=0.0).to(tl.float32)
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    dt = tl.maximum(dt, dt_min)
    if CLAMP_MAX:
        dt = tl.minimum(dt, dt_max)
    A = tl.load(A_ptr + h * s_ah + r[:, None] * s_ar + j[None, :] * s_an, mask=mask, other=0.0)
    Bv = tl.load(B_ptr + b * s_bb + gb[:, None] * s_bg + j[None, :] * s_bn, mask=mask, other=0.0)
    Cv = tl.load(C_ptr + b * s_cb + gc[:, None] * s_cg + j[None, :] * s_cn, mask=mask, other=0.0)
    old = tl.load(
        state_ptr + slot[:, None] * s_sb + h * s_sh + r[:, None] * s_sr + j[None, :] * s_sn,
        mask=mask, other=0.0,
    ).to(tl.float32)
    new = tl.exp(dt[:, None] * A.to(tl.float32)) * old
    new += (dt * x)[:, None] * Bv.to(tl.float32)
    tl.store(new_ptr + slot[:, None] * s_nb + h * s_nh + r[:, None] * s_nr + j[None, :] * s_nn,
             new, mask=mask)
    y = tl.sum(new * Cv.to(tl.float32), axis=1)
    if HAS_D:
        y += tl.load(D_ptr + h * s_dh + r * s_dr, mask=mask_r, other=0.0).to(tl.float32) * x
    if HAS_Z:
        z = tl.load(z_ptr + b * s_zb + h * s_zh + r * s_zr, mask=mask_r, other=0.0).to(tl.float32)
        y = y * z / (1.0 + tl.exp(-z))
    tl.store(out_ptr + b * s_ob + h * s_oh + r * s_or, tl.where(mask_r, y, 0.0), mask=in_rows)


def _run(state, x, dt, A, B, C, D, z, bias, softplus, dt_min, dt_max, dt_strides, A_strides,
         D_strides, bias_strides, out_dtype, slots=None):
    """state (b, h, r, n), or (slots, h, r, n) with ``slots`` (b,) int32: updated in place; x, z
    (b, h, r); B, C (b, g, n); the per-layout strides given."""
    batch, heads, rows, nstate = x.shape[0], *state.shape[1:]
    config = configs.pick(state.device, configs.STATE_UPDATE_GPU, configs.STATE_UPDATE_CPU)
    block_r = min(config.block_d, next_power_of_2(rows))
    out = torch.empty((batch, heads, rows), dtype=out_dtype or x.dtype, device=x.device)
    if slots is not None:
        new = state
    else:
        new = torch.empty((batch, heads, rows, nstate), dtype=torch.float32, device=x.device)
    if batch == 0:
        return out, new
    grid = (batch, heads, -(-rows // block_r))
    launch(_state_update_kernel, grid)(
        state, x, dt, A, B, C, D if D is not None else A, z if z is not None else x,
        bias if bias is not None else A, out, new, slots if slots is not None else x,
        rows, nstate, heads * rows // B.shape[1], heads * rows // C.shape[1], float(dt_min),
        float(dt_max or 0.0),
        *state.stride(), *x.stride(), *dt_strides, *A_strides, *B.stride(), *C.stride(),
        *D_strides, *(z.stride() if z is not None else (0, 0, 0)), *bias_strides,
        *out.stride(), *new.stride(),
        BLOCK_R=block_r, BLOCK_N=next_power_of_2(nstate), HAS_D=D is not None,
        HAS_Z=z is not None, HAS_BIAS=bias is not None, SOFTPLUS=bool(softplus),
        CLAMP_MAX=dt_max is not None, SLOTS=slots is not None, num_warps=config.num_warps,
    )
    return out, new


@launcher("selective_state_update")
def selective_state_update_fwd(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, out_dtype=None,
    state_indices=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``selective_state_update`` on Triton. state (b, d, n); x, dt, z (b, d); A (d, n); B, C
    (b, n) or (b, g, n); D, dt_bias (d,) -> (out (b, d) dtype of x, new_state (b, d, n) float32).
    The channels are the rows of one head; dt is not clamped (dt_min = -inf). With
    ``state_indices``: state is a (slots, d, n) pool, updated in place and returned."""
    B = B.unsqueeze(1) if B.dim() == 2 else B  # shared: one group
    C = C.unsqueeze(1) if C.dim() == 2 else C
    slots = None
    if state_indices is not None:
        slots = check_pool("selective_state_update", x.shape[0], state_indices, state)
    out, new = _run(
        state.unsqueeze(1), x.unsqueeze(1), dt.unsqueeze(1), A, B, C, D,
        None if z is None else z.unsqueeze(1), dt_bias, dt_softplus, float("-inf"), None,
        (dt.stride(0), 0, dt.stride(1)), (0, *A.stride()),
        (0, D.stride(0)) if D is not None else (0, 0),
        (0, dt_bias.stride(0)) if dt_bias is not None else (0, 0),
        out_dtype, slots,
    )
    return out[:, 0], state if slots is not None else new[:, 0]


@launcher("ssd_state_update")
def ssd_state_update_fwd(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0,
    dt_max=None, out_dtype=None, state_indices=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssd_state_update`` on Triton. state (b, h, p, n); x, z (b, h, p); dt (b, h); A (h,);
    B, C (b, g, n); D (h,) or (h, p); dt_bias (h,) -> (out (b, h, p) dtype of x, new_state
    (b, h, p, n) float32). With ``state_indices``: state is a (slots, h, p, n) pool, updated in
    place and returned."""
    D_strides = (0, 0) if D is None else (D.stride(0), 0) if D.dim() == 1 else tuple(D.stride())
    slots = None
    if state_indices is not None:
        slots = check_pool("ssd_state_update", x.shape[0], state_indices, state)
    return _run(
        state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max,
        (dt.stride(0), dt.stride(1), 0), (A.stride(0), 0, 0), D_strides,
        (dt_bias.stride(0), 0) if dt_bias is not None else (0, 0), out_dtype, slots,
    )
