"""Triton kernel for ``ssmcc::positions`` — absolute token positions counted across calls.

Math (``ssmcc.ops.positions``): ``positions[r, i] = past_count[r] + i`` and
``count[r] = past_count[r] + l`` (no count: 0). One program per (row, block of positions).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch


@triton.jit
def _positions_kernel(
    past_ptr, positions_ptr, count_ptr,
    length, s_pb, s_ob, s_ol, s_cb,
    BLOCK: tl.constexpr, HAS_PAST: tl.constexpr,
):
    r = tl.program_id(0)
    i = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    offsets = i.to(tl.int64)
    if HAS_PAST:
        start = tl.load(past_ptr + r * s_pb)
        tl.store(positions_ptr + r * s_ob + i * s_ol, start + offsets, mask=i < length)
        if tl.program_id(1) == 0:
            tl.store(count_ptr + r * s_cb, start + length)
    else:
        tl.store(positions_ptr + r * s_ob + i * s_ol, offsets, mask=i < length)
        if tl.program_id(1) == 0:
            tl.store(count_ptr + r * s_cb, length)


@launcher("positions")
def positions_fwd(input_ids, past_count=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions`` on Triton: input_ids (b, l), past_count (b, 1) int64 -> (positions (b, l),
    count (b, 1)) int64."""
    batch, length = input_ids.shape
    device = input_ids.device
    positions = torch.empty((batch, length), dtype=torch.int64, device=device)
    count = torch.empty((batch, 1), dtype=torch.int64, device=device)
    if batch:
        block = 256
        launch(_positions_kernel, (batch, max(1, -(-length // block))))(
            past_count if past_count is not None else count, positions, count, length,
            past_count.stride(0) if past_count is not None else 0, *positions.stride(),
            count.stride(0), BLOCK=block, HAS_PAST=past_count is not None, num_warps=1,
        )
    return positions, count
