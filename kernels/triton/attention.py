"""Triton kernels for ``ssmcc::attention`` — causal grouped-head attention carrying its K/V cache.

Math (``ssmcc.ops.attention``): ``K = concat(past_key, key)``, ``V = concat(past_value, value)``
along positions (p cached, l new); query row i of head q (absolute position p + i) reads K/V head
``q // (h / g)``::

    s_ij   = scale <query[q, i], K[j]>        for j <= p + i
    out[q, i] = sum_j softmax_j(s_i) V[j]     (float32, rounded once to the query's dtype)

``keys``/``values`` (the caches after the call) are written first by a copy kernel
(``_append_cache_kernel``, grid (batch, kv_heads, cdiv(p + l, BLOCK_T)): (BLOCK_T, head_dim)
tiles, contiguous along the head dim); the attention kernels then read them. Both paths keep a
running maximum ``m``, normaliser ``n`` and weighted sum over ``BLOCK_N`` keys at a time, so no
score matrix is stored::

    m' = max(m, max_j s_ij);  n' = n e^(m - m') + sum_j e^(s_ij - m');  acc' = acc e^(m - m') + P V

Prefill (l > ``DECODE_QUERIES``): flash attention, grid (batch * heads, cdiv(l, BLOCK_M)); a
program holds ``BLOCK_M`` query rows of one head and walks the keys it can see (K and V tiles
read once per program, contiguous along the head dim).

Decode (l <= ``DECODE_QUERIES``: one position, or a few of a chunk or a draft): flash-decoding.
One query position gives one program per head and a key loop as long as the cache, so batch 1
would run a dozen programs on a 132-SM GPU. The keys are split instead: ``_attention_split_kernel``
(grid (batch * kv_heads * cdiv(h/g * l, BLOCK_M), cdiv(p + l, split_len))) takes the h/g * l
query rows that share one K/V head (GQA: row r is head ``g h/g + r // l``, position ``r % l``) and
one span of ``split_len`` keys, so each K/V tile is read once for its whole group, and writes its
float32 partial ``(m, n, acc)`` per query row and split; ``_attention_combine_kernel`` (grid
(batch * heads, l)) merges a row's splits in order::

    M = max_s m_s;   out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) n_s

``split_len`` (a run-time argument, whole ``BLOCK_N`` blocks, at least ``split`` keys) is chosen
so that the launch has about ``programs`` programs (two per SM of an H100): batch 1 with a long
cache fills the GPU, a large batch keeps whole caches per program. A split a row cannot see any
of (causality, l > 1) leaves ``m = -inf, n = 0`` and weighs nothing. The partials are
(batch, heads, l, splits) and (batch, heads, l, splits, e) float32, contiguous.

Products: ``tl.dot`` with float32 accumulation. With 16-bit query, keys and values (``DOT16``) the
operands stay 16-bit (tensor cores): the scores are exact products summed in float32, and the
softmax weights are rounded to the values' dtype for ``P V`` (flash attention's choice: a relative
error of 2^-9 (bf16) / 2^-12 (fp16) per weight, inside those dtypes' tolerances). float32 inputs
use IEEE float32 products (no TF32), as the reference. The interpreter has no bfloat16 products:
there bfloat16 is widened to float32 (``configs.dot16``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, online_softmax
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2

DECODE_QUERIES = 16  # query positions a call may have and still take the split-key path


@triton.jit
def _append_cache_kernel(
    past_ptr, new_ptr, cache_ptr,
    past, length, width,
    s_pb, s_pg, s_pt, s_pd, s_nb, s_ng, s_nt, s_nd, s_cb, s_cg, s_ct, s_cd,
    BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr, HAS_PAST: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    t = tl.program_id(2) * BLOCK_T + tl.arange(0, BLOCK_T)
    d = tl.arange(0, BLOCK_D)
    inside = (t[:, None] < past + length) & (d[None, :] < width)
    new_t = t - past
    v = tl.load(new_ptr + b * s_nb + g * s_ng + new_t[:, None] * s_nt + d[None, :] * s_nd,
                mask=inside & (new_t[:, None] >= 0), other=0.0)
    if HAS_PAST:
        v += tl.load(past_ptr + b * s_pb + g * s_pg + t[:, None] * s_pt + d[None, :] * s_pd,
                     mask=inside & (t[:, None] < past), other=0.0).to(v.dtype)
    tl.store(cache_ptr + b * s_cb + g * s_cg + t[:, None] * s_ct + d[None, :] * s_cd, v,
             mask=inside)


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr,
    heads, heads_per_kv, length, past, head_dim, value_dim, scale,
    s_qb, s_qh, s_ql, s_qd, s_kb, s_kg, s_kt, s_kd, s_vb, s_vg, s_vt, s_ve,
    s_ob, s_oh, s_ol, s_oe,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    DOT16: tl.constexpr,
):
    b = tl.program_id(0) // heads
    h = tl.program_id(0) % heads
    g = h // heads_per_kv
    i = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_E)
    mask_i = i < length
    q = tl.load(q_ptr + b * s_qb + h * s_qh + i[:, None] * s_ql + d[None, :] * s_qd,
                mask=mask_i[:, None] & (d[None, :] < head_dim), other=0.0)
    if not DOT16:
        q = q.to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    norm = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    visible = past + tl.minimum((tl.program_id(1) + 1) * BLOCK_M, length)  # keys any row sees
    m, norm, acc = online_softmax.attend_keys(
        q, m, norm, acc, k_ptr + b * s_kb + g * s_kg, v_ptr + b * s_vb + g * s_vg, 0, visible,
        past + i, mask_i, head_dim, value_dim, s_kt, s_kd, s_vt, s_ve, scale,
        BLOCK_N, BLOCK_D, BLOCK_E, DOT16,
    )
    acc = acc / tl.where(norm == 0.0, 1.0, norm)[:, None]  # rows past the end saw nothing
    tl.store(out_ptr + b * s_ob + h * s_oh + i[:, None] * s_ol + e[None, :] * s_oe, acc,
             mask=mask_i[:, None] & (e[None, :] < value_dim))


@triton.jit
def _attention_split_kernel(
    q_ptr, k_ptr, v_ptr, m_ptr, n_ptr, acc_ptr,
    heads, heads_per_kv, length, past, head_dim, value_dim, split_len, splits, scale,
    s_qb, s_qh, s_ql, s_qd, s_kb, s_kg, s_kt, s_kd, s_vb, s_vg, s_vt, s_ve,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    DOT16: tl.constexpr,
):
    rows = heads_per_kv * length  # query rows sharing one K/V head
    row_blocks = tl.cdiv(rows, BLOCK_M)
    kv_heads = heads // heads_per_kv
    lane = tl.program_id(0)
    b = lane // (kv_heads * row_blocks)
    g = (lane // row_blocks) % kv_heads
    r = (lane % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    real = r < rows
    h = g * heads_per_kv + r // length  # query head of row r
    i = r % length  # its position among the new ones (absolute: past + i)
    split = tl.program_id(1)
    start = split * split_len
    end = tl.minimum(start + split_len, past + length)
    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_E)
    q = tl.load(q_ptr + b * s_qb + h[:, None] * s_qh + i[:, None] * s_ql + d[None, :] * s_qd,
                mask=real[:, None] & (d[None, :] < head_dim), other=0.0)
    if not DOT16:
        q = q.to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    norm = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    m, norm, acc = online_softmax.attend_keys(
        q, m, norm, acc, k_ptr + b * s_kb + g * s_kg, v_ptr + b * s_vb + g * s_vg, start, end,
        past + i, real, head_dim, value_dim, s_kt, s_kd, s_vt, s_ve, scale,
        BLOCK_N, BLOCK_D, BLOCK_E, DOT16,
    )
    at = ((b * heads + h) * length + i) * splits + split  # (b, h, i, split) of the partials
    tl.store(m_ptr + at, m, mask=real)
    tl.store(n_ptr + at, norm, mask=real)
    tl.store(acc_ptr + at[:, None] * value_dim + e[None, :], acc,
             mask=real[:, None] & (e[None, :] < value_dim))


@triton.jit
def _attention_combine_kernel(
    m_ptr, n_ptr, acc_ptr, out_ptr,
    heads, length, value_dim, splits,
    s_ob, s_oh, s_ol, s_oe,
    BLOCK_S: tl.constexpr, BLOCK_E: tl.constexpr,
):
    b = tl.program_id(0) // heads
    h = tl.program_id(0) % heads
    i = tl.program_id(1)
    row = (tl.program_id(0) * length + i) * splits  # first split of (b, h, i)
    e = tl.arange(0, BLOCK_E)
    best = float("-inf")
    norm = 0.0
    acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for s0 in range(0, splits, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        m = tl.load(m_ptr + row + s, mask=s < splits, other=float("-inf"))
        n = tl.load(n_ptr + row + s, mask=s < splits, other=0.0)
        part = tl.load(acc_ptr + (row + s[:, None]) * value_dim + e[None, :],
                       mask=(s[:, None] < splits) & (e[None, :] < value_dim), other=0.0)
        best_new = tl.maximum(best, tl.max(m, axis=0))
        # finite once split 0 is in (it holds key 0, seen by every row); -inf only for a row
        # that saw nothing (a padding row of the pooled decode: its out is zeros)
        safe = tl.where(best_new == float("-inf"), 0.0, best_new)
        weight = tl.exp(m - safe)
        rescale = tl.exp(best - safe)
        norm = norm * rescale + tl.sum(n * weight, axis=0)
        acc = acc * rescale + tl.sum(part * weight[:, None], axis=0)
        best = best_new
    out = acc / tl.where(norm == 0.0, 1.0, norm)
    tl.store(out_ptr + b * s_ob + h * s_oh + i * s_ol + e * s_oe, out, mask=e < value_dim)


def _cache(new, past):
    """concat(past, new) along positions, in new's dtype."""
    batch, groups, length, width = new.shape
    before = past.shape[2] if past is not None else 0
    cache = torch.empty((batch, groups, before + length, width), dtype=new.dtype,
                        device=new.device)
    if cache.numel():
        tiles = configs.pick(new.device, configs.APPEND_CACHE_GPU, configs.APPEND_CACHE_CPU)
        block_d = next_power_of_2(width)
        block_t = max(1, min(64, tiles["elements"] // block_d))
        source = past if past is not None else new
        launch(_append_cache_kernel, (batch, groups, -(-(before + length) // block_t)))(
            source, new, cache, before, length, width, *source.stride(), *new.stride(),
            *cache.stride(), BLOCK_T=block_t, BLOCK_D=block_d, HAS_PAST=past is not None,
            num_warps=tiles["num_warps"],
        )
    return cache


def split_keys(total: int, lanes: int, block_n: int, split: int, programs: int) -> int:
    """Keys per split of the decode path: whole ``block_n`` blocks, at least ``split`` keys, as
    few as give ``lanes`` x splits about ``programs`` programs."""
    blocks = -(-total // block_n)
    wanted = max(1, -(-programs // max(lanes, 1)))
    per_split = max(-(-split // block_n), -(-blocks // wanted), 1)
    return per_split * block_n


class SplitDecode:
    """The split-key decode's launch plan for ``query`` (b, h, l, d) over ``total`` keys of
    ``kv_heads`` heads (the cache's length, or a pool's capacity): meta-parameters, lanes, keys
    per split, and the float32 partials (m, n (b, h, l, splits); acc (b, h, l, splits, e))."""

    def __init__(self, query, kv_heads: int, total: int, value_dim: int, dot16: bool):
        batch, heads, length, head_dim = query.shape
        gpu = configs.ATTENTION_DECODE_GPU if dot16 else configs.ATTENTION_DECODE_F32_GPU
        self.tiles = tiles = configs.pick(query.device, gpu, configs.ATTENTION_DECODE_CPU)
        rows = heads // kv_heads * length
        self.block_m = configs.rows_block(rows, tiles["block_m"])
        self.lanes = batch * kv_heads * -(-rows // self.block_m)
        self.split_len = split_keys(
            total, self.lanes, tiles["block_n"], tiles["split"], tiles["programs"]
        )
        self.splits = -(-total // self.split_len)
        self.block_d = max(16, next_power_of_2(head_dim))
        self.block_e = max(16, next_power_of_2(value_dim))
        f32 = dict(dtype=torch.float32, device=query.device)
        self.m = torch.empty((batch, heads, length, self.splits), **f32)
        self.norm = torch.empty((batch, heads, length, self.splits), **f32)
        self.acc = torch.empty((batch, heads, length, self.splits, value_dim), **f32)

    def combine(self, out) -> None:
        """Merge each query row's splits into ``out`` (b, h, l, e)."""
        batch, heads, length, value_dim = out.shape
        launch(_attention_combine_kernel, (batch * heads, length))(
            self.m, self.norm, self.acc, out, heads, length, value_dim, self.splits,
            *out.stride(), BLOCK_S=self.tiles["block_s"], BLOCK_E=self.block_e,
            num_warps=self.tiles["combine_warps"],
        )


def _decode(query, keys, values, out, scale: float, dot16: bool) -> None:
    batch, heads, length, head_dim = query.shape
    kv_heads, total, value_dim = keys.shape[1], keys.shape[2], values.shape[3]
    plan = SplitDecode(query, kv_heads, total, value_dim, dot16)
    launch(_attention_split_kernel, (plan.lanes, plan.splits))(
        query, keys, values, plan.m, plan.norm, plan.acc, heads, heads // kv_heads, length,
        total - length, head_dim, value_dim, plan.split_len, plan.splits, float(scale),
        *query.stride(), *keys.stride(), *values.stride(), BLOCK_M=plan.block_m,
        BLOCK_N=plan.tiles["block_n"], BLOCK_D=plan.block_d, BLOCK_E=plan.block_e, DOT16=dot16,
        num_warps=plan.tiles["num_warps"],
    )
    plan.combine(out)


@launcher("attention")
def attention_fwd(query, key, value, scale: float, past_key=None, past_value=None):
    """``attention`` on Triton. query (b, h, l, d); key (b, g, l, d); value (b, g, l, e);
    past_key/past_value (b, g, p, d/e) -> (out (b, h, l, e) dtype of query, keys, values)."""
    batch, heads, length, head_dim = query.shape
    kv_heads, value_dim = key.shape[1], value.shape[3]
    keys, values = _cache(key, past_key), _cache(value, past_value)
    out = torch.empty((batch, heads, length, value_dim), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out, keys, values
    dot16 = configs.dot16(query.device, query.dtype, keys.dtype, values.dtype)
    if length <= DECODE_QUERIES:
        _decode(query, keys, values, out, scale, dot16)
        return out, keys, values
    block_d, block_e = max(16, next_power_of_2(head_dim)), max(16, next_power_of_2(value_dim))
    if not dot16:
        gpu = configs.ATTENTION_F32_GPU
    else:
        gpu = configs.ATTENTION_GPU if max(block_d, block_e) <= 64 else configs.ATTENTION_WIDE_GPU
    tiles = configs.pick(query.device, gpu, configs.ATTENTION_CPU)
    launch(_attention_kernel, (batch * heads, -(-length // tiles["block_m"])))(
        query, keys, values, out, heads, heads // kv_heads, length, keys.shape[2] - length,
        head_dim, value_dim, float(scale), *query.stride(), *keys.stride(), *values.stride(),
        *out.stride(), BLOCK_M=tiles["block_m"], BLOCK_N=tiles["block_n"], BLOCK_D=block_d,
        BLOCK_E=block_e, DOT16=dot16, num_warps=tiles["num_warps"],
    )
    return out, keys, values
