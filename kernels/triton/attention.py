"""Triton kernels for ``ssmcc::attention`` — causal grouped-head attention carrying its K/V cache.

Math (``ssmcc.ops.attention``): ``K = concat(past_key, key)``, ``V = concat(past_value, value)``
along positions (p cached, l new); query row i of head q (absolute position p + i) reads K/V head
``q // (h / g)``::

    s_ij   = scale <query[q, i], K[j]>        for j <= p + i
    out[q, i] = sum_j softmax_j(s_i) V[j]     (float32, rounded once to the query's dtype)

``keys``/``values`` (the caches after the call) are written first by a copy kernel; the attention
kernel then reads them. It is the flash-attention loop: a program holds ``block_m`` query rows,
walks the visible keys ``block_n`` at a time and keeps a running maximum ``m``, normaliser ``l``
and weighted sum, so the (l, p + l) score matrix is never stored::

    m' = max(m, max_j s_ij);  l' = l e^(m - m') + sum_j e^(s_ij - m');  acc' = acc e^(m - m') + P V
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs
from ssmcc.kernels.triton.runtime import launch, next_power_of_2


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
):
    b = tl.program_id(0) // heads
    h = tl.program_id(0) % heads
    g = h // heads_per_kv
    i = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_E)
    mask_i = i < length
    q = tl.load(q_ptr + b * s_qb + h * s_qh + i[:, None] * s_ql + d[None, :] * s_qd,
                mask=mask_i[:, None] & (d[None, :] < head_dim), other=0.0).to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    norm = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    visible = past + tl.minimum((tl.program_id(1) + 1) * BLOCK_M, length)  # keys any row sees
    for j0 in range(0, visible, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        kT = tl.load(k_ptr + b * s_kb + g * s_kg + j[None, :] * s_kt + d[:, None] * s_kd,
                     mask=(j[None, :] < visible) & (d[:, None] < head_dim), other=0.0)
        s = tl.dot(q, kT.to(tl.float32), input_precision="ieee") * scale
        seen = (j[None, :] <= past + i[:, None]) & mask_i[:, None]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
        p = tl.exp(s - m_safe[:, None])
        rescale = tl.exp(m - m_safe)
        norm = norm * rescale + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * s_vb + g * s_vg + j[:, None] * s_vt + e[None, :] * s_ve,
                    mask=(j[:, None] < visible) & (e[None, :] < value_dim), other=0.0)
        acc = acc * rescale[:, None] + tl.dot(p, v.to(tl.float32), input_precision="ieee")
        m = m_new
    acc = acc / tl.where(norm == 0.0, 1.0, norm)[:, None]  # rows past the end saw nothing
    tl.store(out_ptr + b * s_ob + h * s_oh + i[:, None] * s_ol + e[None, :] * s_oe, acc,
             mask=mask_i[:, None] & (e[None, :] < value_dim))


def _cache(new, past):
    """concat(past, new) along positions, in new's dtype."""
    batch, groups, length, width = new.shape
    before = past.shape[2] if past is not None else 0
    cache = torch.empty((batch, groups, before + length, width), dtype=new.dtype,
                        device=new.device)
    if cache.numel():
        block_t = 64
        source = past if past is not None else new
        launch(_append_cache_kernel, (batch, groups, -(-(before + length) // block_t)))(
            source, new, cache, before, length, width, *source.stride(), *new.stride(),
            *cache.stride(), BLOCK_T=block_t, BLOCK_D=next_power_of_2(width),
            HAS_PAST=past is not None, num_warps=1,
        )
    return cache


def attention_fwd(query, key, value, scale: float, past_key=None, past_value=None):
    """``attention`` on Triton. query (b, h, l, d); key (b, g, l, d); value (b, g, l, e);
    past_key/past_value (b, g, p, d/e) -> (out (b, h, l, e) dtype of query, keys, values)."""
    batch, heads, length, head_dim = query.shape
    kv_heads, value_dim = key.shape[1], value.shape[3]
    keys, values = _cache(key, past_key), _cache(value, past_value)
    out = torch.empty((batch, heads, length, value_dim), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return out, keys, values
    tiles = configs.pick(query.device, configs.ATTENTION_GPU, configs.ATTENTION_CPU)
    block_m = configs.rows_block(length, tiles["block_m"])
    launch(_attention_kernel, (batch * heads, -(-length // block_m)))(
        query, keys, values, out, heads, heads // kv_heads, length, keys.shape[2] - length,
        head_dim, value_dim, float(scale), *query.stride(), *keys.stride(), *values.stride(),
        *out.stride(), BLOCK_M=block_m, BLOCK_N=tiles["block_n"],
        BLOCK_D=max(16, next_power_of_2(head_dim)), BLOCK_E=max(16, next_power_of_2(value_dim)),
        num_warps=tiles["num_warps"],
    )
    return out, keys, values
