"""Triton kernels for ``ssmcc::ssd_scan`` — the Mamba-2 (SSD) scan by its chunked (block)
decomposition.

Math (``ssmcc.ops.ssd_scan``), per batch row and head i (scalar A_i), in float32::

    dt_t      = clamp(softplus(dt_t + dt_bias_i), dt_min, dt_max)     (each when requested)
    h_t       = exp(dt_t A_i) h_{t-1} + dt_t x_t B_t^T                 h: (p, n)
    y_t       = h_t C_t + D_i x_t,   out_t = y_t silu(z_t)

Split the sequence into chunks of Q positions. Inside chunk k, with ``a_t = sum_{s<=t} dt_s A_i``
(the cumulative log-decay from the chunk's start) and ``h_in`` the state entering the chunk::

    1 chunk_cumsum   dt_t (processed) and a_t                                       (b, h, K, Q)
    2 chunk_state    S_k = sum_t exp(a_last - a_t) dt_t x_t B_t^T   (the chunk from zeros; tl.dot)
    3 state_passing  h_in[0] = h_{-1};  h_in[k+1] = exp(a_last(k)) h_in[k] + S_k;  final = h_in[K]
    4 chunk_scan     y_t = exp(a_t) h_in C_t  +  sum_{s<=t} (C_t . B_s) exp(a_t - a_s) dt_s x_s
                     + D x_t, gated by z                                             (tl.dot)

Steps 1, 2 and 4 are parallel over chunks; step 3 walks the chunks once per (batch, head) over
the (p, n) state. The result is the recurrence's whatever Q is (the op does not depend on it).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs
from ssmcc.kernels.triton.runtime import launch, next_power_of_2


@triton.jit
def _ssd_chunk_cumsum_kernel(
    dt_ptr, A_ptr, bias_ptr, dt_out_ptr, acs_ptr,
    length, chunk, dt_min, dt_max,
    s_tb, s_tl, s_th, s_ob, s_oh, s_ok, s_oq,
    BLOCK_Q: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    CLAMP_MAX: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    k = tl.program_id(2)
    q = tl.arange(0, BLOCK_Q)
    t = k * chunk + q
    mask = (q < chunk) & (t < length)
    dt = tl.load(dt_ptr + b * s_tb + t * s_tl + h * s_th, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + h).to(tl.float32)
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    dt = tl.maximum(dt, dt_min)
    if CLAMP_MAX:
        dt = tl.minimum(dt, dt_max)
    dt = tl.where(mask, dt, 0.0)
    a = tl.cumsum(dt * tl.load(A_ptr + h).to(tl.float32), axis=0)
    out = b * s_ob + h * s_oh + k * s_ok + q * s_oq
    tl.store(dt_out_ptr + out, dt, mask=q < chunk)
    tl.store(acs_ptr + out, a, mask=q < chunk)


@triton.jit
def _ssd_chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, acs_ptr, states_ptr,
    length, chunk, head_dim, nstate, heads_per_group, chunks,
    s_xb, s_xl, s_xh, s_xp, s_bb, s_bl, s_bg, s_bn, s_ab, s_ah, s_ak, s_aq,
    s_sb, s_sk, s_sh, s_sp, s_sn,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_Q: tl.constexpr,
):
    b = tl.program_id(0) // chunks
    k = tl.program_id(0) % chunks
    h = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    q = tl.arange(0, BLOCK_Q)
    t = k * chunk + q
    mask_q = (q < chunk) & (t < length)
    g = h // heads_per_group
    last = tl.minimum(chunk, length - k * chunk) - 1
    a_last = tl.load(acs_ptr + b * s_ab + h * s_ah + k * s_ak + last * s_aq)
    a = tl.load(acs_ptr + b * s_ab + h * s_ah + k * s_ak + q * s_aq, mask=mask_q, other=0.0)
    dt = tl.load(dt_ptr + b * s_ab + h * s_ah + k * s_ak + q * s_aq, mask=mask_q, other=0.0)
    weight = tl.where(mask_q, tl.exp(a_last - a) * dt, 0.0)  # (Q,)
    xT = tl.load(  # (P, Q)
        x_ptr + b * s_xb + t[None, :] * s_xl + h * s_xh + p[:, None] * s_xp,
        mask=(p[:, None] < head_dim) & mask_q[None, :], other=0.0,
    ).to(tl.float32)
    Bm = tl.load(  # (Q, N)
        B_ptr + b * s_bb + t[:, None] * s_bl + g * s_bg + n[None, :] * s_bn,
        mask=mask_q[:, None] & (n[None, :] < nstate), other=0.0,
    ).to(tl.float32)
    S = tl.dot(xT * weight[None, :], Bm, input_precision="ieee")
    tl.store(
        states_ptr + b * s_sb + k * s_sk + h * s_sh + p[:, None] * s_sp + n[None, :] * s_sn, S,
        mask=(p[:, None] < head_dim) & (n[None, :] < nstate),
    )


@triton.jit
def _ssd_state_passing_kernel(
    states_ptr, acs_ptr, h0_ptr, starts_ptr, final_ptr,
    size, chunks, length, chunk,
    s_sb, s_sk, s_sh, s_ab, s_ah, s_ak, s_aq, s_hb, s_hh, s_fb, s_fh,
    BLOCK: tl.constexpr, HAS_H0: tl.constexpr,
):
    """States as flat (p * n) vectors: ``states``/``starts`` (b, K, h, p*n) contiguous in p*n;
    ``h0``/``final`` (b, h, p*n) contiguous in p*n."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    e = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = e < size
    if HAS_H0:
        state = tl.load(h0_ptr + b * s_hb + h * s_hh + e, mask=mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK,), dtype=tl.float32)
    for k in range(0, chunks):
        tl.store(starts_ptr + b * s_sb + k * s_sk + h * s_sh + e, state, mask=mask)
        last = tl.minimum(chunk, length - k * chunk) - 1
        decay = tl.exp(tl.load(acs_ptr + b * s_ab + h * s_ah + k * s_ak + last * s_aq))
        S = tl.load(states_ptr + b * s_sb + k * s_sk + h * s_sh + e, mask=mask, other=0.0)
        state = decay * state + S
    tl.store(final_ptr + b * s_fb + h * s_fh + e, state, mask=mask)


