"""Validation of token-id inputs, before anything reaches torch.export or a kernel."""

from __future__ import annotations

import torch

from ssmcc.errors import InputError


def check_token_ids(input_ids, vocab_size: int | None, what: str = "input_ids") -> torch.Tensor:
    """Return ``input_ids`` as a (batch, length) integer tensor, or raise ``InputError``.

    Rules: a torch integer tensor of rank 2, batch >= 1, length >= 1, every id >= 0, and when
    ``vocab_size`` is known every id below it.
    """
    if not isinstance(input_ids, torch.Tensor):
        raise InputError(
            f"{what} must be a torch.Tensor of token ids with shape (batch, length), "
            f"got {type(input_ids).__name__}"
        )
    if (
        input_ids.dtype.is_floating_point
        or input_ids.dtype.is_complex
        or input_ids.dtype == torch.bool
    ):
        raise InputError(
            f"{what} must hold integer token ids (torch.long), got dtype {input_ids.dtype}; "
            "tokenize the text first, or pass ids.long() if these are ids stored as floats"
        )
    if input_ids.dim() != 2:
        hint = " (add a batch dim: ids[None])" if input_ids.dim() == 1 else ""
        raise InputError(
            f"{what} must have shape (batch, length), got rank {input_ids.dim()} "
            f"{tuple(input_ids.shape)}{hint}"
        )
    batch, length = input_ids.shape
    if batch == 0:
        raise InputError(f"{what} has batch size 0 {tuple(input_ids.shape)}: pass at least one row")
    if length == 0:
        raise InputError(
            f"{what} is an empty sequence {tuple(input_ids.shape)}: pass at least one token"
        )
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0:
        raise InputError(f"{what} holds token id {low}: token ids are >= 0")
    if vocab_size is not None and high >= vocab_size:
        raise InputError(f"{what} holds token id {high}, outside the vocabulary [0, {vocab_size})")
    return input_ids.long()
