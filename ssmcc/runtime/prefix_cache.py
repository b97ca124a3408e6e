"""Prefix state cache: the recurrent state after a token prefix, reused by later prompts.

An SSM's whole past is its state: after the prefix ``ids[:k]`` a model is fully described by the
state (a few MB, whatever ``k``) and the logits of token ``k - 1``. A prompt that starts with a
cached prefix therefore only computes the rest. Prefill stores the state at every chunk boundary
(``k`` a multiple of the chunk size), so the longest chunk-aligned cached prefix is found by
looking up ``k = floor(l / c) * c, ..., c``.

Keys are ``(model identity, k, SHA-256 of the k token ids)``, and a hit also compares the stored
ids token by token, so two prompts (or two models) never share a state by mistake. The cache is
bounded by bytes (states + logits + ids); the least recently used entries go first.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib

import torch

from ssmcc.errors import InputError


@dataclasses.dataclass
class CachedPrefix:
    tokens: torch.Tensor  # (k,) int64
    states: list[torch.Tensor]  # each (1, ...), in the model's state order
    last_logits: torch.Tensor  # (vocab,)

    @property
    def nbytes(self) -> int:
        tensors = [self.tokens, self.last_logits, *self.states]
        return sum(t.numel() * t.element_size() for t in tensors)


class PrefixCache:
    """``PrefixCache(max_bytes)``: pass it to ``prefill(..., prefix_cache=)`` or ``generate``.

    One cache can serve several compiled models (their identities are part of every key).
    ``stats`` counts lookups that hit or missed, stored entries and evictions.
    """

    def __init__(self, max_bytes: int):
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
            raise InputError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: collections.OrderedDict[tuple, CachedPrefix] = collections.OrderedDict()
        self.stats = collections.Counter(hits=0, misses=0, stored=0, evicted=0)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (
            f"PrefixCache({len(self)} prefixes, {self.bytes / 1e6:.1f} of "
            f"{self.max_bytes / 1e6:.1f} MB, {dict(self.stats)})"
        )

    @staticmethod
    def _key(model_id: str, tokens: torch.Tensor) -> tuple:
        digest = hashlib.sha256(tokens.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()
        return (model_id, tokens.numel(), digest)

    def check_fits(self, entry_bytes: int, what: str) -> None:
        """Refuse a budget that cannot hold one entry of this model."""
        if entry_bytes > self.max_bytes:
            raise InputError(
                f"prefix cache budget {self.max_bytes:,} bytes is smaller than one cached "
                f"prefix of {what} ({entry_bytes:,} bytes: its state and last logits); "
                f"use PrefixCache(max_bytes >= {entry_bytes:,})"
            )

    def get(self, model_id: str, tokens: torch.Tensor) -> CachedPrefix | None:
        key = self._key(model_id, tokens)
        entry = self._entries.get(key)
        if entry is None or not torch.equal(entry.tokens, tokens.to(torch.int64)):
            self.stats["misses"] += 1
            return None
        self._entries.move_to_end(key)
        self.stats["hits"] += 1
        return entry

    def put(
        self,
        model_id: str,
        tokens: torch.Tensor,
        states: list[torch.Tensor],
        last_logits: torch.Tensor,
    ) -> None:
        """Store copies of one row's state after ``tokens`` and the logits of its last token."""
        entry = CachedPrefix(
            tokens.to(torch.int64).clone(),
            [s.clone() for s in states],
            last_logits.detach().clone(),
        )
        self.check_fits(entry.nbytes, "this model")
        key = self._key(model_id, tokens)
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.nbytes
        while self._entries and self.bytes + entry.nbytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.bytes -= evicted.nbytes
            self.stats["evicted"] += 1
        self._entries[key] = entry
        self.bytes += entry.nbytes
        self.stats["stored"] += 1

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0
