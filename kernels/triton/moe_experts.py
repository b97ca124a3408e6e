"""Triton kernels for ``ssmcc::moe_experts`` — the chosen experts of a mixture-of-experts block.

Math (``ssmcc.ops.moe_experts``), token t with experts e_j and weights w_j (j < k), in float32::

    a_j    = act(G_j x_t) * (U_j x_t)       gated: up[e_j] = [G_j; U_j]   (else act(up[e_j] x_t))
    out_t  = sum_j w_j down[e_j] a_j

Weights stored small are widened in registers (``W = weight * scale`` per group of inputs). An
expert index outside [0, E) (expert parallelism's sentinel) adds nothing.

Prefill (more (token, slot) pairs than experts): a grouped GEMM, as vLLM's fused MoE. The pairs
are grouped by expert on the device (no host synchronisation: every size and grid is a function
of the shapes):

    _moe_route_kernel         grid (1,): counts the pairs per expert, and writes ``order`` (the
        pair ids t k + j sorted by expert, stable), ``starts`` / ``counts`` per expert and
        ``tile_ends`` (cumulative ``cdiv(count, BLOCK_M)``): one program, a one-hot
        (BLOCK, experts) block of pairs at a time, ranks by a cumulative sum along the pairs.
    _moe_up_grouped_kernel    grid (tiles, cdiv(width, BLOCK_W)), tiles = min(t k,
        cdiv(t k, BLOCK_M) + E) (a bound on the sum of cdiv(count, BLOCK_M); programs past the
        real tiles do nothing): a program finds its expert from ``tile_ends``, gathers the
        (BLOCK_M, BLOCK_K) rows of x of its tile's tokens and multiplies them by the
        (BLOCK_K, BLOCK_W) tiles of the gate and up rows (``tl.dot``), then writes a (sorted row
        order, so contiguous) to the scratch ``active`` (t k, i).
    _moe_down_grouped_kernel  grid (tiles, cdiv(d, BLOCK_D)): a (BLOCK_M, BLOCK_W) tile of
        ``active`` times the (BLOCK_W, BLOCK_D) tile of down, scaled by each pair's routing
        weight, written to the pair's row of the float32 scratch ``partial`` (t k, d).
    _moe_sum_kernel           grid (t, cdiv(d, BLOCK_D)): out_t = sum_j partial[t k + j] in
        slot order (no atomics: deterministic), skipping invalid experts.

An expert's weights are read once per tile of BLOCK_M of its pairs instead of once per pair.

Decode (t k <= E: on average at most one pair per expert, so grouping saves no weight reads,
while its routing pass and per-pair sum would cost two launches more): one program row per pair,
matrix-vector products (``tl.sum`` of broadcast products), today's design:

    _moe_up_kernel    grid (t k, cdiv(i, BLOCK_W)): a_j for BLOCK_W rows, written to ``active``.
    _moe_down_kernel  grid (t, cdiv(d, BLOCK_D)): sums the k pairs of a token in slot order.

Products: float32 accumulation. With 16-bit hidden states and weights of that dtype (or int8,
exact in it) the grouped GEMMs' operands stay 16-bit (tensor cores; ``configs.dot16``) and
``active`` is stored in that dtype (rounded once, 2^-9 relative in bf16, 2^-12 in fp16); a
weight with a scale is multiplied unscaled and each (BLOCK_K)-input partial product is scaled
per output row, exact as long as a block of inputs lies in one scale group (``BLOCK_K`` divides
the group, or one group per row); where it cannot, the tile is dequantised in float32 and the
products are float32. Anything else multiplies in IEEE float32 (no TF32), as the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import activations, configs, products
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2
from ssmcc.ops.activations import FORMS


@triton.jit
def _moe_up_kernel(
    x_ptr, idx_ptr, up_ptr, scale_ptr, act_ptr,
    experts, top_k, dim, width, group_len,
    s_xt, s_xd, s_it, s_ik, s_ue, s_ur, s_ud, s_se, s_sr, s_sg, s_as, s_aw,
    BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, GATED: tl.constexpr,
    HAS_SCALE: tl.constexpr, ACT: tl.constexpr,
):
    slot = tl.program_id(0)  # token * top_k + j
    token = slot // top_k
    expert = tl.load(idx_ptr + token * s_it + (slot % top_k) * s_ik)
    valid = (expert >= 0) & (expert < experts)
    expert = tl.where(valid, expert, 0)
    w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mask_w = w < tl.where(valid, width, 0)  # nothing of an invalid expert is read
    gate = tl.zeros((BLOCK_W,), dtype=tl.float32)
    value = tl.zeros((BLOCK_W,), dtype=tl.float32)
    for k0 in range(0, dim, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + token * s_xt + k * s_xd, mask=k < dim, other=0.0).to(tl.float32)
        mask = mask_w[:, None] & (k[None, :] < dim)
        rows = up_ptr + expert * s_ue + k[None, :] * s_ud
        W = tl.load(rows + w[:, None] * s_ur, mask=mask, other=0.0).to(tl.float32)
        if HAS_SCALE:
            W *= tl.load(scale_ptr + expert * s_se + w[:, None] * s_sr + (k[None, :] // group_len)
                         * s_sg, mask=mask, other=0.0)
        gate += tl.sum(W * x[None, :], axis=1)
        if GATED:
            U = tl.load(rows + (w[:, None] + width) * s_ur, mask=mask, other=0.0).to(tl.float32)
            if HAS_SCALE:
                U *= tl.load(scale_ptr + expert * s_se + (w[:, None] + width) * s_sr
                             + (k[None, :] // group_len) * s_sg, mask=mask, other=0.0)
            value += tl.sum(U * x[None, :], axis=1)
    a = activations.activate(gate, ACT)
    if GATED:
        a = a * value
    tl.store(act_ptr + slot * s_as + w * s_aw, tl.where(mask_w, a, 0.0), mask=w < width)


@triton.jit
def _moe_down_kernel(
    act_ptr, idx_ptr, weights_ptr, down_ptr, scale_ptr, out_ptr,
    experts, top_k, dim, width, group_len,
    s_as, s_aw, s_it, s_ik, s_wt, s_wk, s_de, s_dd, s_dw, s_se, s_sd, s_sg, s_ot, s_od,
    BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    token = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    out = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for j in range(0, top_k):
        expert = tl.load(idx_ptr + token * s_it + j * s_ik)
        valid = (expert >= 0) & (expert < experts)
        expert = tl.where(valid, expert, 0)
        weight = tl.load(weights_ptr + token * s_wt + j * s_wk).to(tl.float32)
        total = tl.zeros((BLOCK_D,), dtype=tl.float32)
        for w0 in range(0, width, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            a = tl.load(act_ptr + (token * top_k + j) * s_as + w * s_aw, mask=w < width,
                        other=0.0)
            mask = (d[:, None] < dim) & (w[None, :] < tl.where(valid, width, 0))
            W = tl.load(down_ptr + expert * s_de + d[:, None] * s_dd + w[None, :] * s_dw,
                        mask=mask, other=0.0).to(tl.float32)
            if HAS_SCALE:
                W *= tl.load(scale_ptr + expert * s_se + d[:, None] * s_sd
                             + (w[None, :] // group_len) * s_sg, mask=mask, other=0.0)
            total += tl.sum(W * a[None, :], axis=1)
        out += tl.where(valid, weight, 0.0) * total
    tl.store(out_ptr + token * s_ot + d * s_od, out, mask=d < dim)


@triton.jit
def _moe_route_kernel(
    idx_ptr, order_ptr, starts_ptr, counts_ptr, tile_ends_ptr,
    slots, experts, top_k, s_it, s_ik,
    BLOCK: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr,
):
    ex = tl.arange(0, BLOCK_E)
    counts = tl.zeros((BLOCK_E,), dtype=tl.int32)
    for i0 in range(0, slots, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        e = tl.load(idx_ptr + (i // top_k) * s_it + (i % top_k) * s_ik, mask=i < slots, other=-1)
        hit = (e[:, None] == ex[None, :]) & (ex[None, :] < experts)
        counts += tl.sum(hit.to(tl.int32), axis=0)
    starts = tl.cumsum(counts, axis=0) - counts
    tl.store(starts_ptr + ex, starts, mask=ex < experts)
    tl.store(counts_ptr + ex, counts, mask=ex < experts)
    tl.store(tile_ends_ptr + ex, tl.cumsum((counts + BLOCK_M - 1) // BLOCK_M, axis=0),
             mask=ex < experts)
    taken = starts  # pairs of each expert placed so far
    for i0 in range(0, slots, BLOCK):
        i = i0 + tl.arange(0, BLOCK)
        e = tl.load(idx_ptr + (i // top_k) * s_it + (i % top_k) * s_ik, mask=i < slots, other=-1)
        hit = ((e[:, None] == ex[None, :]) & (ex[None, :] < experts)).to(tl.int32)
        before = tl.cumsum(hit, axis=0) - hit  # earlier pairs of the same expert in this block
        at = tl.sum(hit * (taken[None, :] + before), axis=1)
        tl.store(order_ptr + at, i, mask=tl.sum(hit, axis=1) > 0)
        taken += tl.sum(hit, axis=0)


@triton.jit
def _moe_up_grouped_kernel(
    x_ptr, order_ptr, starts_ptr, counts_ptr, tile_ends_ptr, up_ptr, scale_ptr, act_ptr,
    experts, top_k, dim, width, group_len,
    s_xt, s_xd, s_ue, s_ur, s_ud, s_se, s_sr, s_sg, s_as, s_aw,
    BLOCK_M: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr,
    GATED: tl.constexpr, SCALE: tl.constexpr, ACT: tl.constexpr, DOT16: tl.constexpr,
):
    expert, rows, mask_r, live = products.grouped_tile(starts_ptr, counts_ptr, tile_ends_ptr,
                                                       experts, BLOCK_M, BLOCK_E)
    token = tl.load(order_ptr + rows, mask=mask_r, other=0) // top_k
    w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
    mask_w = w < width
    gate = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
    value = tl.zeros((BLOCK_M, BLOCK_W), dtype=tl.float32)
    g_rows = up_ptr + expert * s_ue + w * s_ur  # (BLOCK_W,) gate rows; up rows width further
    s_rows = scale_ptr + expert * s_se + w * s_sr
    for k0 in range(0, tl.where(live, dim, 0), BLOCK_K):  # a tile past the last does nothing
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + token[:, None] * s_xt + k[None, :] * s_xd,
                    mask=mask_r[:, None] & (k[None, :] < dim), other=0.0)
        if not DOT16:
            x = x.to(tl.float32)
        mask = (k[:, None] < dim) & mask_w[None, :]
        gate = products.times_weight(gate, x, g_rows[None, :] + k[:, None] * s_ud, s_rows, k,
                                     k0, group_len, s_sg, mask, mask_w, SCALE, DOT16)
        if GATED:
            value = products.times_weight(
                value, x, g_rows[None, :] + width * s_ur + k[:, None] * s_ud,
                s_rows + width * s_sr, k, k0, group_len, s_sg, mask, mask_w, SCALE, DOT16,
            )
    if SCALE == 1:  # one scale per row of the expert's matrix
        gate *= tl.load(s_rows, mask=mask_w, other=0.0)[None, :]
        if GATED:
            value *= tl.load(s_rows + width * s_sr, mask=mask_w, other=0.0)[None, :]
    a = activations.activate(gate, ACT)
    if GATED:
        a = a * value
    tl.store(act_ptr + rows[:, None] * s_as + w[None, :] * s_aw, a,
             mask=mask_r[:, None] & mask_w[None, :])


@triton.jit
def _moe_down_grouped_kernel(
    act_ptr, order_ptr, starts_ptr, counts_ptr, tile_ends_ptr, weights_ptr, down_ptr, scale_ptr,
    part_ptr,
    experts, top_k, dim, width, group_len,
    s_as, s_aw, s_wt, s_wk, s_de, s_dd, s_dw, s_se, s_sd, s_sg, s_pt, s_pd,
    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_W: tl.constexpr, BLOCK_E: tl.constexpr,
    SCALE: tl.constexpr, DOT16: tl.constexpr,
):
    expert, rows, mask_r, live = products.grouped_tile(starts_ptr, counts_ptr, tile_ends_ptr,
                                                       experts, BLOCK_M, BLOCK_E)
    slot = tl.load(order_ptr + rows, mask=mask_r, other=0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    acc = tl.zeros((BLOCK_M, BLOCK_D), dtype=tl.float32)
    d_rows = down_ptr + expert * s_de + d * s_dd
    s_rows = scale_ptr + expert * s_se + d * s_sd
    for w0 in range(0, tl.where(live, width, 0), BLOCK_W):
        w = w0 + tl.arange(0, BLOCK_W)
        a = tl.load(act_ptr + rows[:, None] * s_as + w[None, :] * s_aw,
                    mask=mask_r[:, None] & (w[None, :] < width), other=0.0)
        acc = products.times_weight(acc, a, d_rows[None, :] + w[:, None] * s_dw, s_rows, w, w0,
                                    group_len, s_sg, (w[:, None] < width) & (d[None, :] < dim),
                                    d < dim, SCALE, DOT16)
    if SCALE == 1:
        acc *= tl.load(s_rows, mask=d < dim, other=0.0)[None, :]
    weight = tl.load(weights_ptr + (slot // top_k) * s_wt + (slot % top_k) * s_wk, mask=mask_r,
                     other=0.0).to(tl.float32)
    tl.store(part_ptr + slot[:, None] * s_pt + d[None, :] * s_pd, acc * weight[:, None],
             mask=mask_r[:, None] & (d[None, :] < dim))


@triton.jit
def _moe_sum_kernel(
    part_ptr, idx_ptr, out_ptr,
    experts, top_k, dim,
    s_pt, s_pd, s_it, s_ik, s_ot, s_od,
    BLOCK_D: tl.constexpr,
):
    token = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    out = tl.zeros((BLOCK_D,), dtype=tl.float32)
    for j in range(0, top_k):
        expert = tl.load(idx_ptr + token * s_it + j * s_ik)
        valid = (expert >= 0) & (expert < experts)  # else the pair's row was never written
        out += tl.load(part_ptr + (token * top_k + j) * s_pt + d * s_pd,
                       mask=d < tl.where(valid, dim, 0), other=0.0)
    tl.store(out_ptr + token * s_ot + d * s_od, out, mask=d < dim)


def _groups(scale) -> int:
    return scale.shape[2] if scale is not None else 1


def _scale_args(scale, weight) -> tuple:
    """The scale pointer and its strides (the weight and zeros when there is none)."""
    return (weight, 0, 0, 0) if scale is None else (scale, *scale.stride())


def _per_slot(hidden, top_k_index, top_k_weights, up, down, out, code, gated, up_scale,
              down_scale) -> None:
    """Decode: one program row per (token, slot) pair, matrix-vector products."""
    tokens, dim = hidden.shape
    top_k, experts, width = top_k_index.shape[1], down.shape[0], down.shape[2]
    tiles = configs.pick(hidden.device, configs.MOE_DECODE_GPU, configs.MOE_DECODE_CPU)
    active = torch.empty((tokens * top_k, width), dtype=torch.float32, device=hidden.device)
    up_ptr, *up_strides = _scale_args(up_scale, up)
    block_w = min(tiles["block_w"], next_power_of_2(width))
    launch(_moe_up_kernel, (tokens * top_k, -(-width // block_w)))(
        hidden, top_k_index, up, up_ptr, active, experts, top_k, dim, width,
        dim // _groups(up_scale), *hidden.stride(), *top_k_index.stride(), *up.stride(),
        *up_strides, *active.stride(), BLOCK_W=block_w,
        BLOCK_K=min(tiles["block_k"], next_power_of_2(dim)), GATED=gated,
        HAS_SCALE=up_scale is not None, ACT=code, num_warps=tiles["num_warps"],
    )
    down_ptr, *down_strides = _scale_args(down_scale, down)
    block_d = min(tiles["block_d"], next_power_of_2(dim))
    launch(_moe_down_kernel, (tokens, -(-dim // block_d)))(
        active, top_k_index, top_k_weights, down, down_ptr, out, experts, top_k, dim, width,
        width // _groups(down_scale), *active.stride(), *top_k_index.stride(),
        *top_k_weights.stride(), *down.stride(), *down_strides, *out.stride(), BLOCK_D=block_d,
        BLOCK_W=min(tiles["block_k"], next_power_of_2(width)),
        HAS_SCALE=down_scale is not None, num_warps=tiles["num_warps"],
    )


def _grouped(hidden, top_k_index, top_k_weights, up, down, out, code, gated, up_scale,
             down_scale) -> None:
    """Prefill: the pairs grouped by expert, tiles of BLOCK_M pairs through ``tl.dot``."""
    tokens, dim = hidden.shape
    top_k, experts, width = top_k_index.shape[1], down.shape[0], down.shape[2]
    device, slots = hidden.device, tokens * top_k
    dot16 = not (
        products.dequantised_first(dim, up_scale) or products.dequantised_first(width, down_scale)
    ) and configs.dot16(device, hidden.dtype, up.dtype, down.dtype)
    gpu = configs.MOE_GROUPED_GPU if dot16 else configs.MOE_GROUPED_F32_GPU
    tiles = configs.pick(device, gpu, configs.MOE_GROUPED_CPU)
    up_k = products.block_k(dim, _groups(up_scale), tiles["block_k"])
    down_k = products.block_k(width, _groups(down_scale), tiles["block_k"])
    block_m = configs.rows_block(slots // experts, tiles["block_m"])
    block_e = max(2, next_power_of_2(experts))
    i32 = dict(dtype=torch.int32, device=device)
    order, starts = torch.empty(slots, **i32), torch.empty(experts, **i32)
    counts, tile_ends = torch.empty(experts, **i32), torch.empty(experts, **i32)
    launch(_moe_route_kernel, (1,))(
        top_k_index, order, starts, counts, tile_ends, slots, experts, top_k,
        *top_k_index.stride(), BLOCK=max(16, min(1024, tiles["route"] // block_e)),
        BLOCK_E=block_e, BLOCK_M=block_m, num_warps=tiles["num_warps"],
    )
    tiles_bound = min(slots, -(-slots // block_m) + experts)
    route = (order, starts, counts, tile_ends)
    active = torch.empty((slots, width), dtype=hidden.dtype if dot16 else torch.float32,
                         device=device)
    up_ptr, *up_strides = _scale_args(up_scale, up)
    up_mode = products.scale_mode(dim, up_scale, up_k)
    columns = tiles["block_w_dequantised" if up_mode == products.PER_ELEMENT else "block_w"]
    block_w = max(16, min(columns, next_power_of_2(width)))
    launch(_moe_up_grouped_kernel, (tiles_bound, -(-width // block_w)))(
        hidden, *route, up, up_ptr, active, experts, top_k, dim, width,
        dim // _groups(up_scale), *hidden.stride(), *up.stride(), *up_strides, *active.stride(),
        BLOCK_M=block_m, BLOCK_W=block_w, BLOCK_K=up_k, BLOCK_E=block_e, GATED=gated,
        SCALE=up_mode, ACT=code, DOT16=dot16,
        num_warps=tiles["num_warps"],
    )
    partial = torch.empty((slots, dim), dtype=torch.float32, device=device)
    down_ptr, *down_strides = _scale_args(down_scale, down)
    block_d = max(16, min(tiles["block_d"], next_power_of_2(dim)))
    launch(_moe_down_grouped_kernel, (tiles_bound, -(-dim // block_d)))(
        active, *route, top_k_weights, down, down_ptr, partial, experts, top_k, dim, width,
        width // _groups(down_scale), *active.stride(), *top_k_weights.stride(), *down.stride(),
        *down_strides, *partial.stride(), BLOCK_M=block_m, BLOCK_D=block_d, BLOCK_W=down_k,
        BLOCK_E=block_e, SCALE=products.scale_mode(width, down_scale, down_k), DOT16=dot16,
        num_warps=tiles["num_warps"],
    )
    launch(_moe_sum_kernel, (tokens, -(-dim // block_d)))(
        partial, top_k_index, out, experts, top_k, dim, *partial.stride(),
        *top_k_index.stride(), *out.stride(), BLOCK_D=block_d, num_warps=tiles["sum_warps"],
    )


@launcher("moe_experts")
def moe_experts_fwd(hidden, top_k_index, top_k_weights, up, down, activation="silu",
                    gated=True, up_scale=None, down_scale=None) -> torch.Tensor:
    """``moe_experts`` on Triton. hidden (t, d); top_k_index, top_k_weights (t, k); up (E, u, d);
    down (E, d, i); scales (E, rows, G) or None -> (t, d) dtype of hidden."""
    tokens, dim = hidden.shape
    top_k, experts, width = top_k_index.shape[1], down.shape[0], down.shape[2]
    out = torch.empty((tokens, dim), dtype=hidden.dtype, device=hidden.device)
    if tokens == 0 or dim == 0:
        return out
    if top_k == 0 or width == 0 or experts == 0:
        return out.zero_()
    args = (hidden, top_k_index, top_k_weights, up, down, out, FORMS.index(activation),
            bool(gated), up_scale, down_scale)
    if tokens * top_k <= experts:
        _per_slot(*args)
    else:
        _grouped(*args)
    return out
