"""Slot indices of a state pool, as the captured decode (``lowering/triton/pooled_step.py``)
passes them to the step launchers: ``state_indices`` (b,) int32 or int64, batch row i reading
and writing slot ``state_indices[i]`` of a (slots, ...) pool in place, a negative index marking
a padding row (skipped)."""

from __future__ import annotations

import torch

from ssmcc.ops._shapes import expect


def check_indices(op: str, batch: int, state_indices, device) -> torch.Tensor:
    """``state_indices`` checked against a batch of ``batch`` rows on ``device``, as int32."""
    expect(
        state_indices.dtype in (torch.int32, torch.int64)
        and tuple(state_indices.shape) == (batch,)
        and state_indices.device == torch.device(device),
        op,
        f"state_indices must be int32 or int64 of shape ({batch},) on {device}, got "
        f"{state_indices.dtype} {tuple(state_indices.shape)} on {state_indices.device}",
    )
    return state_indices.to(torch.int32).contiguous()


def check_pool(op: str, batch: int, state_indices, pool) -> torch.Tensor:
    """``check_indices``, and ``pool`` a contiguous float32 state pool the kernel updates."""
    indices = check_indices(op, batch, state_indices, pool.device)
    expect(
        pool.dtype == torch.float32 and pool.is_contiguous(),
        op,
        f"a state pool updated in place is contiguous float32, got {pool.dtype}"
        f"{'' if pool.is_contiguous() else ', not contiguous'}",
    )
    return indices
