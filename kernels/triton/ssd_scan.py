"""Triton kernels for ``ssmcc::ssd_scan`` — the Mamba-2 (SSD) scan by its chunked (block)
decomposition, its matrix products on tensor cores.

Math (``ssmcc.ops.ssd_scan``), per batch row and head i (scalar A_i, group g = i // (h / G))::

    dt_t      = clamp(softplus(dt_t + dt_bias_i), dt_min, dt_max)     (each when requested)
    h_t       = exp(dt_t A_i) h_{t-1} + dt_t x_t B_t^T                 h: (p, n), float32
    y_t       = h_t C_t + D_i x_t,   out_t = y_t silu(z_t)

Split the sequence into chunks of Q positions. Inside chunk k, with ``a_t = sum_{s<=t} dt_s A_i``
(the cumulative log-decay from the chunk's start) and ``h_in`` the state entering the chunk::

    1 chunk_cumsum   dt_t (processed) and a_t, float32                            (b, h, K, Q)
    2 chunk_state    S_k = x^T W B,  W = diag(exp(a_last - a_t) dt_t)  (the chunk from zeros)
    3 state_passing  h_in[0] = h_{-1};  h_in[k+1] = exp(a_last(k)) h_in[k] + S_k;  final = h_in[K]
    4 bmm            CB_k = C B^T  (Q x Q, causal half), once per group, float32
    5 chunk_scan     y = diag(exp(a)) C h_in^T + (CB_k o L) x + D x,  gated by z,
                     L[t, s] = exp(a_t - a_s) dt_s for s <= t, else 0

which is the recurrence whatever Q is (the op does not depend on it). The products (2, 4, 5) are
``tl.dot`` in the inputs' 16-bit dtype with float32 accumulation when x, B and C share float16 or
bfloat16, as mamba_ssm's ``ssd_chunk_state`` / ``ssd_bmm`` / ``ssd_chunk_scan`` form them: x, B, C
are used as stored; what is weighted in float32 first (W B in 2, CB o L in 5) and the float32
state h_in (5) are rounded to that dtype as the dot's operand (to nearest: 2^-8 ~ 3.9e-3 relative
for bfloat16, 2^-11 ~ 4.9e-4 for float16), so a product carries one such rounding and every sum
is float32. The state between chunks (``starts``, ``final``) stays float32. Float32 (or mixed, or
wider) inputs take IEEE float32 products (no tensor cores) unless ``allow_tf32``: TF32 keeps 10
of float32's 23 mantissa bits, so each operand is off by up to 2^-11 ~ 4.9e-4 relative when
rounded and 2^-10 ~ 9.8e-4 when truncated (Triton's docs allow either), a product by up to ~2e-3,
and an output by that times the ratio of the sum of its |terms| to their sum; sums stay float32.

Grids and memory (b batch, K = cdiv(l, Q) chunks, h heads, G groups; tiles from ``configs``):

    chunk_cumsum   (b, K, cdiv(h, BLOCK_H))           a (heads x Q) tile: dt read head-contiguous
    chunk_state    (b*K, h, p-tiles * n-tiles)        (p x n) tile over the chunk, BLOCK_K rows of
                                                      x (p-contiguous) and B (n-contiguous) a step
    state_passing  (b, h, cdiv(p*n, BLOCK))           walks the K chunks, contiguous p*n vectors,
                                                      writes h_in[k] to ``starts`` (here S_k's
                                                      own memory; the TensorRT plugin's output)
    bmm            (b*K, G, Q-tiles * Q-tiles)        tiles above the diagonal return at once
    chunk_scan     (b*K, h, Q-tiles * p-tiles)        C (n-contiguous) x h_in^T, then the causal
                                                      CB tiles (a row's columns contiguous) x x

Every program reads whole rows of its operands (contiguous along head_dim or state), the chunks
run in parallel (only step 3 walks them, over a small float32 state), and the products are the
work: on sm_90 64 x 64 tiles of one warpgroup are wgmma instructions on 16-bit operands.

Triton's interpreter (CPU) multiplies bfloat16 tiles as their raw 16-bit patterns, so there the
bfloat16 operands are rounded to nearest bfloat16 and kept in float32 (``WIDEN``, see
``operands.py``): the same exact products and float32 sums a bfloat16 MMA forms. Compiled kernels
never widen.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, operands
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2

DOT_DTYPES = {torch.float16: "fp16", torch.bfloat16: "bf16"}


@triton.jit
def _ssd_chunk_cumsum_kernel(
    dt_ptr, A_ptr, bias_ptr, dt_out_ptr, acs_ptr,
    length, chunk, heads, dt_min, dt_max,
    s_tb, s_tl, s_th, s_ob, s_oh, s_ok, s_oq,
    BLOCK_H: tl.constexpr, BLOCK_Q: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, CLAMP_MAX: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1)
    h = tl.program_id(2) * BLOCK_H + tl.arange(0, BLOCK_H)
    q = tl.arange(0, BLOCK_Q)
    mask_h = h < heads
    mask = mask_h[:, None] & ((q < chunk) & (q < length - k * chunk))[None, :]
    dt_ptr += b * s_tb + (k * chunk).to(tl.int64) * s_tl
    dt = tl.load(dt_ptr + q[None, :] * s_tl + h[:, None] * s_th, mask=mask, other=0.0)
    dt = dt.to(tl.float32)
    if HAS_BIAS:
        dt += tl.load(bias_ptr + h, mask=mask_h, other=0.0).to(tl.float32)[:, None]
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    dt = tl.maximum(dt, dt_min)
    if CLAMP_MAX:
        dt = tl.minimum(dt, dt_max)
    dt = tl.where(mask, dt, 0.0)  # past the sequence: no step, no decay
    A = tl.load(A_ptr + h, mask=mask_h, other=0.0).to(tl.float32)
    a = tl.cumsum(dt * A[:, None], axis=1)
    out = b * s_ob + h[:, None] * s_oh + k * s_ok + q[None, :] * s_oq
    stored = mask_h[:, None] & (q < chunk)[None, :]
    tl.store(dt_out_ptr + out, dt, mask=stored)
    tl.store(acs_ptr + out, a, mask=stored)


@triton.jit
def _ssd_chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, acs_ptr, states_ptr,
    length, chunk, head_dim, nstate, heads_per_group, chunks,
    s_xb, s_xl, s_xh, s_xp, s_bb, s_bl, s_bg, s_bn, s_ab, s_ah, s_ak, s_aq,
    s_sb, s_sk, s_sh, s_sp, s_sn,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
):
    """S_k[p, n] = sum_t x_t[p] exp(a_last - a_t) dt_t B_t[n]: (P x K) x (K x N) steps."""
    b = (tl.program_id(0) // chunks).to(tl.int64)
    k = tl.program_id(0) % chunks
    h = tl.program_id(1)
    n_tiles = tl.cdiv(nstate, BLOCK_N)
    p = (tl.program_id(2) // n_tiles) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = (tl.program_id(2) % n_tiles) * BLOCK_N + tl.arange(0, BLOCK_N)
    g = h // heads_per_group
    chunk_end = tl.minimum(chunk, length - k * chunk)
    start = (k * chunk).to(tl.int64)  # the chunk's first position
    x_ptr += b * s_xb + start * s_xl + h * s_xh
    B_ptr += b * s_bb + start * s_bl + g * s_bg
    acs_ptr += b * s_ab + h * s_ah + k * s_ak
    dt_ptr += b * s_ab + h * s_ah + k * s_ak
    a_last = tl.load(acs_ptr + (chunk - 1) * s_aq)  # a stays put past the sequence's end
    mask_p = p < head_dim
    mask_n = n < nstate
    acc = tl.zeros((BLOCK_P, BLOCK_N), dtype=tl.float32)
    for t0 in range(0, chunk_end, BLOCK_K):
        t = t0 + tl.arange(0, BLOCK_K)
        mask_t = t < chunk_end
        a = tl.load(acs_ptr + t * s_aq, mask=mask_t, other=0.0)
        dt = tl.load(dt_ptr + t * s_aq, mask=mask_t, other=0.0)
        weight = tl.where(mask_t, tl.exp(a_last - a) * dt, 0.0)
        xT = tl.load(  # (P, K)
            x_ptr + t[None, :] * s_xl + p[:, None] * s_xp,
            mask=mask_p[:, None] & mask_t[None, :], other=0.0,
        )
        Bw = tl.load(  # (K, N)
            B_ptr + t[:, None] * s_bl + n[None, :] * s_bn,
            mask=mask_t[:, None] & mask_n[None, :], other=0.0,
        ).to(tl.float32) * weight[:, None]
        xT = operands.mma_operand(xT, DOT, WIDEN)
        Bw = operands.mma_operand(Bw, DOT, WIDEN)
        acc += tl.dot(xT, Bw, input_precision=PRECISION)
    tl.store(
        states_ptr + b * s_sb + k * s_sk + h * s_sh + p[:, None] * s_sp + n[None, :] * s_sn, acc,
        mask=mask_p[:, None] & mask_n[None, :],
    )


@triton.jit
def _ssd_state_passing_kernel(
    states_ptr, acs_ptr, h0_ptr, starts_ptr, final_ptr,
    size, chunks, chunk,
    s_sb, s_sk, s_sh, s_ab, s_ah, s_ak, s_aq, s_hb, s_hh, s_fb, s_fh,
    BLOCK: tl.constexpr, HAS_H0: tl.constexpr,
):
    """States as flat (p * n) vectors, contiguous: ``states`` (b, K, h, p*n) holds S_k, h_in[k]
    goes to ``starts`` (same strides; ``states`` itself: rewritten in place); ``h0``/``final``
    (b, h, p*n)."""
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    e = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
    mask = e < size
    if HAS_H0:
        state = tl.load(h0_ptr + b * s_hb + h * s_hh + e, mask=mask, other=0.0).to(tl.float32)
    else:
        state = tl.zeros((BLOCK,), dtype=tl.float32)
    states_ptr += b * s_sb + h * s_sh + e
    starts_ptr += b * s_sb + h * s_sh + e
    acs_ptr += b * s_ab + h * s_ah + (chunk - 1) * s_aq
    for k in range(0, chunks):
        S = tl.load(states_ptr + k * s_sk, mask=mask, other=0.0)
        tl.store(starts_ptr + k * s_sk, state, mask=mask)
        state = tl.exp(tl.load(acs_ptr + k * s_ak)) * state + S
    tl.store(final_ptr + b * s_fb + h * s_fh + e, state, mask=mask)


@triton.jit
def _ssd_bmm_kernel(
    C_ptr, B_ptr, cb_ptr,
    length, chunk, nstate, chunks,
    s_cb, s_cl, s_cg, s_cn, s_bb, s_bl, s_bg, s_bn, s_ob, s_ok, s_og, s_om, s_os,
    BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
):
    """CB_k[m, s] = C_m . B_s over the state, for s's tile not past m's (the causal half)."""
    b = (tl.program_id(0) // chunks).to(tl.int64)
    k = tl.program_id(0) % chunks
    g = tl.program_id(1)
    s_tiles = tl.cdiv(chunk, BLOCK_S)
    m_tile = tl.program_id(2) // s_tiles
    s_tile = tl.program_id(2) % s_tiles
    if s_tile * BLOCK_S >= (m_tile + 1) * BLOCK_M:
        return  # above the diagonal: chunk_scan never reads it
    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)
    s = s_tile * BLOCK_S + tl.arange(0, BLOCK_S)
    chunk_end = tl.minimum(chunk, length - k * chunk)
    start = (k * chunk).to(tl.int64)
    C_ptr += b * s_cb + start * s_cl + g * s_cg
    B_ptr += b * s_bb + start * s_bl + g * s_bg
    mask_m = m < chunk_end
    mask_s = s < chunk_end
    acc = tl.zeros((BLOCK_M, BLOCK_S), dtype=tl.float32)
    for n0 in range(0, nstate, BLOCK_K):
        n = n0 + tl.arange(0, BLOCK_K)
        mask_n = n < nstate
        Cm = tl.load(  # (M, K)
            C_ptr + m[:, None] * s_cl + n[None, :] * s_cn,
            mask=mask_m[:, None] & mask_n[None, :], other=0.0,
        )
        BsT = tl.load(  # (K, S)
            B_ptr + s[None, :] * s_bl + n[:, None] * s_bn,
            mask=mask_n[:, None] & mask_s[None, :], other=0.0,
        )
        Cm = operands.mma_operand(Cm, DOT, WIDEN)
        BsT = operands.mma_operand(BsT, DOT, WIDEN)
        acc += tl.dot(Cm, BsT, input_precision=PRECISION)
    tl.store(
        cb_ptr + b * s_ob + k * s_ok + g * s_og + m[:, None] * s_om + s[None, :] * s_os, acc,
        mask=(m < chunk)[:, None] & (s < chunk)[None, :],
    )


@triton.jit
def _ssd_chunk_scan_kernel(
    x_ptr, z_ptr, C_ptr, D_ptr, dt_ptr, acs_ptr, starts_ptr, cb_ptr, out_ptr,
    length, chunk, head_dim, nstate, heads_per_group, chunks,
    s_xb, s_xl, s_xh, s_xp, s_zb, s_zl, s_zh, s_zp, s_cb, s_cl, s_cg, s_cn, s_dh, s_dp,
    s_ab, s_ah, s_ak, s_aq, s_sb, s_sk, s_sh, s_sp, s_sn,
    s_mb, s_mk, s_mg, s_mm, s_ms, s_ob, s_ol, s_oh, s_op,
    BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_H0: tl.constexpr,
    DOT: tl.constexpr, WIDEN: tl.constexpr, PRECISION: tl.constexpr,
):
    """y[m, p] = exp(a_m) C_m . h_in[p, :] + sum_{s<=m} CB[m, s] exp(a_m - a_s) dt_s x_s[p]."""
    b = (tl.program_id(0) // chunks).to(tl.int64)
    k = tl.program_id(0) % chunks
    h = tl.program_id(1)
    p_tiles = tl.cdiv(head_dim, BLOCK_P)
    m_tile = tl.program_id(2) // p_tiles
    m = m_tile * BLOCK_M + tl.arange(0, BLOCK_M)  # rows of the chunk
    p = (tl.program_id(2) % p_tiles) * BLOCK_P + tl.arange(0, BLOCK_P)
    g = h // heads_per_group
    chunk_end = tl.minimum(chunk, length - k * chunk)
    mask_m = m < chunk_end
    mask_p = p < head_dim
    start = (k * chunk).to(tl.int64)
    x_ptr += b * s_xb + start * s_xl + h * s_xh
    C_ptr += b * s_cb + start * s_cl + g * s_cg
    acs_ptr += b * s_ab + h * s_ah + k * s_ak
    dt_ptr += b * s_ab + h * s_ah + k * s_ak
    cb_ptr += b * s_mb + k * s_mk + g * s_mg
    a_m = tl.load(acs_ptr + m * s_aq, mask=m < chunk, other=0.0)
    acc = tl.zeros((BLOCK_M, BLOCK_P), dtype=tl.float32)
    if (k > 0) | HAS_H0:  # the state entering the first chunk is zero without h0
        starts_ptr += b * s_sb + k * s_sk + h * s_sh
        for n0 in range(0, nstate, BLOCK_K):
            n = n0 + tl.arange(0, BLOCK_K)
            mask_n = n < nstate
            Cm = tl.load(  # (M, K)
                C_ptr + m[:, None] * s_cl + n[None, :] * s_cn,
                mask=mask_m[:, None] & mask_n[None, :], other=0.0,
            )
            startT = tl.load(  # (K, P): the state entering the chunk, transposed
                starts_ptr + p[None, :] * s_sp + n[:, None] * s_sn,
                mask=mask_n[:, None] & mask_p[None, :], other=0.0,
            )
            Cm = operands.mma_operand(Cm, DOT, WIDEN)
            startT = operands.mma_operand(startT, DOT, WIDEN)
            acc += tl.dot(Cm, startT, input_precision=PRECISION)
        acc = acc * tl.exp(a_m)[:, None]
    s_end = tl.minimum((m_tile + 1) * BLOCK_M, chunk_end)  # causal: no column past the last row
    for s0 in range(0, s_end, BLOCK_K):
        s = s0 + tl.arange(0, BLOCK_K)
        mask_s = s < chunk_end
        causal = (s[None, :] <= m[:, None]) & mask_s[None, :]
        a_s = tl.load(acs_ptr + s * s_aq, mask=mask_s, other=0.0)
        dt_s = tl.load(dt_ptr + s * s_aq, mask=mask_s, other=0.0)
        cb = tl.load(cb_ptr + m[:, None] * s_mm + s[None, :] * s_ms, mask=causal, other=0.0)
        decay = tl.exp(tl.where(causal, a_m[:, None] - a_s[None, :], float("-inf")))
        weights = operands.mma_operand(cb * decay * dt_s[None, :], DOT, WIDEN)  # (M, K)
        xs = tl.load(  # (K, P)
            x_ptr + s[:, None] * s_xl + p[None, :] * s_xp,
            mask=mask_s[:, None] & mask_p[None, :], other=0.0,
        )
        xs = operands.mma_operand(xs, DOT, WIDEN)
        acc += tl.dot(weights, xs, input_precision=PRECISION)
    mask = mask_m[:, None] & mask_p[None, :]
    if HAS_D:
        x_m = tl.load(x_ptr + m[:, None] * s_xl + p[None, :] * s_xp, mask=mask, other=0.0)
        D = tl.load(D_ptr + h * s_dh + p * s_dp, mask=mask_p, other=0.0).to(tl.float32)
        acc += D[None, :] * x_m.to(tl.float32)
    if HAS_Z:
        z_ptr += b * s_zb + start * s_zl + h * s_zh
        z = tl.load(z_ptr + m[:, None] * s_zl + p[None, :] * s_zp, mask=mask, other=0.0)
        z = z.to(tl.float32)
        acc = acc * z / (1.0 + tl.exp(-z))
    out_ptr += b * s_ob + start * s_ol + h * s_oh
    tl.store(out_ptr + m[:, None] * s_ol + p[None, :] * s_op, acc, mask=mask)


class SsdPieces(NamedTuple):
    """The scan's result and its intermediates (``ssd_scan_chunked``), chunk k's at index k."""

    out: torch.Tensor  # (b, l, h, p), x's dtype (or ``out``'s)
    final: torch.Tensor  # (b, h, p, n) float32
    dt: torch.Tensor  # (b, h, K, Q) processed dt, 0 past the sequence
    a: torch.Tensor  # (b, h, K, Q) cumulative dt A from the chunk's start
    starts: torch.Tensor  # (b, K, h, p, n) the state entering chunk k
    cb: torch.Tensor  # (b, K, G, Q, Q) C_t . B_s (t >= s; the rest unspecified)


def _block(cap: int, size: int) -> int:
    return max(16, min(cap, next_power_of_2(size)))


def dot_operands(x, B, C, allow_tf32: bool) -> tuple[str, bool, str]:
    """(DOT, WIDEN, PRECISION) of the products: the 16-bit dtype x, B and C share, else float32
    (a wider or mixed input is not rounded to 16 bits) — IEEE, or TF32 when ``allow_tf32``;
    ``WIDEN`` in the interpreter for bfloat16 (see the module docstring)."""
    sixteen = len({x.dtype, B.dtype, C.dtype}) == 1 and x.dtype in (torch.float16, torch.bfloat16)
    dot = DOT_DTYPES[x.dtype] if sixteen else "fp32"
    interpreted = x.device.type == "cpu" and not configs.RECORDING_FOR_GPU
    precision = "tf32" if allow_tf32 and dot == "fp32" else "ieee"
    return dot, interpreted and dot == "bf16", precision


@launcher("ssd_scan")
def ssd_scan_fwd(
    x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False, dt_min=0.0, dt_max=None,
    initial_state=None, chunk: int | None = None, out=None, allow_tf32: bool = False,
    config: configs.SsdConfig | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ssd_scan`` on Triton. x, z (b, l, h, p); dt (b, l, h); A (h,); B, C (b, l, g, n);
    D (h,) or (h, p); dt_bias (h,); initial_state (b, h, p, n) -> (out (b, l, h, p) dtype of x,
    final_state (b, h, p, n) float32). Any strides.

    ``chunk``: Q, a power of two >= 16 (default: the config's); ``out``: write the output there
    (any strides, its dtype); ``allow_tf32``: float32 products on TF32 tensor cores (see the
    module docstring for the error; 16-bit inputs always take 16-bit products); ``config``: the
    tiles (default: ``configs.ssd_config`` for the device)."""
    batch, length, heads, head_dim = x.shape
    if batch == 0 or length == 0:
        final = torch.zeros((batch, heads, head_dim, B.shape[3]), device=x.device)
        if initial_state is not None:
            final.copy_(initial_state)
        return torch.empty_like(x) if out is None else out, final
    pieces = ssd_scan_chunked(
        x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, chunk, out,
        allow_tf32, config,
    )
    return pieces.out, pieces.final


