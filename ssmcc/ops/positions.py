"""``ssmcc::positions`` — the absolute position of each token, counted across calls.

Shapes (b = batch, l = new tokens)::

    positions(input_ids (b, l), past_count (b, 1) int64?) -> positions (b, l) int64,
                                                           count (b, 1) int64

Math: ``positions[r, i] = past_count[r] + i`` and ``count = past_count + l`` (no count = 0: a new
sequence). A model that computes rotary embeddings from ``arange(l)`` is only right on its first
call; fed from this op instead, its chunk and step programs continue the numbering, because the
count is a state (``position``, never growing) that the prefill returns and the step takes.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ssmcc.ops._shapes import expect
from ssmcc.ops.contracts import register_state_contract, single_state
from ssmcc.ops.definition import define

OP = "positions"


def check_positions_args(input_ids, past_count) -> None:
    expect(
        input_ids.dim() == 2,
        OP,
        f"input_ids must have shape (batch, length), got {tuple(input_ids.shape)}",
    )
    if past_count is None:
        return
    expect(
        past_count.dtype == torch.int64,
        OP,
        f"past_count must be int64, got {past_count.dtype}",
    )
    expect(
        tuple(past_count.shape) == (input_ids.shape[0], 1),
        OP,
        f"past_count must have shape (batch, 1) = ({input_ids.shape[0]}, 1), got "
        f"{tuple(past_count.shape)}",
    )


def positions_ref(input_ids: Tensor, past_count: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Reference: the count plus an arange over the new tokens."""
    check_positions_args(input_ids, past_count)
    batch, length = input_ids.shape
    if past_count is None:
        past_count = torch.zeros(batch, 1, dtype=torch.int64, device=input_ids.device)
    offsets = torch.arange(length, dtype=torch.int64, device=input_ids.device)
    return past_count + offsets[None, :], past_count + length


@torch.library.custom_op("ssmcc::positions", mutates_args=())
def positions(input_ids: Tensor, past_count: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Absolute positions of the new tokens and the count after them."""
    return positions_ref(input_ids, past_count)


@positions.register_fake
def _positions_fake(input_ids, past_count=None):
    check_positions_args(input_ids, past_count)
    batch, length = input_ids.shape
    return (
        input_ids.new_empty(batch, length, dtype=torch.int64),
        input_ids.new_empty(batch, 1, dtype=torch.int64),
    )


def _positions_step(state, input_ids, past_count=None):
    """One more token: the same op, given the count."""
    return positions(input_ids, state)


register_state_contract(
    positions,
    single_state(
        kind="position",
        state_arg="past_count",
        state_output=1,
        shape=lambda args: (1,),
        dtype=lambda args: torch.int64,
        step=_positions_step,
        step_op="positions",
        per_layer=False,
    ),
)

POSITIONS = define(positions, positions_ref)
