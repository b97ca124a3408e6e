"""Triton kernels of the captured decode's attention (``lowering/triton/pooled_step.py``): one new
position per row over fixed-capacity K/V pools addressed by slot indices, and the per-slot
counters the graph advances on the device.

Pools of one attention layer (S slots, capacity C positions): ``key_pool`` (S, g, C, d),
``value_pool`` (S, g, C, e); ``lengths`` (S,) int32 holds how many positions each slot has
cached. Row i of a batch of B rows reads and writes slot ``s = state_indices[i]`` (negative: a
padding row, skipped, its output zeros); with ``t = lengths[s]`` (< C: the host checks the
capacity before a generation)::

    key_pool[s, :, t] = key[i, :, 0]        value_pool[s, :, t] = value[i, :, 0]
    out[i, q, 0] = sum_{j <= t} softmax_j(scale <query[i, q, 0], K_j>) V_j
                   with K_j = key_pool[s, q // (h/g), j],  V_j = value_pool[s, q // (h/g), j]

which is ``ssmcc.attention`` at l = 1 given the slot's first t positions as its past. The lengths
are not advanced here: every attention layer of a step reads the same t, and ``advance_counts``
adds one per live row after the last of them. The same kernel, reading before it adds, is the
pooled ``ssmcc.positions`` (a (S, 1) int64 count per slot, the rotary position of the new token).

Launches per attention layer: ``_kv_pool_write_kernel`` (grid (B, g)), then the split-key decode
of ``attention.py`` over the pools (``_kv_pool_split_kernel``: grid (B * g * cdiv(h/g, BLOCK_M),
cdiv(C, split_len)), a split past a row's t + 1 keys attends nothing and leaves ``m = -inf,
n = 0``; a padding row's every split does) and ``attention.py``'s combine of the splits
(``SplitDecode``: the same launch plan and partials as the eager decode, at l = 1; a padding row
comes out zeros). The grid depends on the capacity, not on t: one launch replays for every token
of a generation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, online_softmax
from ssmcc.kernels.triton.attention import SplitDecode
from ssmcc.kernels.triton.runtime import launch, next_power_of_2
from ssmcc.kernels.triton.slots import check_indices
from ssmcc.ops._shapes import expect

OP = "attention (K/V pools)"


@triton.jit
def _kv_pool_write_kernel(
    new_ptr, pool_ptr, slots_ptr, lengths_ptr, capacity, width,
    s_nb, s_ng, s_nd, s_ps, s_pg, s_pt, s_pd,
    BLOCK_D: tl.constexpr,
):
    b = tl.program_id(0)
    g = tl.program_id(1)
    d = tl.arange(0, BLOCK_D)
    slot = tl.load(slots_ptr + b + d * 0)  # the row's slot in every lane
    live = slot >= 0
    slot = tl.where(live, slot, 0)
    t = tl.load(lengths_ptr + slot)
    keep = (d < width) & live & (t < capacity)
    v = tl.load(new_ptr + b * s_nb + g * s_ng + d * s_nd, mask=keep, other=0.0)
    tl.store(pool_ptr + slot * s_ps + g * s_pg + t * s_pt + d * s_pd,
             v.to(pool_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _kv_pool_split_kernel(
    q_ptr, k_ptr, v_ptr, slots_ptr, lengths_ptr, m_ptr, n_ptr, acc_ptr,
    heads, heads_per_kv, head_dim, value_dim, capacity, split_len, splits, scale,
    s_qb, s_qh, s_qd, s_ks, s_kg, s_kt, s_kd, s_vs, s_vg, s_vt, s_ve,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr,
    DOT16: tl.constexpr,
):
    row_blocks = tl.cdiv(heads_per_kv, BLOCK_M)
    kv_heads = heads // heads_per_kv
    lane = tl.program_id(0)
    b = lane // (kv_heads * row_blocks)
    g = (lane // row_blocks) % kv_heads
    r = (lane % row_blocks) * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(slots_ptr + b)
    live = slot >= 0
    slot = tl.where(live, slot, 0)
    t = tl.minimum(tl.load(lengths_ptr + slot), capacity - 1)  # the new key's position
    real = r < heads_per_kv
    h = g * heads_per_kv + r
    split = tl.program_id(1)
    start = split * split_len
    end = tl.where(live, tl.minimum(start + split_len, t + 1), start)
    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_E)
    q = tl.load(q_ptr + b * s_qb + h[:, None] * s_qh + d[None, :] * s_qd,
                mask=real[:, None] & (d[None, :] < head_dim), other=0.0)
    if not DOT16:
        q = q.to(tl.float32)
    m = tl.full((BLOCK_M,), float("-inf"), dtype=tl.float32)
    norm = tl.zeros((BLOCK_M,), dtype=tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    last = tl.zeros((BLOCK_M,), dtype=tl.int32) + t
    m, norm, acc = online_softmax.attend_keys(
        q, m, norm, acc, k_ptr + slot * s_ks + g * s_kg, v_ptr + slot * s_vs + g * s_vg,
        start, end, last, real, head_dim, value_dim, s_kt, s_kd, s_vt, s_ve, scale,
        BLOCK_N, BLOCK_D, BLOCK_E, DOT16,
    )
    at = (b * heads + h) * splits + split  # (b, h, split) of the partials
    tl.store(m_ptr + at, m, mask=real)  # a padding row's: nothing seen (m = -inf, n = 0)
    tl.store(n_ptr + at, norm, mask=real)
    tl.store(acc_ptr + at[:, None] * value_dim + e[None, :], acc,
             mask=real[:, None] & (e[None, :] < value_dim))


@triton.jit
def _count_kernel(counts_ptr, slots_ptr, read_ptr, rows, s_count, BLOCK: tl.constexpr,
                  READ: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = i < rows
    slot = tl.load(slots_ptr + i, mask=inside, other=-1)
    live = inside & (slot >= 0)
    at = tl.where(live, slot, 0) * s_count
    count = tl.load(counts_ptr + at, mask=live, other=0)
    if READ:
        tl.store(read_ptr + i, count.to(read_ptr.dtype.element_ty), mask=inside)
    tl.store(counts_ptr + at, count + 1, mask=live)


def check_pool_args(query, key, value, key_pool, value_pool, lengths, state_indices) -> None:
    batch, heads, length, head_dim = query.shape
    expect(length == 1, OP, f"a pooled step attends one new position per row, got {length}")
    expect(
        key_pool.dim() == value_pool.dim() == 4 and key_pool.shape[:3] == value_pool.shape[:3],
        OP,
        "key_pool and value_pool must be (slots, kv_heads, capacity, head_dim / value_dim) with "
        f"the same first three dims, got {tuple(key_pool.shape)} and {tuple(value_pool.shape)}",
    )
    slots, kv_heads, _, _ = key_pool.shape
    expect(
        tuple(key.shape) == (batch, kv_heads, 1, head_dim)
        and tuple(value.shape) == (batch, kv_heads, 1, value_pool.shape[3])
        and key_pool.shape[3] == head_dim
        and heads % kv_heads == 0,
        OP,
        f"query {tuple(query.shape)}, key {tuple(key.shape)} and value {tuple(value.shape)} do "
        f"not fit pools {tuple(key_pool.shape)} / {tuple(value_pool.shape)}",
    )
    expect(
        lengths.dtype == torch.int32 and tuple(lengths.shape) == (slots,),
        OP,
        f"lengths must be int32 of shape ({slots},), got {lengths.dtype} {tuple(lengths.shape)}",
    )
    check_indices(OP, batch, state_indices, key_pool.device)


def attention_pool_step_fwd(query, key, value, scale: float, key_pool, value_pool, lengths,
                            state_indices):
    """One decode position per row over K/V pools (module docstring): writes each live row's
    key/value at its slot's length, attends over the slot's positions up to it. query (B, h, 1,
    d); key (B, g, 1, d); value (B, g, 1, e) -> ``(out (B, h, 1, e) dtype of query,)`` (the
    pools are updated in place; ``lengths`` is only read)."""
    check_pool_args(query, key, value, key_pool, value_pool, lengths, state_indices)
    batch, heads, _, head_dim = query.shape
    _, kv_heads, capacity, _ = key_pool.shape
    value_dim = value_pool.shape[3]
    out = torch.empty((batch, heads, 1, value_dim), dtype=query.dtype, device=query.device)
    if out.numel() == 0:
        return (out,)
    slots = state_indices.to(torch.int32).contiguous()
    for new, pool in ((key, key_pool), (value, value_pool)):
        width = pool.shape[3]
        launch(_kv_pool_write_kernel, (batch, kv_heads))(
            new, pool, slots, lengths, capacity, width, new.stride(0), new.stride(1),
            new.stride(3), *pool.stride(), BLOCK_D=next_power_of_2(width), num_warps=1,
        )
    dot16 = configs.dot16(query.device, query.dtype, key_pool.dtype, value_pool.dtype)
    plan = SplitDecode(query, kv_heads, capacity, value_dim, dot16)
    launch(_kv_pool_split_kernel, (plan.lanes, plan.splits))(
        query, key_pool, value_pool, slots, lengths, plan.m, plan.norm, plan.acc, heads,
        heads // kv_heads, head_dim, value_dim, capacity, plan.split_len, plan.splits,
        float(scale), query.stride(0), query.stride(1), query.stride(3), *key_pool.stride(),
        *value_pool.stride(), BLOCK_M=plan.block_m, BLOCK_N=plan.tiles["block_n"],
        BLOCK_D=plan.block_d, BLOCK_E=plan.block_e, DOT16=dot16,
        num_warps=plan.tiles["num_warps"],
    )
    plan.combine(out)
    return (out,)


def _count(counts, state_indices, read) -> None:
    rows = state_indices.shape[0]
    if rows == 0:
        return
    block = min(1024, next_power_of_2(rows))
    launch(_count_kernel, (-(-rows // block),))(
        counts, state_indices.to(torch.int32).contiguous(), read if read is not None else counts,
        rows, counts.stride(0), BLOCK=block, READ=read is not None, num_warps=1,
    )


def advance_counts(counts, state_indices) -> None:
    """``counts[state_indices[i]] += 1`` for every live row (a padding row, -1, skipped)."""
    check_indices("advance_counts", state_indices.shape[0], state_indices, counts.device)
    _count(counts, state_indices, None)


def positions_pool_fwd(input_ids, counts, state_indices):
    """``ssmcc.positions`` for one new token per row, its count in a (S, 1) int64 pool: the
    position is the slot's count, which then grows by one -> ``(positions (B, 1) int64,)``
    (padding rows 0)."""
    batch, length = input_ids.shape
    expect(length == 1, "positions (pooled)", f"one new token per row, got {length}")
    expect(
        counts.dtype == torch.int64 and counts.dim() == 2 and counts.shape[1] == 1,
        "positions (pooled)",
        f"counts must be a (slots, 1) int64 pool, got {counts.dtype} {tuple(counts.shape)}",
    )
    check_indices("positions (pooled)", batch, state_indices, counts.device)
    positions = torch.empty((batch, 1), dtype=torch.int64, device=input_ids.device)
    _count(counts, state_indices, positions)
    return (positions,)