def ssd_scan_chunked(
    x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state, chunk, out,
    allow_tf32, config,
) -> SsdPieces:
    """``ssd_scan_fwd``'s five launches (length >= 1), with their intermediates."""
    batch, length, heads, head_dim = x.shape
    groups, nstate = B.shape[2], B.shape[3]
    device = x.device
    if out is None:
        out = torch.empty((batch, length, heads, head_dim), dtype=x.dtype, device=device)
    cfg = config or configs.ssd_config(device)
    Q = chunk or cfg.chunk
    chunks = -(-length // Q)
    dot, widen, precision = dot_operands(x, B, C, allow_tf32)
    products = dict(DOT=dot, WIDEN=widen, PRECISION=precision)
    fma = dot == "fp32" and precision == "ieee"  # no tensor cores: Triton's FMA dot
    k_cap = cfg.fma_block_k if fma else cfg.tf32_block_k if dot == "fp32" else 1 << 30

    def warps(tile: configs.DotTile) -> dict:
        return dict(num_warps=tile.num_warps, num_stages=cfg.fma_stages if fma else tile.num_stages)

    def step(tile: configs.DotTile, size: int) -> int:  # the k block
        return _block(min(tile.block_k, k_cap), size)

    f32 = dict(dtype=torch.float32, device=device)
    dt_q = torch.empty((batch, heads, chunks, Q), **f32)
    acs = torch.empty_like(dt_q)
    block_h = min(cfg.cumsum_heads, next_power_of_2(heads))
    launch(_ssd_chunk_cumsum_kernel, (batch, chunks, -(-heads // block_h)))(
        dt, A, dt_bias if dt_bias is not None else A, dt_q, acs, length, Q, heads,
        float(dt_min), float(dt_max or 0.0), *dt.stride(), *dt_q.stride(),
        BLOCK_H=block_h, BLOCK_Q=Q, HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(dt_softplus),
        CLAMP_MAX=dt_max is not None, num_warps=cfg.num_warps,
    )

    tile = cfg.chunk_state
    block_p, block_n = _block(tile.block_m, head_dim), _block(tile.block_n, nstate)
    states = torch.empty((batch, chunks, heads, head_dim, nstate), **f32)
    grid = (batch * chunks, heads, -(-head_dim // block_p) * -(-nstate // block_n))
    launch(_ssd_chunk_state_kernel, grid)(
        x, B, dt_q, acs, states, length, Q, head_dim, nstate, heads // groups, chunks,
        *x.stride(), *B.stride(), *acs.stride(), *states.stride(),
        BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_K=step(tile, Q), **products,
        **warps(tile),
    )

    final = torch.empty((batch, heads, head_dim, nstate), **f32)
    h0 = initial_state.contiguous() if initial_state is not None else final
    size = head_dim * nstate
    block = min(cfg.passing_block, next_power_of_2(size))
    launch(_ssd_state_passing_kernel, (batch, heads, -(-size // block)))(
        states, acs, h0, states, final, size, chunks, Q,
        states.stride(0), states.stride(1), states.stride(2), *acs.stride(),
        h0.stride(0), h0.stride(1), final.stride(0), final.stride(1),
        BLOCK=block, HAS_H0=initial_state is not None, num_warps=cfg.num_warps,
    )

    tile = cfg.bmm
    block_m, block_s = _block(tile.block_m, Q), _block(tile.block_n, Q)
    cb = torch.empty((batch, chunks, groups, Q, Q), **f32)
    grid = (batch * chunks, groups, -(-Q // block_m) * -(-Q // block_s))
    launch(_ssd_bmm_kernel, grid)(
        C, B, cb, length, Q, nstate, chunks, *C.stride(), *B.stride(), *cb.stride(),
        BLOCK_M=block_m, BLOCK_S=block_s, BLOCK_K=step(tile, nstate), **products,
        **warps(tile),
    )

    tile = cfg.chunk_scan
    block_m, block_p = _block(tile.block_m, Q), _block(tile.block_n, head_dim)
    if D is not None:
        D_strides = (D.stride(0), 0) if D.dim() == 1 else tuple(D.stride())
    else:
        D_strides = (0, 0)
    grid = (batch * chunks, heads, -(-Q // block_m) * -(-head_dim // block_p))
    launch(_ssd_chunk_scan_kernel, grid)(
        x, z if z is not None else x, C, D if D is not None else A, dt_q, acs, states, cb, out,
        length, Q, head_dim, nstate, heads // groups, chunks,
        *x.stride(), *(z.stride() if z is not None else (0, 0, 0, 0)), *C.stride(), *D_strides,
        *acs.stride(), *states.stride(), *cb.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_P=block_p, BLOCK_K=step(tile, Q), HAS_D=D is not None,
        HAS_Z=z is not None, HAS_H0=initial_state is not None, **products, **warps(tile),
    )
    return SsdPieces(out, final, dt_q, acs, states, cb)
