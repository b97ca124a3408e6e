"""Prompts of different lengths in one call: a list of rows, or padded ids with an
``attention_mask`` (either side). Every row must generate exactly the tokens it generates alone,
on every target, with chunked prefill and the prefix cache, for SSM-only models (rows decode as
one batch) and hybrids with K/V caches (rows decode apart)."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError
from ssmcc.presets import build_preset

from .conftest import make_hf_model

LENGTHS = (1, 5, 17)


def _rows(vocab: int) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    return [torch.randint(0, vocab, (n,), generator=generator) for n in LENGTHS]


def _alone(compiled, rows, new, **kwargs) -> list[torch.Tensor]:
    return [compiled.generate(row[None], new, **kwargs)[0] for row in rows]


def _padded(rows, side: str):
    width = max(r.numel() for r in rows)
    ids = torch.full((len(rows), width), 7, dtype=torch.long)  # the pad id is never read
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for i, row in enumerate(rows):
        span = slice(width - row.numel(), width) if side == "left" else slice(0, row.numel())
        ids[i, span], mask[i, span] = row, 1
    return ids, mask


MODELS = {
    "mamba": lambda: make_hf_model("mamba"),
    "mamba2": lambda: make_hf_model("mamba2"),
    "jamba": lambda: build_preset("jamba-tiny"),  # attention K/V caches: rows decode apart
}


# on onnx with the slow tests (the rows are the runtime's, shared by the targets; the torch
# target covers them by default, jamba the rows-apart path)
CASES = [
    pytest.param(family, target, marks=[pytest.mark.slow] if target == "onnx" else [])
    for family in MODELS
    for target in ("torch", "onnx")
]


@pytest.mark.parametrize("family,target", CASES)
def test_each_row_generates_what_it_generates_alone(family, target):
    model = MODELS[family]()
    compiled = ssmcc.compile(model, target)
    rows = _rows(model.config.vocab_size)
    alone = _alone(compiled, rows, 6)
    together = compiled.generate(rows, 6)
    assert [t.tolist() for t in together] == [a.tolist() for a in alone]
    ids, mask = _padded(rows, "left")
    padded = compiled.generate(ids, 6, attention_mask=mask)
    assert padded.shape == (3, ids.shape[1] + 6) and torch.equal(padded[:, : ids.shape[1]], ids)
    assert [p[-6:].tolist() for p in padded] == [a[-6:].tolist() for a in alone]
    streamed = torch.stack(list(compiled.stream(rows, 6)), dim=1)
    assert [s.tolist() for s in streamed] == [a[-6:].tolist() for a in alone]


def test_right_padding_chunks_prefix_cache_and_eos():
    model = make_hf_model("mamba")
    compiled = ssmcc.compile(model, "torch", chunk_size=4)
    rows = _rows(model.config.vocab_size)
    alone = _alone(compiled, rows, 6, chunk_size=3)
    ids, mask = _padded(rows, "right")
    out = compiled.generate(ids, 6, attention_mask=mask, chunk_size=3)
    assert [o[-6:].tolist() for o in out] == [a[-6:].tolist() for a in alone]
    cache = ssmcc.PrefixCache(1 << 24)
    for _ in range(2):  # the second call restarts the rows from cached prefixes
        again = compiled.generate(rows, 6, prefix_cache=cache)
        assert [a.tolist() for a in again] == [a.tolist() for a in alone]
    assert cache.stats["hits"] > 0
    eos = int(alone[2][-4])  # a token row 2 generates: that row stops there, the others go on
    stopped = compiled.generate(rows, 6, eos_token_id=eos)
    for row, full, got in zip(rows, alone, stopped, strict=True):
        new = full[row.numel() :].tolist()
        if eos in new:
            cut = new.index(eos)
            new = new[: cut + 1] + [eos] * (len(got) - row.numel() - cut - 1)
        assert got[row.numel() :].tolist() == new[: len(got) - row.numel()]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda c: c.generate([], 2), "list of prompts is empty"),
        (lambda c: c.generate([[1, 2], []], 2), "prompt 1 is an empty sequence"),
        (lambda c: c.generate([[1, 2], ["a"]], 2), "prompt 1 must be a list of int token ids"),
        (lambda c: c.generate([torch.ones(2, 2, dtype=torch.long)], 2), "each prompt of a list"),
        (
            lambda c: c.generate(
                torch.ones(2, 3, dtype=torch.long),
                2,
                attention_mask=torch.tensor([[1, 0, 1], [1, 1, 1]]),
            ),
            "padding between tokens",
        ),
        (
            lambda c: c.generate(
                torch.ones(2, 3, dtype=torch.long), 2, attention_mask=torch.zeros(2, 3)
            ),
            "row 0 is all zeros",
        ),
        (
            lambda c: c.generate(
                torch.ones(2, 3, dtype=torch.long), 2, attention_mask=torch.ones(2, 4)
            ),
            "attention_mask has shape (2, 4)",
        ),
        (lambda c: c.generate([[1, 2]], 2, attention_mask=torch.ones(1, 2)), "needs none"),
    ],
)
def test_bad_prompt_batches_are_named(call, message):
    compiled = ssmcc.compile(build_preset("mamba-tiny"), "torch")
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call(compiled)
