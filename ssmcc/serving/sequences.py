"""The sequences a served model is running, and one batched execution of their requests.

The core of the Python backend's ``model.py`` (``triton_model.py``), free of Triton's types so
that it runs in-process too. A ``Request`` is one sequence's ``input_ids`` (an integer array of
shape (1, L): a prompt, a chunk of it, or one token) with the sequence batcher's controls START,
END and CORRID. ``Sequences.execute(requests)`` answers each with an ``Answer``: the last
position's logits (vocab,), or the request's own one-line error.

- Checked before any batch is formed, per request: ``input_ids`` an integer array of shape
  (1, L) with 1 <= L <= ``max_request_tokens`` and every id in [0, vocab); and, in its turn, a
  request without START must continue a sequence that holds a state here. A refused request is
  answered with its error and does nothing else but what its controls say for its own sequence
  (START drops the sequence's state, END frees it).
- A sequence with several requests in one execution runs them in order, one per round. Within a
  round, requests of distinct sequences with the same token count run as one call, their states
  stacked along the batch: ``step`` for one token, else the chunked ``prefill`` (last position's
  logits). A model whose states grow (K/V caches of different lengths) runs one request per call.
- A call that fails is retried request by request, so that only the request that makes it fail
  gets the error; the others get what they would have got alone. States are committed only once a
  call has succeeded, and the programs return new states without writing into their inputs, so a
  failed call leaves every sequence's state as it was before the call.
- A sequence idle for longer than ``idle_s`` (the batcher's ``max_sequence_idle_microseconds``)
  is freed; END frees it after its request.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from ssmcc.errors import InputError
from ssmcc.frontend.inputs import check_token_ids
from ssmcc.runtime.state import State


@dataclasses.dataclass
class Request:
    ids: object  # the request's input_ids as Triton gave them (None: the input is missing)
    corrid: int
    start: bool = False
    end: bool = False


@dataclasses.dataclass
class Answer:
    logits: torch.Tensor | None = None  # (vocab,)
    error: str | None = None


class UnknownSequence(LookupError):
    """A request without START for a sequence that holds no state here."""


@dataclasses.dataclass
class _Item:
    index: int  # of the request in the execution
    request: Request
    ids: torch.Tensor | None  # (1, L) int64; None when refused
    error: str | None


class _Batch:
    """States returned for a batch of sequences; each sequence refers to its row (freed when no
    sequence refers to it any more)."""

    def __init__(self, state: State):
        self.state = state

    def __len__(self) -> int:
        return self.state.batch

    def row(self, row: int) -> State:
        return type(self.state)({n: t[row : row + 1] for n, t in self.state.items()})


def _message(error: Exception, corrid: int | None = None) -> str:
    """``Type: [sequence N: ]first line`` of an error: one line for the client."""
    lines = str(error).strip().splitlines() or [""]
    sequence = f"sequence {corrid}: " if corrid is not None else ""
    return f"{type(error).__name__}: {sequence}{lines[0]}"


class Sequences:
    """States of the running sequences of ``model`` (a loaded streaming ``CompiledModel``), keyed
    by CORRID. ``max_request_tokens``: the most tokens one request may hold (None: no limit)."""

    def __init__(self, model, *, idle_s: float = 0.0, max_request_tokens: int | None = None):
        self.model = model
        self.specs = model.executable.specs
        self.vocab = model.vocab_size
        self.batched_steps = not any(spec.grows for spec in self.specs)
        self.idle_s = idle_s
        self.max_request_tokens = max_request_tokens
        self.states: dict[int, tuple[_Batch, int]] = {}  # CORRID -> its row of a batch
        self.last_used: dict[int, float] = {}

    # -- checks ------------------------------------------------------------------------------
    def check_ids(self, request: Request) -> torch.Tensor:
        """The request's ids as a (1, L) int64 tensor, or ``InputError`` saying what is wrong."""
        what = f"sequence {request.corrid}: input_ids"
        if request.ids is None:
            raise InputError(f"{what} is missing: send the token ids as input_ids (INT64)")
        ids = np.asarray(request.ids)
        if ids.dtype.kind not in "iu":
            raise InputError(f"{what} must hold integer token ids (INT64), got {ids.dtype}")
        if ids.ndim != 2 or ids.shape[0] != 1:
            raise InputError(
                f"{what} must have shape [1, L] (one sequence's ids), got {list(ids.shape)}"
            )
        limit = self.max_request_tokens
        if limit is not None and ids.shape[1] > limit:
            raise InputError(
                f"{what} holds {ids.shape[1]} tokens, more than this model's max_request_tokens "
                f"({limit}): send a longer prompt in requests of at most {limit} tokens (those "
                "after the first without START continue the sequence)"
            )
        if ids.dtype.kind == "u" and ids.size and int(ids.max()) > np.iinfo(np.int64).max:
            raise InputError(f"{what} holds token id {int(ids.max())}, outside the vocabulary")
        tensor = torch.from_numpy(np.ascontiguousarray(ids).astype(np.int64, copy=False))
        return check_token_ids(tensor, self.vocab, what=what)

    def _unknown(self, corrid: int) -> UnknownSequence:
        idle = f" or after {self.idle_s:g} s idle" if self.idle_s > 0 else ""
        return UnknownSequence(
            f"sequence {corrid} is unknown or has expired (freed at END{idle}): start it again "
            "with sequence_start=True and its prompt"
        )

    # -- execution ---------------------------------------------------------------------------
    def execute(self, requests: list[Request], now: float | None = None) -> list[Answer]:
        """One answer per request, in order (module docstring)."""
        now = time.monotonic() if now is None else now
        self._expire(now)
        answers: list[Answer | None] = [None] * len(requests)
        items = []
        for index, request in enumerate(requests):
            try:
                items.append(_Item(index, request, self.check_ids(request), None))
            except Exception as error:  # an answer per request, never a dead model
                items.append(_Item(index, request, None, _message(error)))
        for round_items in _rounds(items):
            runnable = []
            for item in round_items:
                corrid = item.request.corrid
                if item.request.start:
                    self.states.pop(corrid, None)
                elif item.error is None and corrid not in self.states:
                    item.error = _message(self._unknown(corrid))
                if item.error is None:
                    runnable.append(item)
                else:
                    answers[item.index] = Answer(error=item.error)
            for group in self._groups(runnable):
                self._run_or_retry(group, answers)
            for item in round_items:
                corrid = item.request.corrid
                if item.request.end:
                    self.states.pop(corrid, None)
                if corrid in self.states:
                    self.last_used[corrid] = now
                else:
                    self.last_used.pop(corrid, None)
        return answers

    def _expire(self, now: float) -> None:
        if self.idle_s <= 0:
            return
        for corrid in [c for c, t in self.last_used.items() if now - t > self.idle_s]:
            self.states.pop(corrid, None)
            self.last_used.pop(corrid, None)

    def _groups(self, items: list[_Item]) -> list[list[_Item]]:
        """Requests with the same token count, or one per group where states grow."""
        if not self.batched_steps:
            return [[item] for item in items]
        by_length: dict[int, list[_Item]] = {}
        for item in items:
            by_length.setdefault(item.ids.shape[1], []).append(item)
        return list(by_length.values())

    def _run_or_retry(self, group: list[_Item], answers: list) -> None:
        """Run the group as one call; if that fails, each request alone (only the failing ones
        are answered with their error)."""
        try:
            self._run(group, answers)
        except Exception as error:
            if len(group) == 1:
                item = group[0]
                answers[item.index] = Answer(error=_message(error, item.request.corrid))
                return
            for item in group:
                self._run_or_retry([item], answers)

    def _stacked(self, group: list[_Item]) -> State:
        """The group's states as one batch. A group that is exactly the batch an earlier call
        returned (the same sequences in the same order: decode in steady state) reuses it as it
        is; otherwise each sequence's rows are concatenated (zeros at START). For mamba-130m x 16
        sequences, copying the states apart and back together took 29 ms a step beside the
        step's 77 ms."""
        places = [None if i.request.start else self.states[i.request.corrid] for i in group]
        first = places[0]
        if first is not None and len(first[0]) == len(group):
            if all(p is not None and p[0] is first[0] and p[1] == r for r, p in enumerate(places)):
                return first[0].state
        rows = [State.zeros(self.specs, 1) if p is None else p[0].row(p[1]) for p in places]
        if len(rows) == 1:
            return rows[0]
        return State({s.name: torch.cat([r[s.name] for r in rows]) for s in self.specs})

    def _run(self, group: list[_Item], answers: list) -> None:
        """One call for requests of distinct sequences with the same token count; the states
        are committed (each sequence refers to its row of the returned batch) only after it."""
        ids = torch.cat([item.ids for item in group])
        stacked = self._stacked(group)
        if ids.shape[1] == 1 and not all(item.request.start for item in group):
            logits, state = self.model.step(ids[:, 0], stacked)
        else:
            logits, state = self.model.prefill(ids, stacked, last_only=True)
        rows = [logits[row].reshape(-1).float() for row in range(len(group))]
        batch = _Batch(state)
        for row, item in enumerate(group):
            self.states[item.request.corrid] = (batch, row)
            answers[item.index] = Answer(logits=rows[row])


def _rounds(items: list[_Item]):
    """Rounds in which each sequence appears once, in order: a sequence's later request waits
    for the next round."""
    while items:
        seen, now, later = set(), [], []
        for item in items:
            (later if item.request.corrid in seen else now).append(item)
            seen.add(item.request.corrid)
        yield now
        items = later
