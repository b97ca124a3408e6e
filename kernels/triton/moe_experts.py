"""Triton kernels for ``ssmcc::moe_experts`` — the chosen experts of a mixture-of-experts block.

Math (``ssmcc.ops.moe_experts``), token t with experts e_j and weights w_j (j < k), in float32::

    a_j    = act(G_j x_t) * (U_j x_t)       gated: up[e_j] = [G_j; U_j]   (else act(up[e_j] x_t))
    out_t  = sum_j w_j down[e_j] a_j

Weights stored small are widened in registers (``W = weight * scale`` per group of inputs). An
expert index outside [0, E) (expert parallelism's sentinel) adds nothing.

Two kernels, one (token, slot) pair per program row: ``up`` writes a_j (t k, i) float32 and
``down`` sums the k slots of a token, so no atomics and a deterministic sum. The products are
matrix-vector (a token's own expert): the decode shape. A prefill's tokens that share an expert
are not grouped into one matrix product here (the sorted, grouped GEMM is the next step for
prefill throughput on a GPU).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import activations
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


def moe_experts_fwd(hidden, top_k_index, top_k_weights, up, down, activation="silu",
                    gated=True, up_scale=None, down_scale=None) -> torch.Tensor:
    """``moe_experts`` on Triton. hidden (t, d); top_k_index, top_k_weights (t, k); up (E, u, d);
    down (E, d, i); scales (E, rows, G) or None -> (t, d) dtype of hidden."""
    tokens, dim = hidden.shape
    top_k = top_k_index.shape[1]
    experts, width = down.shape[0], down.shape[2]
    out = torch.empty((tokens, dim), dtype=hidden.dtype, device=hidden.device)
    if tokens == 0 or dim == 0:
        return out
    if top_k == 0 or width == 0:
        return out.zero_()
    active = torch.empty((tokens * top_k, width), dtype=torch.float32, device=hidden.device)
    block_w = min(64, next_power_of_2(width))
    block_k = min(128, next_power_of_2(dim))
    launch(_moe_up_kernel, (tokens * top_k, -(-width // block_w)))(
        hidden, top_k_index, up, up_scale if up_scale is not None else up, active,
        experts, top_k, dim, width, dim // (up_scale.shape[2] if up_scale is not None else 1),
        *hidden.stride(), *top_k_index.stride(), *up.stride(),
        *(up_scale.stride() if up_scale is not None else (0, 0, 0)), *active.stride(),
        BLOCK_W=block_w, BLOCK_K=block_k, GATED=bool(gated), HAS_SCALE=up_scale is not None,
        ACT=FORMS.index(activation), num_warps=4,
    )
    block_d = min(64, next_power_of_2(dim))
    launch(_moe_down_kernel, (tokens, -(-dim // block_d)))(
        active, top_k_index, top_k_weights, down,
        down_scale if down_scale is not None else down, out, experts, top_k, dim, width,
        width // (down_scale.shape[2] if down_scale is not None else 1),
        *active.stride(), *top_k_index.stride(), *top_k_weights.stride(), *down.stride(),
        *(down_scale.stride() if down_scale is not None else (0, 0, 0)), *out.stride(),
        BLOCK_D=block_d, BLOCK_W=min(128, next_power_of_2(width)),
        HAS_SCALE=down_scale is not None, num_warps=4,
    )
    return out
