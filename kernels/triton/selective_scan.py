"""Triton kernels for ``ssmcc::selective_scan`` — the Mamba-1 selective scan.

Math (``ssmcc.ops.selective_scan``), per batch row, channel c and state index i, in float32::

    dt_t      = softplus(delta_t + delta_bias)            (each only when requested)
    h_t[c,i]  = exp(dt_t[c] A[c,i]) h_{t-1}[c,i] + dt_t[c] B_t[i] u_t[c]
    y_t[c]    = sum_i C_t[i] h_t[c,i] + D[c] u_t[c],   out_t = y_t * silu(z_t)

Parallel over (batch, channel blocks, chunks of the sequence). A program holds its (block_d, n)
state in registers and walks one chunk. With one chunk that is the whole scan. With several, the
recurrence is split where it is linear: over a chunk ``[t0, t1)`` started from zeros it ends in
``S`` while the state it was given decays by ``exp(A[c,i] * sum_t dt_t[c])``; so

    pass 1  every chunk from zeros: S_k and the chunk's dt sum        (parallel over chunks)
    pass 2  h_in[0] = h_{-1};  h_in[k+1] = exp(A * dtsum_k) h_in[k] + S_k   (sequential, small)
    pass 3  every chunk from h_in[k], writing the outputs             (parallel over chunks)

Pass 2 also writes ``last_state = h_in[K]``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs
from ssmcc.kernels.triton.runtime import launch, next_power_of_2


@triton.jit
def _selective_scan_chunk_kernel(
    # pointers
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,
    out_ptr, hend_ptr, dtsum_ptr,
    # sizes
    dim, length, chunk_len, b_channels_per_group, c_channels_per_group, state,
    # strides
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an,
    s_bb, s_bg, s_bn, s_bl, s_cb, s_cg, s_cn, s_cl, s_zb, s_zd, s_zl,
    s_hb, s_hk, s_hd, s_hn, s_ob, s_od, s_ol, s_eb, s_ek, s_ed, s_en, s_tb, s_tk, s_td,
    # meta-parameters
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr, HAS_H0: tl.constexpr,
    WRITE_OUT: tl.constexpr, WRITE_STATE: tl.constexpr,
):
    b = tl.program_id(0)
    k = tl.program_id(2)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask_dn = mask_d[:, None] & (n[None, :] < state)
    A = tl.load(A_ptr + d[:, None] * s_ad + n[None, :] * s_an, mask=mask_dn, other=0.0)
    A = A.to(tl.float32)
    gb = d // b_channels_per_group  # B's and C's group of each channel
    gc = d // c_channels_per_group
    if HAS_H0:
        h = tl.load(
            h0_ptr + b * s_hb + k * s_hk + d[:, None] * s_hd + n[None, :] * s_hn,
            mask=mask_dn, other=0.0,
        ).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    dtsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    t0 = k * chunk_len
    t1 = tl.minimum(t0 + chunk_len, length)
    for t in range(t0, t1):
        u = tl.load(u_ptr + b * s_ub + d * s_ud + t * s_ul, mask=mask_d, other=0.0).to(tl.float32)
        dt = tl.load(delta_ptr + b * s_db + d * s_dd + t * s_dl, mask=mask_d, other=0.0)
        dt = dt.to(tl.float32)
        if HAS_BIAS:
            dt = dt + bias
        if SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        Bt = tl.load(
            B_ptr + b * s_bb + gb[:, None] * s_bg + n[None, :] * s_bn + t * s_bl,
            mask=mask_dn, other=0.0,
        ).to(tl.float32)
        h = tl.exp(dt[:, None] * A) * h + (dt * u)[:, None] * Bt
        if WRITE_OUT:
            Ct = tl.load(
                C_ptr + b * s_cb + gc[:, None] * s_cg + n[None, :] * s_cn + t * s_cl,
                mask=mask_dn, other=0.0,
            ).to(tl.float32)
            y = tl.sum(h * Ct, axis=1)
            if HAS_D:
                y = y + skip * u
            if HAS_Z:
                z = tl.load(z_ptr + b * s_zb + d * s_zd + t * s_zl, mask=mask_d, other=0.0)
                z = z.to(tl.float32)
                y = y * z / (1.0 + tl.exp(-z))
            tl.store(out_ptr + b * s_ob + d * s_od + t * s_ol, y, mask=mask_d)
        else:
            dtsum += dt
    if WRITE_STATE:
        tl.store(
            hend_ptr + b * s_eb + k * s_ek + d[:, None] * s_ed + n[None, :] * s_en, h,
            mask=mask_dn,
        )
    if not WRITE_OUT:
        tl.store(dtsum_ptr + b * s_tb + k * s_tk + d * s_td, dtsum, mask=mask_d)


@triton.jit
def _selective_scan_pass_states_kernel(
    ends_ptr, dtsum_ptr, A_ptr, h0_ptr, starts_ptr, last_ptr,
    dim, state, chunks,
    s_eb, s_ek, s_ed, s_en, s_tb, s_tk, s_td, s_ad, s_an, s_hb, s_hd, s_hn,
    s_sb, s_sk, s_sd, s_sn, s_lb, s_ld, s_ln,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_H0: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask_dn = mask_d[:, None] & (n[None, :] < state)
    A = tl.load(A_ptr + d[:, None] * s_ad + n[None, :] * s_an, mask=mask_dn, other=0.0)
    A = A.to(tl.float32)
    if HAS_H0:
        h = tl.load(
            h0_ptr + b * s_hb + d[:, None] * s_hd + n[None, :] * s_hn, mask=mask_dn, other=0.0
        ).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    for k in range(0, chunks):
        tl.store(starts_ptr + b * s_sb + k * s_sk + d[:, None] * s_sd + n[None, :] * s_sn, h,
                 mask=mask_dn)
        dtsum = tl.load(dtsum_ptr + b * s_tb + k * s_tk + d * s_td, mask=mask_d, other=0.0)
        end = tl.load(ends_ptr + b * s_eb + k * s_ek + d[:, None] * s_ed + n[None, :] * s_en,
                      mask=mask_dn, other=0.0)
        h = tl.exp(A * dtsum[:, None]) * h + end
    tl.store(last_ptr + b * s_lb + d[:, None] * s_ld + n[None, :] * s_ln, h, mask=mask_dn)


def _strides(t: torch.Tensor | None, rank: int) -> tuple[int, ...]:
    return tuple(t.stride()) if t is not None else (0,) * rank


def selective_scan_fwd(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    initial_state: torch.Tensor | None = None,
    chunk: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``selective_scan`` on Triton. u, delta, z (b, d, l); A (d, n); B, C (b, n, l) or
    (b, g, n, l); D, delta_bias (d,); initial_state (b, d, n) -> (out (b, d, l) dtype of u,
    last_state (b, d, n) float32). Any strides. ``chunk``: positions per program (default from
    ``configs``); ``out``: write the output there (any strides, its dtype)."""
    batch, dim, length = u.shape
    state = A.shape[1]
    B = B.unsqueeze(1) if B.dim() == 3 else B  # shared by every channel: one group
    C = C.unsqueeze(1) if C.dim() == 3 else C
    config = configs.pick(u.device, configs.SELECTIVE_SCAN_GPU, configs.SELECTIVE_SCAN_CPU)
    block_d = min(config.block_d, next_power_of_2(dim))
    block_n = next_power_of_2(state)
    chunk = max(1, min(chunk or config.chunk, length)) if length else 1
    chunks = max(1, -(-length // chunk))
    if out is None:
        out = torch.empty((batch, dim, length), dtype=u.dtype, device=u.device)
    last = torch.empty((batch, dim, state), dtype=torch.float32, device=u.device)
    if batch == 0:
        return out, last
    meta = dict(
        BLOCK_D=block_d, BLOCK_N=block_n, HAS_D=D is not None, HAS_Z=z is not None,
        HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus), num_warps=config.num_warps,
    )
    grid = (batch, -(-dim // block_d), chunks)
    common = (dim, length, chunk, dim // B.shape[1], dim // C.shape[1], state,
              *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(), *_strides(z, 3))
    pointers = (u, delta, A, B, C, D if D is not None else A, z if z is not None else u,
                delta_bias if delta_bias is not None else A)
    if chunks == 1:
        h0 = initial_state if initial_state is not None else last
        launch(_selective_scan_chunk_kernel, grid)(
            *pointers, h0, out, last, last, *common,
            h0.stride(0), 0, h0.stride(1), h0.stride(2), *out.stride(),
            last.stride(0), 0, last.stride(1), last.stride(2), 0, 0, 0,
            HAS_H0=initial_state is not None, WRITE_OUT=True, WRITE_STATE=True,
            **meta,
        )
        return out, last
    ends = torch.empty((batch, chunks, dim, state), dtype=torch.float32, device=u.device)
    starts = torch.empty_like(ends)
    dtsum = torch.empty((batch, chunks, dim), dtype=torch.float32, device=u.device)
    launch(_selective_scan_chunk_kernel, grid)(
        *pointers, ends, out, ends, dtsum, *common,
        0, 0, 0, 0, *out.stride(), *ends.stride(), *dtsum.stride(),
        HAS_H0=False, WRITE_OUT=False, WRITE_STATE=True, **meta,
    )
    h0 = initial_state if initial_state is not None else last
    launch(_selective_scan_pass_states_kernel, grid[:2])(
        ends, dtsum, A, h0, starts, last,
        dim, state, chunks, *ends.stride(), *dtsum.stride(), *A.stride(), *h0.stride(),
        *starts.stride(), *last.stride(),
        BLOCK_D=block_d, BLOCK_N=block_n, HAS_H0=initial_state is not None,
        num_warps=config.num_warps,
    )
    launch(_selective_scan_chunk_kernel, grid)(
        *pointers, starts, out, ends, dtsum, *common,
        *starts.stride(), *out.stride(), *ends.stride(), *dtsum.stride(),
        HAS_H0=True, WRITE_OUT=True, WRITE_STATE=False, **meta,
    )
    return out, last
