"""Triton kernels for ``ssmcc::quantized_linear`` and ``ssmcc::quantized_embedding``, and the
matrix product the fused mixers' projections use.

Math (``ssmcc.ops.quantized_linear``), W (n, k) stored as ``weight`` (int8, bfloat16, float16 or,
for the mixers' float projections, float32) with ``scale`` (n, G) float32 or none::

    W[r, c]   = weight[r, c] * scale[r, c // (k / G)]       (no scale: W = weight)
    linear    = x W^T + bias        x (m, k) -> (m, n), accumulated in float32
    embedding = W[ids]              ids (...) -> (..., k) float32 (a 16-bit W without scale:
                                    the widened rows, written float32 directly)

The product is tiled: grid (cdiv(m, BLOCK_M), cdiv(n, BLOCK_N)), a program owns BLOCK_M x
BLOCK_N outputs and walks the inputs BLOCK_K at a time, the x tile contiguous along the inputs and
the weight read as W^T tiles, small, contiguous along the inputs too (each weight element once per
BLOCK_M rows). 16-bit x with a weight of its dtype (or int8) multiplies on tensor cores; anything
else in IEEE float32 ``tl.dot`` (not TF32), as the references; a scale is applied per row of W
after the sum, per step, or to the tile before the product (``products.py``). float32 tiles are
(64, 64) outputs by 16 inputs at 8 warps: at 32 inputs the FMA operands of a fp32-by-bf16 product
(a bf16 model's fp32 activations times its projections) spill at sm_90.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, products
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2


@triton.jit
def _linear_kernel(
    x_ptr, w_ptr, scale_ptr, bias_ptr, out_ptr,
    M, N, K, group_len,
    s_xm, s_xk, s_wn, s_wk, s_sn, s_sg, s_om, s_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, DOT16: tl.constexpr,
):
    m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    w_cols = w_ptr + n * s_wn  # (BLOCK_N,) rows of W: the tile is W^T (BLOCK_K, BLOCK_N)
    s_cols = scale_ptr + n * s_sn
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + m[:, None] * s_xm + k[None, :] * s_xk,
                    mask=(m[:, None] < M) & (k[None, :] < K), other=0.0)
        if not DOT16:
            x = x.to(tl.float32)
        acc = products.times_weight(acc, x, w_cols[None, :] + k[:, None] * s_wk, s_cols, k, k0,
                                    group_len, s_sg, (k[:, None] < K) & (n[None, :] < N),
                                    n < N, SCALE, DOT16)
    if SCALE == 1:  # one scale per output row of W
        acc *= tl.load(s_cols, mask=n < N, other=0.0)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + n, mask=n < N, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + m[:, None] * s_om + n[None, :] * s_on, acc,
             mask=(m[:, None] < M) & (n[None, :] < N))


@triton.jit
def _embedding_kernel(
    ids_ptr, w_ptr, scale_ptr, out_ptr,
    K, group_len,
    s_wn, s_wk, s_sn, s_sg, s_or,
    BLOCK_K: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    i = tl.program_id(0)
    k = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
    row = tl.load(ids_ptr + i)
    mask = k < K
    w = tl.load(w_ptr + row * s_wn + k * s_wk, mask=mask, other=0.0).to(tl.float32)
    if HAS_SCALE:
        w *= tl.load(scale_ptr + row * s_sn + (k // group_len) * s_sg, mask=mask, other=0.0)
    tl.store(out_ptr + i * s_or + k, w, mask=mask)


def linear_fwd(x, weight, scale=None, bias=None, out=None, out_dtype=None) -> torch.Tensor:
    """``x W^T + bias`` on Triton. x (..., k) any strides; weight (n, k); scale (n, G) or None;
    bias (n,) -> (..., n) in ``out_dtype`` (default x's), or written into ``out``."""
    lead, K = x.shape[:-1], x.shape[-1]
    N = weight.shape[0]
    rows = x.reshape(-1, K)
    M = rows.shape[0]
    if out is None:
        out = torch.empty((*lead, N), dtype=out_dtype or x.dtype, device=x.device)
    target = out.view(-1, N)
    if M == 0 or N == 0:
        return out
    if K == 0:
        target.copy_(bias.expand(M, N) if bias is not None else torch.zeros_like(target))
        return out
    groups = scale.shape[1] if scale is not None else 1
    dot16 = not products.dequantised_first(K, scale) and configs.dot16(
        x.device, x.dtype, weight.dtype
    )
    tiles = configs.pick(x.device, configs.MATMUL_GPU if dot16 else configs.MATMUL_F32_GPU,
                         configs.MATMUL_CPU)
    block_k = products.block_k(K, groups, tiles["block_k"])
    block_m = configs.rows_block(M, tiles["block_m"])
    block_n = max(16, min(tiles["block_n"], next_power_of_2(N)))
    launch(_linear_kernel, (-(-M // block_m), -(-N // block_n)))(
        rows, weight, scale if scale is not None else weight, bias if bias is not None else weight,
        target, M, N, K, K // groups, *rows.stride(), *weight.stride(),
        *(scale.stride() if scale is not None else (0, 0)), *target.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k,
        SCALE=products.scale_mode(K, scale, block_k), HAS_BIAS=bias is not None, DOT16=dot16,
        num_warps=tiles["num_warps"],
    )
    return out


@launcher("quantized_linear")
def quantized_linear_fwd(x, weight, scale, bias=None) -> torch.Tensor:
    """``quantized_linear`` on Triton: (..., k) -> (..., n) in x's dtype."""
    return linear_fwd(x, weight, scale, bias)


@launcher("quantized_embedding")
def quantized_embedding_fwd(ids, weight, scale=None) -> torch.Tensor:
    """``quantized_embedding`` on Triton: ids (...) int64 -> (..., k) float32; without ``scale``
    the rows of ``weight`` widened (the float32 lookup of a 16-bit table, no 16-bit copy)."""
    K = weight.shape[1]
    flat = ids.reshape(-1).contiguous()
    out = torch.empty((flat.shape[0], K), dtype=torch.float32, device=ids.device)
    if flat.shape[0] and K:
        block_k = min(1024, next_power_of_2(K))
        launch(_embedding_kernel, (flat.shape[0], -(-K // block_k)))(
            flat, weight, scale if scale is not None else weight, out,
            K, K // scale.shape[1] if scale is not None else 1, *weight.stride(),
            *(scale.stride() if scale is not None else (0, 0)), out.stride(0),
            BLOCK_K=block_k, HAS_SCALE=scale is not None, num_warps=4 if block_k >= 512 else 1,
        )
    return out.reshape(*ids.shape, K)
