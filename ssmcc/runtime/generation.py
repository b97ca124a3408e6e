"""Token generation over a compiled model's ``prefill`` and ``step``.

    logits, state = prefill()                            # once, over the whole prompt
    token = choose(logits[:, -1]); repeat: logits, state = step(token, state)

``choose`` is greedy (argmax) or sampling: logits / temperature, then top-k, then top-p (nucleus)
filtering (``filtered_scores``), then a draw from the softmax with a seeded generator. A target
may decode on its device instead (``stream``'s ``device_decode``: the triton target's CUDA
graphs choose the tokens there); a seed then promises the same tokens on that target, not the
same as this loop's. ``eos_token_id`` is one id or several (as Hugging Face's ``generate`` takes
it); a row that produced one of them keeps emitting that one; generation stops early when every
row has. ``stream`` yields each new token column as it is produced.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator

import torch

from ssmcc.errors import InputError

SEEDS = (-(2**63), 2**64)


@dataclasses.dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None

    def check(self) -> None:
        """``InputError`` naming the first setting that is not usable (NaN, a bool, ...)."""
        if not isinstance(self.do_sample, bool):
            raise InputError(f"do_sample must be True or False, got {self.do_sample!r}")
        if not _is_real(self.temperature) or not 0 < self.temperature < math.inf:
            raise InputError(f"temperature must be a finite number > 0, got {self.temperature!r}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise InputError(f"top_k must be an integer >= 1, got {self.top_k!r}")
        if self.top_p is not None and (not _is_real(self.top_p) or not 0 < self.top_p <= 1):
            raise InputError(f"top_p must be a number in (0, 1], got {self.top_p!r}")
        if self.seed is not None and not (_is_int(self.seed) and SEEDS[0] <= self.seed < SEEDS[1]):
            shown = repr(self.seed) if len(repr(self.seed)) <= 40 else f"{self.seed:.3e}"
            raise InputError(
                f"seed must be an integer in [-2**63, 2**64) (what torch's generators take), "
                f"got {shown}"
            )


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    """An int or float that is not a bool and not NaN (NaN compares false with everything)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def check_eos_token_id(eos_token_id, vocab_size: int | None) -> tuple[int, ...] | None:
    """None, or the ids of ``eos_token_id`` (one id, or a non-empty list or tuple of them), each
    inside the vocabulary."""
    if eos_token_id is None:
        return None
    ids = tuple(eos_token_id) if isinstance(eos_token_id, (list, tuple)) else (eos_token_id,)
    vocabulary = f" [0, {vocab_size})" if vocab_size is not None else ""
    for token in ids:
        inside = _is_int(token) and token >= 0 and (vocab_size is None or token < vocab_size)
        if not inside:
            raise InputError(
                f"eos_token_id must be a token id in the vocabulary{vocabulary} or a list of "
                f"them, got {eos_token_id!r}"
            )
    if not ids:
        raise InputError("eos_token_id is an empty list: give at least one id, or None")
    return ids


def filtered_scores(logits: torch.Tensor, sampling: Sampling) -> torch.Tensor:
    """Scores (b, vocab) a sample is drawn from, softmax-ed: logits / temperature, then top-k,
    then top-p (nucleus) filtering (a dropped token's score is -inf)."""
    scores = logits.float() / sampling.temperature
    if sampling.top_k is not None:
        kth = torch.topk(scores, min(sampling.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if sampling.top_p is not None and sampling.top_p < 1:
        ordered, order = torch.sort(scores, descending=True, dim=-1)
        cumulative = ordered.softmax(-1).cumsum(-1)
        drop = cumulative - ordered.softmax(-1) >= sampling.top_p  # keep the first past top_p
        scores = scores.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return scores


def choose(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None):
    """Next token per row from logits (b, vocab)."""
    if not sampling.do_sample:
        return logits.argmax(-1)
    scores = filtered_scores(logits, sampling)
    return torch.multinomial(scores.softmax(-1), 1, generator=generator)[:, 0]


class _EndOfSequence:
    """Rows that produced an ``eos_token_id`` keep emitting it (as the eager loop feeds it)."""

    def __init__(self, batch: int, eos_token_id: tuple[int, ...] | None):
        self.ids = eos_token_id
        self.finished = torch.zeros(batch, dtype=torch.bool)
        self.ended_with = torch.zeros(batch, dtype=torch.long)  # the eos id each row produced
        self.stops = torch.tensor(eos_token_id or (), dtype=torch.long)

    def apply(self, token: torch.Tensor) -> torch.Tensor:
        if self.ids is None:
            return token
        token = torch.where(self.finished, self.ended_with, token)
        self.ended_with = torch.where(self.finished, self.ended_with, token)
        self.finished |= torch.isin(token, self.stops)
        return token

    @property
    def all_finished(self) -> bool:
        return self.ids is not None and bool(self.finished.all())


def stream(
    prefill: Callable,
    step: Callable,
    batch: int,
    max_new_tokens: int,
    sampling: Sampling = Sampling(),
    eos_token_id: tuple[int, ...] | None = None,
    device_decode: Callable | None = None,
) -> Iterator[torch.Tensor]:
    """Yield each new token column (b,) as it is produced: ``prefill()`` gives the last
    position's logits (b, vocab) and a state, ``step(tokens (b, 1), state)`` the next ones; the
    state is opaque here. ``eos_token_id``: the ids that end a row (``check_eos_token_id``).

    ``device_decode()``, where a target offers one, returns a session that decodes on the
    device (``session.columns(prefill, max_new_tokens)`` yields the chosen token columns,
    ``session.close()`` ends it) or None (this generation decodes here, step by step): the
    triton target's CUDA graphs. Its rows are fed their own tokens after an EOS; those are
    replaced here, so every row's output is the same as this loop's."""
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise InputError(f"max_new_tokens must be an integer >= 1, got {max_new_tokens!r}")
    sampling.check()
    eos = _EndOfSequence(batch, eos_token_id)
    session = device_decode() if device_decode is not None else None
    if session is not None:
        try:
            for column in session.columns(prefill, max_new_tokens):
                yield eos.apply(column)
                if eos.all_finished:
                    return
        finally:
            session.close()
        return
    generator = None
    if sampling.do_sample:
        generator = torch.Generator()
        generator.manual_seed(sampling.seed if sampling.seed is not None else torch.seed() % 2**63)
    logits, state = prefill()
    for produced in range(max_new_tokens):
        last = logits[:, -1] if logits.dim() == 3 else logits
        token = eos.apply(choose(last, sampling, generator))
        yield token
        if produced + 1 == max_new_tokens or eos.all_finished:
            return
        logits, state = step(token[:, None], state)
