"""Seeded fuzzing of the serving core's batches (``ssmcc.serving.sequences``), in-process.

A case is a run of executions as Triton's sequence batcher hands them to the Python backend's
model: random requests of 6 sequences (prompts with START, continuations of several tokens and
single-token steps, END, START over a running sequence, several requests of one sequence in one
execution) mixed with bad ones (ids outside the vocabulary, negative, none, more than
``max_request_tokens``, float ids, a wrong rank, no input, a sequence without START). In one
execution in four the check of the vocabulary is widened (``Sequences.vocab``) so that an
out-of-vocabulary id passes it and fails inside the model's call instead: the call is retried
request by request.

Oracle: each sequence replayed alone. A good request's logits equal ``compiled.prefill`` of its
sequence's tokens so far (last position, 1e-4); a bad one gets an error naming its sequence and
what is wrong, and leaves its sequence as it was (a START still drops the old state, an END still
frees it); after every execution the model holds a state for exactly the sequences the replay
has running. Default: 3 seeds of 25 executions of mamba-tiny; ``slow``: 20 seeds more, and 6
of granite-hybrid-tiny (K/V caches: one request per call).
"""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
import torch

import ssmcc
from ssmcc.presets import build_preset
from ssmcc.serving.sequences import Request, Sequences

EXECUTIONS = 25
LIMIT = 12  # max_request_tokens
SEQUENCES = (1, 2, 3, 4, 5, 6)
BAD = {  # kind -> the words of its error
    "high": "outside the vocabulary",
    "negative": "token ids are >= 0",
    "empty": "is an empty sequence",
    "too_long": f"more than this model's max_request_tokens ({LIMIT})",
    "float": "must hold integer token ids",
    "rank": "must have shape [1, L]",
    "missing": "is missing",
}


@pytest.fixture(scope="module")
def compiled():
    return ssmcc.compile(build_preset("mamba-tiny").eval(), target="torch")


@pytest.fixture(scope="module")
def hybrid():
    """A model with K/V caches: its states grow, so each request runs alone."""
    return ssmcc.compile(build_preset("granite-hybrid-tiny").eval(), target="torch")


@dataclasses.dataclass
class Drawn:
    request: Request
    kind: str  # "good", a key of BAD, or "late" (passes the widened check, fails in the call)


def _draw(rng: random.Random, vocab: int, running: dict, widened: bool) -> Drawn:
    corrid = rng.choice(SEQUENCES)
    start = corrid not in running or len(running[corrid]) > 40 or rng.random() < 0.2
    end = rng.random() < 0.1
    length = rng.choice([1, 1, 1, 2, 3, 5, LIMIT])
    ids = np.array([[rng.randrange(vocab) for _ in range(length)]], dtype=np.int64)
    kind = "good"
    if rng.random() < 0.35:
        kind = "late" if widened and rng.random() < 0.5 else rng.choice(list(BAD))
        start = rng.random() < 0.5
        if kind in ("high", "late"):
            ids[0, rng.randrange(length)] = rng.choice([vocab, vocab + 7, 2**40])
            kind = "late" if widened and ids.max() < vocab + 100 else "high"  # past the check
        elif kind == "negative":
            ids[0, rng.randrange(length)] = rng.choice([-1, -(2**63)])
        elif kind == "empty":
            ids = ids[:, :0]
        elif kind == "too_long":
            ids = np.zeros((1, LIMIT + rng.randint(1, 5)), dtype=np.int64)
        elif kind == "float":
            ids = ids.astype(np.float32)
        elif kind == "rank":
            ids = rng.choice([ids[0], np.concatenate([ids, ids])])
        elif kind == "missing":
            ids = None
    return Drawn(Request(ids, corrid, start, end), kind)


def _replay(drawn: list[Drawn], running: dict[int, list[int]]) -> list[list[int] | str]:
    """Each request's expected outcome in order: the tokens its sequence holds after it (its
    logits are those of their prefill), or the words of its error; ``running`` updated."""
    expected = []
    for item in drawn:
        request = item.request
        if request.start:
            running.pop(request.corrid, None)
        if item.kind in BAD:
            outcome = BAD[item.kind]
        elif not request.start and request.corrid not in running:
            outcome = "is unknown or has expired"
        elif item.kind == "late":
            outcome = BAD["high"]
        else:
            running[request.corrid] = running.get(request.corrid, []) + request.ids[0].tolist()
            outcome = running[request.corrid]
        if request.end:
            running.pop(request.corrid, None)
        expected.append(outcome)
    return expected