@triton.jit
def _ssd_chunk_scan_kernel(
    x_ptr, z_ptr, B_ptr, C_ptr, D_ptr, dt_ptr, acs_ptr, starts_ptr, out_ptr,
    length, chunk, head_dim, nstate, heads_per_group, chunks,
    s_xb, s_xl, s_xh, s_xp, s_zb, s_zl, s_zh, s_zp, s_bb, s_bl, s_bg, s_bn,
    s_cb, s_cl, s_cg, s_cn, s_dh, s_dp, s_ab, s_ah, s_ak, s_aq,
    s_sb, s_sk, s_sh, s_sp, s_sn, s_ob, s_ol, s_oh, s_op,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_S: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr,
):
    b = tl.program_id(0) // chunks
    k = tl.program_id(0) % chunks
    h = tl.program_id(1)
    p_blocks = tl.cdiv(head_dim, BLOCK_P)
    m = (tl.program_id(2) // p_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)  # rows in the chunk
    p = (tl.program_id(2) % p_blocks) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    g = h // heads_per_group
    t = k * chunk + m
    mask_m = (m < chunk) & (t < length)
    mask_p = p < head_dim
    chunk_base = b * s_ab + h * s_ah + k * s_ak
    a_m = tl.load(acs_ptr + chunk_base + m * s_aq, mask=mask_m, other=0.0)
    Cm = tl.load(  # (M, N)
        C_ptr + b * s_cb + t[:, None] * s_cl + g * s_cg + n[None, :] * s_cn,
        mask=mask_m[:, None] & (n[None, :] < nstate), other=0.0,
    ).to(tl.float32)
    startT = tl.load(  # (N, P): the state entering the chunk, transposed
        starts_ptr + b * s_sb + k * s_sk + h * s_sh + p[None, :] * s_sp + n[:, None] * s_sn,
        mask=mask_p[None, :] & (n[:, None] < nstate), other=0.0,
    )
    acc = tl.dot(Cm, startT, input_precision="ieee") * tl.exp(a_m)[:, None]
    chunk_end = tl.minimum(chunk, length - k * chunk)
    s_end = tl.minimum((tl.program_id(2) // p_blocks + 1) * BLOCK_M, chunk_end)
    for s0 in range(0, s_end, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        mask_s = s < chunk_end
        ts = k * chunk + s
        BsT = tl.load(  # (N, S)
            B_ptr + b * s_bb + ts[None, :] * s_bl + g * s_bg + n[:, None] * s_bn,
            mask=mask_s[None, :] & (n[:, None] < nstate), other=0.0,
        ).to(tl.float32)
        a_s = tl.load(acs_ptr + chunk_base + s * s_aq, mask=mask_s, other=0.0)
        dt_s = tl.load(dt_ptr + chunk_base + s * s_aq, mask=mask_s, other=0.0)
        causal = (s[None, :] <= m[:, None]) & mask_s[None, :]
        scores = tl.dot(Cm, BsT, input_precision="ieee")  # (M, S)
        scores = tl.where(causal, scores * tl.exp(a_m[:, None] - a_s[None, :]) * dt_s[None, :], 0.0)
        xs = tl.load(  # (S, P)
            x_ptr + b * s_xb + ts[:, None] * s_xl + h * s_xh + p[None, :] * s_xp,
            mask=mask_s[:, None] & mask_p[None, :], other=0.0,
        ).to(tl.float32)
        acc += tl.dot(scores, xs, input_precision="ieee")
    mask = mask_m[:, None] & mask_p[None, :]
    x_m = tl.load(x_ptr + b * s_xb + t[:, None] * s_xl + h * s_xh + p[None, :] * s_xp,
                  mask=mask, other=0.0).to(tl.float32)
    if HAS_D:
        acc += tl.load(D_ptr + h * s_dh + p * s_dp, mask=mask_p, other=0.0)[None, :] * x_m
    if HAS_Z:
        z = tl.load(z_ptr + b * s_zb + t[:, None] * s_zl + h * s_zh + p[None, :] * s_zp,
                    mask=mask, other=0.0).to(tl.float32)
        acc = acc * z / (1.0 + tl.exp(-z))
    tl.store(out_ptr + b * s_ob + t[:, None] * s_ol + h * s_oh + p[None, :] * s_op, acc,
             mask=mask)


def ssd_scan_fwd(
    x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=None,
    initial_state=None, chunk: int | None = None, out=None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssd_scan`` on Triton. x, z (b, l, h, p); dt (b, l, h); A (h,); B, C (b, l, g, n);
    D (h,) or (h, p); dt_bias (h,); initial_state (b, h, p, n) -> (out (b, l, h, p) dtype of x,
    final_state (b, h, p, n) float32). Any strides. ``chunk``: Q, a power of two >= 16 (default
    from ``configs``); ``out``: write the output there (any strides, its dtype)."""
    batch, length, heads, head_dim = x.shape
    groups, nstate = B.shape[2], B.shape[3]
    device = x.device
    if out is None:
        out = torch.empty((batch, length, heads, head_dim), dtype=x.dtype, device=device)
    final = torch.empty((batch, heads, head_dim, nstate), dtype=torch.float32, device=device)
    if batch == 0 or length == 0:
        final.copy_(initial_state if initial_state is not None else torch.zeros_like(final))
        return out, final
    Q = chunk or configs.pick(device, configs.SSD_CHUNK_GPU, configs.SSD_CHUNK_CPU)
    chunks = -(-length // Q)
    f32 = dict(dtype=torch.float32, device=device)
    dt_q = torch.empty((batch, heads, chunks, Q), **f32)
    acs = torch.empty_like(dt_q)
    launch(_ssd_chunk_cumsum_kernel, (batch, heads, chunks))(
        dt, A, dt_bias if dt_bias is not None else A, dt_q, acs, length, Q, float(dt_min),
        float(dt_max or 0.0), *dt.stride(), *dt_q.stride(),
        BLOCK_Q=Q, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        CLAMP_MAX=dt_max is not None, num_warps=1,
    )
    block_p = max(16, min(64, next_power_of_2(head_dim)))
    block_n = max(16, next_power_of_2(nstate))
    p_blocks = -(-head_dim // block_p)
    states = torch.empty((batch, chunks, heads, head_dim, nstate), **f32)
    launch(_ssd_chunk_state_kernel, (batch * chunks, heads, p_blocks))(
        x, B, dt_q, acs, states, length, Q, head_dim, nstate, heads // groups, chunks,
        *x.stride(), *B.stride(), *acs.stride(), *states.stride(),
        BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_Q=Q, num_warps=4,
    )
    starts = torch.empty_like(states)
    h0 = initial_state.contiguous() if initial_state is not None else final
    size = head_dim * nstate
    block = min(1024, next_power_of_2(size))
    launch(_ssd_state_passing_kernel, (batch, heads, -(-size // block)))(
        states, acs, h0, starts, final, size, chunks, length, Q,
        states.stride(0), states.stride(1), states.stride(2), *acs.stride(),
        h0.stride(0), h0.stride(1), final.stride(0), final.stride(1),
        BLOCK=block, HAS_H0=initial_state is not None, num_warps=4,
    )
    block_m = min(Q, 64)
    if D is not None:
        D_strides = (D.stride(0), 0) if D.dim() == 1 else tuple(D.stride())
    else:
        D_strides = (0, 0)
    grid = (batch * chunks, heads, -(-Q // block_m) * p_blocks)
    launch(_ssd_chunk_scan_kernel, grid)(
        x, z if z is not None else x, B, C, D if D is not None else A, dt_q, acs, starts, out,
        length, Q, head_dim, nstate, heads // groups, chunks,
        *x.stride(), *(z.stride() if z is not None else (0, 0, 0, 0)), *B.stride(), *C.stride(),
        *D_strides, *acs.stride(), *starts.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_S=min(Q, 64),
        HAS_D=D is not None, HAS_Z=z is not None, num_warps=4,
    )
    return out, final
