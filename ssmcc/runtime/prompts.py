"""Prompts as generation takes them: one rectangular batch, or rows of different lengths.

Text makes ragged batches the normal case. ``prompt_rows`` accepts

- ids (b, l) -- every row ``l`` tokens long: one rectangular batch (the fast path);
- ids (b, l) with an ``attention_mask`` (b, l) of ones over each row's tokens and zeros over its
  padding, left or right, as Hugging Face tokenizers write it (``padding_side``): row i is
  ``ids[i, mask[i] == 1]``;
- a list of 1-D id sequences (lists or tensors) of any lengths >= 1.

Rows of different lengths are generated so that each row's tokens are exactly the tokens it
generates alone: every row is prefilled alone (no padding ever enters a state), then the rows
decode together (``runtime/compiled.py``).
"""

from __future__ import annotations

import torch

from ssmcc.errors import InputError
from ssmcc.frontend.inputs import check_token_ids


def _mask_rows(ids: torch.Tensor, attention_mask) -> list[torch.Tensor]:
    if not isinstance(attention_mask, torch.Tensor):
        raise InputError(
            f"attention_mask must be a tensor (batch, length), got {type(attention_mask).__name__}"
        )
    if tuple(attention_mask.shape) != tuple(ids.shape):
        raise InputError(
            f"attention_mask has shape {tuple(attention_mask.shape)}, input_ids "
            f"{tuple(ids.shape)}: they must match"
        )
    mask = attention_mask.long()
    if bool(((mask != 0) & (mask != 1)).any()):
        raise InputError("attention_mask must hold only 0 (padding) and 1 (token)")
    rows = []
    for i, row in enumerate(mask):
        kept = row.nonzero().flatten()
        if kept.numel() == 0:
            raise InputError(f"attention_mask row {i} is all zeros: every row needs a token")
        first, last = int(kept[0]), int(kept[-1])
        if last - first + 1 != kept.numel():
            raise InputError(
                f"attention_mask row {i} has padding between tokens (positions {first}..{last} "
                "are not all ones); pad on the left or on the right only"
            )
        rows.append(ids[i, first : last + 1])
    return rows


def prompt_rows(input_ids, vocab_size: int | None, attention_mask=None):
    """``(ids, None)`` for a rectangular batch without padding, else ``(None, rows)``: the 1-D
    id tensor of every row, each checked (ids in the vocabulary, at least one token)."""
    if isinstance(input_ids, (list, tuple)):
        if attention_mask is not None:
            raise InputError(
                "attention_mask goes with a padded (batch, length) tensor; a list of prompts "
                "needs none"
            )
        if not input_ids:
            raise InputError("the list of prompts is empty: pass at least one")
        rows = []
        for i, row in enumerate(input_ids):
            tensor = row if isinstance(row, torch.Tensor) else _as_ids(row, i)
            if tensor.dim() != 1:
                raise InputError(
                    f"prompt {i} has shape {tuple(tensor.shape)}: each prompt of a list is a "
                    "1-D sequence of token ids"
                )
            rows.append(check_token_ids(tensor[None], vocab_size, what=f"prompt {i}")[0])
        return _rectangular(rows)
    ids = check_token_ids(input_ids, vocab_size)
    if attention_mask is None:
        return ids, None
    return _rectangular(_mask_rows(ids, attention_mask))


def _as_ids(row, index: int) -> torch.Tensor:
    if not isinstance(row, (list, tuple)) or not all(
        isinstance(t, int) and not isinstance(t, bool) for t in row
    ):
        raise InputError(
            f"prompt {index} must be a list of int token ids or a 1-D tensor, got "
            f"{type(row).__name__}"
            + (" (tokenize text with the model's tokenizer)" if isinstance(row, str) else "")
        )
    return torch.tensor(row, dtype=torch.long)


def _rectangular(rows: list[torch.Tensor]):
    """Equal lengths stack into one batch; otherwise the rows stay rows."""
    if len({row.numel() for row in rows}) == 1:
        return torch.stack(rows), None
    return None, rows