def _fuzz(compiled, seed: int) -> None:
    rng = random.Random(seed)
    sequences = Sequences(compiled, max_request_tokens=LIMIT)
    vocab = compiled.vocab_size
    running: dict[int, list[int]] = {}
    for execution in range(EXECUTIONS):
        widened = rng.random() < 0.25
        sequences.vocab = vocab + 100 if widened else vocab
        drawn = [_draw(rng, vocab, running, widened) for _ in range(rng.randint(1, 9))]
        expected = _replay(drawn, running)
        answers = sequences.execute([d.request for d in drawn])
        where = f"seed {seed} execution {execution}"
        for item, want, answer in zip(drawn, expected, answers, strict=True):
            corrid = item.request.corrid
            if isinstance(want, str):
                assert answer.error is not None, f"{where}: sequence {corrid} {item.kind} passed"
                assert f"sequence {corrid}" in answer.error and want in answer.error, (
                    f"{where}: {answer.error}"
                )
                continue
            assert answer.error is None, f"{where}: {answer.error}"
            alone, _ = compiled.prefill(torch.tensor([want]), last_only=True)
            torch.testing.assert_close(answer.logits, alone[0], rtol=1e-4, atol=1e-4, msg=where)
        assert set(sequences.states) == set(running), where


@pytest.mark.parametrize("seed", range(3))
def test_fuzz_serving_batches(compiled, seed):
    _fuzz(compiled, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(3, 23))
def test_fuzz_serving_batches_slow(compiled, seed):
    _fuzz(compiled, seed)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_fuzz_serving_kv_cache_model_slow(hybrid, seed):
    _fuzz(hybrid, seed)


def _rows(sequences: Sequences, corrids) -> dict[int, dict[str, torch.Tensor]]:
    """Copies of the sequences' state rows."""
    found = {}
    for corrid in corrids:
        batch, row = sequences.states[corrid]
        found[corrid] = {n: t.clone() for n, t in batch.row(row).items()}
    return found


def test_a_failed_call_leaves_the_states_as_they_were(compiled):
    """The reported probe (a 1-token START with id 700 among 7 sequences' steps), and a call in
    which every request fails inside the model: the failing requests get their errors, the others
    the logits they get alone, and the state of a sequence whose request failed is bitwise the
    one before."""
    sequences = Sequences(compiled, max_request_tokens=LIMIT)
    prompts = {c: np.array([[c, 2 * c, 3 * c]]) for c in range(1, 8)}
    sequences.execute([Request(ids, c, start=True) for c, ids in prompts.items()])
    sequences.vocab += 1000  # ids the check lets through fail in the model's call
    steps = [Request(np.array([[5]]), c) for c in range(1, 8)]
    probe = Request(np.array([[700]]), 99, start=True)
    answers = sequences.execute(steps[:3] + [probe] + steps[3:])
    assert [a.error is None for a in answers] == [True] * 3 + [False] + [True] * 4
    assert "sequence 99: " in answers[3].error and "token id 700" in answers[3].error
    for c, answer in zip(range(1, 8), answers[:3] + answers[4:], strict=True):
        alone, _ = compiled.prefill(torch.tensor([[c, 2 * c, 3 * c, 5]]), last_only=True)
        torch.testing.assert_close(answer.logits, alone[0], rtol=1e-4, atol=1e-4)
    before = _rows(sequences, (1, 2))
    answers = sequences.execute([Request(np.array([[600]]), 1), Request(np.array([[601]]), 2)])
    assert ["outside the vocabulary" in a.error for a in answers] == [True, True]
    for corrid, after in _rows(sequences, (1, 2)).items():
        assert all(torch.equal(after[n], before[corrid][n]) for n in after)
    sequences.execute([Request(np.array([[600]]), 3, start=True)])  # a refused restart
    assert set(sequences.states) == {1, 2, 4, 5, 6, 7}
