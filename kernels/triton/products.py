"""Device functions of the tiled matrix products (``linear.py``, ``moe_experts.py``): a weight
tile times a tile of activations, with the weight's scales, and a grouped GEMM's tile lookup.

A weight W (rows, inputs) stored small has ``scale`` (rows, G) float32: ``W[r, c] = weight[r, c]
* scale[r, c // (inputs / G)]``. Kernels reach these functions through the module
(``products.times_weight``), so they are no kernels of the calling module.

Operands: with ``DOT16`` the activations are 16-bit and the weight (16-bit of that dtype, or int8,
exact in it) is multiplied unscaled on tensor cores; else both are float32 and multiplied in IEEE
float32 (FMAs, no TF32). The accumulator is float32 either way. How a scale is applied
(``scale_mode``, a compile-time constant):

    NO_SCALE    no scale
    PER_ROW     one group per row (G = 1): the finished sum is scaled once, by the caller
    PER_BLOCK   a step of BLOCK_K inputs lies in one group (BLOCK_K divides the group): on
                tensor cores each step's product is scaled per output column (exact: the
                16-bit products are exact, the scaling float32); in float32 the tile is
                dequantised by its one scale per column, as the reference does
    PER_ELEMENT groups a step would straddle: the tile is dequantised in float32 before the
                product (float32 products, no DOT16)
"""

from __future__ import annotations

import triton
import triton.language as tl

NO_SCALE, PER_ROW, PER_BLOCK, PER_ELEMENT = 0, 1, 2, 3


def block_k(inputs: int, groups: int, block: int) -> int:
    """Inputs per step of a product over ``inputs`` in ``groups`` scale groups: a power of two
    up to ``block`` (at least 16, the least ``tl.dot`` takes), halved while it does not divide
    a group (``groups`` 1: any)."""
    step = max(16, min(block, 1 << max(0, inputs - 1).bit_length()))
    group = inputs // groups if groups > 1 else 0
    while group and step > 16 and group % step:
        step //= 2
    return step


def dequantised_first(inputs: int, scale) -> bool:
    """Whether ``scale`` (rows, G) or (experts, rows, G) has groups that no step of 16 inputs
    or more fits in (``PER_ELEMENT``: float32 products)."""
    return scale is not None and scale.shape[-1] > 1 and (inputs // scale.shape[-1]) % 16 != 0


def scale_mode(inputs: int, scale, step: int) -> int:
    """How a product with steps of ``step`` inputs applies ``scale`` (rows, G) or
    (experts, rows, G); None: no scale."""
    if scale is None:
        return NO_SCALE
    groups = scale.shape[-1]
    if groups == 1:
        return PER_ROW
    return PER_BLOCK if (inputs // groups) % step == 0 else PER_ELEMENT


@triton.jit
def times_weight(acc, x, w_ptrs, s_cols, k, k0, group_len, s_sg, mask, mask_cols,
                 SCALE: tl.constexpr, DOT16: tl.constexpr):
    """``acc + x W`` for one (BLOCK_K, cols) tile of a weight at ``w_ptrs`` (x: (rows,
    BLOCK_K), already 16-bit or float32 as ``DOT16`` says; ``s_cols``: the columns' scale rows;
    ``k``: the step's inputs, from ``k0``; ``mask`` / ``mask_cols``: the tile's / its columns')."""
    W = tl.load(w_ptrs, mask=mask, other=0.0)
    if SCALE == 3:  # PER_ELEMENT
        W = W.to(tl.float32) * tl.load(s_cols[None, :] + (k[:, None] // group_len) * s_sg,
                                       mask=mask, other=0.0)
        return tl.dot(x, W, acc, input_precision="ieee")
    if not DOT16:
        W = W.to(tl.float32)
        if SCALE == 2:  # PER_BLOCK in float32: dequantised as the reference, one fewer tile
            W *= tl.load(s_cols + (k0 // group_len) * s_sg, mask=mask_cols, other=0.0)[None, :]
        return tl.dot(x, W, acc, input_precision="ieee")
    W = W.to(x.dtype)
    if SCALE == 2:  # PER_BLOCK on tensor cores: the step's product scaled per column
        scale = tl.load(s_cols + (k0 // group_len) * s_sg, mask=mask_cols, other=0.0)
        return acc + tl.dot(x, W) * scale[None, :]
    return tl.dot(x, W, acc)


@triton.jit
def grouped_tile(starts_ptr, counts_ptr, tile_ends_ptr, experts,
                 BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """(expert, rows of the sorted pairs, their mask, live) of this program's tile
    (``program_id(0)``) of a grouped GEMM: expert e owns tiles [tile_ends[e-1], tile_ends[e])
    and its pairs are rows [starts[e], starts[e] + counts[e]). A tile past the last is not
    live: no rows."""
    tile = tl.program_id(0)
    ex = tl.arange(0, BLOCK_E)
    ends = tl.load(tile_ends_ptr + ex, mask=ex < experts, other=0x7FFFFFFF)
    expert = tl.sum((ends <= tile).to(tl.int32), axis=0)  # experts whose tiles all come before
    live = expert < experts
    expert = tl.where(live, expert, 0)
    first = tl.max(tl.where(ends <= tile, ends, 0), axis=0)  # the expert's first tile
    local = (tile - first) * BLOCK_M + tl.arange(0, BLOCK_M)
    count = tl.where(live, tl.load(counts_ptr + expert), 0)
    rows = tl.load(starts_ptr + expert) + local
    return expert, rows, local < count, live
