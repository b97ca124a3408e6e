"""Pieces of the Mamba-2 (SSD) math shared by ``ssd_scan`` and ``ssd_state_update``.

``discretized_dt``: ``dt' = clamp(softplus(dt + dt_bias), dt_min, dt_max)`` in float32 (bias and
softplus when requested; ``dt_bias`` broadcasts over the last, per-head axis).
``heads_of_groups``: B or C with one slice per head: head i reads group ``i // (heads / g)``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor


def discretized_dt(
    dt: Tensor, dt_bias: Tensor | None, dt_softplus: bool, dt_min: float, dt_max: float | None
) -> Tensor:
    step = dt.float()
    if dt_bias is not None:
        step = step + dt_bias.float()
    if dt_softplus:
        step = F.softplus(step)
    return step.clamp(min=dt_min, max=dt_max)


def heads_of_groups(t: Tensor, heads: int, axis: int) -> Tensor:
    return t.repeat_interleave(heads // t.shape[axis], dim=axis)
