"""chunk_state_passing: golden graph, rule hits, the head moved to the last position, errors."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ssmcc.errors import InputError, PassError
from ssmcc.options import check_chunk_size
from ssmcc.passes import PassContext, format_program, pipeline, run_passes
from ssmcc.passes.chunk_state_passing import chunk_state_passing
from ssmcc.passes.scan_to_recurrent_step import expose_recurrent_state, state_specs

from .conftest import KEEP_MIXERS
from .test_pass_canonicalize import tiny_mamba_program


def _clean(program):
    """Mixers kept apart (the golden shows the conv and scan ops; the fused mixers chunk alike:
    their contracts say the same, and test_ssd_mixer / test_mamba_mixer run chunked prefill)."""
    return run_passes(program, pipeline("default"), PassContext(options=KEEP_MIXERS))[0]


def _stateful_prefill():
    model, captured = tiny_mamba_program()
    prefill = _clean(captured)
    return model, prefill, _clean(run_passes(prefill, [expose_recurrent_state])[0])


def test_chunk_program_golden_and_numerics(golden):
    model, prefill, stateful = _stateful_prefill()
    chunk, report = run_passes(stateful, [chunk_state_passing], PassContext(verify=True))
    chunk = _clean(chunk)
    golden("chunk_state_passing", "tiny_mamba", format_program(stateful), format_program(chunk))
    assert report.rule_hits == {"chunk_state_passing.head_on_last_position": 1}
    # the LM head runs on one position: no (b, l, vocab) logits in the chunk program
    vocab = model.config.vocab_size
    logits = chunk.graph.output_node().args[0][0]
    assert logits.target == torch.ops.aten.select.int  # (b, 1, vocab) -> (b, vocab)
    head = logits.args[0]
    assert head.target == torch.ops.aten.linear.default
    assert head.args[0].meta["val"].shape[1] == 1 and head.meta["val"].shape[-1] == vocab
    specs = state_specs(prefill)
    ids = torch.randint(0, vocab, (3, 23))
    zeros = [torch.zeros(3, *s.shape) for s in specs]
    with torch.no_grad():
        expected = model(ids).logits
        states = zeros
        for begin in range(0, 23, 5):  # 5 + 5 + 5 + 5 + 3 tokens
            last, *states = chunk.module()(ids[:, begin : begin + 5], *states)
            assert (last - expected[:, min(begin + 5, 23) - 1]).abs().max() <= 1e-5
        _, *full_states = stateful.module()(ids, *zeros)
    for a, b in zip(states, full_states, strict=True):
        assert (a - b).abs().max() <= 1e-5


class _CumsumHead(nn.Module):
    """A stateful-prefill-shaped program whose logits do not come from a linear/matmul head."""

    def forward(self, ids, state):
        hidden = torch.nn.functional.one_hot(ids, 6).float() + state[:, None, :]
        return hidden.cumsum(1), state + hidden.sum(1)


def test_head_not_found_falls_back_to_slicing_and_says_why():
    batch = torch.export.Dim("batch", min=1)
    program = torch.export.export(
        _CumsumHead(),
        (torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 6)),
        dynamic_shapes=({0: batch, 1: torch.export.Dim("seq", min=1)}, {0: batch}),
    )
    ctx = PassContext()
    chunk, report = run_passes(program, [chunk_state_passing], ctx)
    assert report.rule_hits == {"chunk_state_passing.logits_sliced": 1}
    reasons = ctx.diagnostics["chunk_state_passing.head_on_last_position"]
    assert "cumsum" in reasons[0]
    ids, state = torch.randint(0, 6, (2, 9)), torch.randn(2, 6)
    last, new_state = chunk.module()(ids, state)
    expected, expected_state = _CumsumHead()(ids, state)
    assert torch.equal(last, expected[:, -1]) and torch.equal(new_state, expected_state)


class _HeadAlsoReadByTheState(nn.Module):
    """A linear head whose output the state reads too: slicing its input would change the state."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(6, 4), nn.Linear(4, 5)

    def forward(self, ids, state):
        logits = self.head(self.embed(ids))
        return logits, state + logits.sum(1)


def test_a_head_read_elsewhere_keeps_its_rows_and_says_why():
    batch = torch.export.Dim("batch", min=1)
    model = _HeadAlsoReadByTheState().eval()
    program = torch.export.export(
        model,
        (torch.zeros(2, 8, dtype=torch.long), torch.zeros(2, 5)),
        dynamic_shapes=({0: batch, 1: torch.export.Dim("seq", min=1)}, {0: batch}),
    )
    ctx = PassContext(verify=True)
    chunk, report = run_passes(program, [chunk_state_passing], ctx)
    assert report.rule_hits == {"chunk_state_passing.logits_sliced": 1}
    reason = ctx.diagnostics["chunk_state_passing.head_on_last_position"][0]
    assert "has other readers" in reason and "linear" in reason
    ids, state = torch.randint(0, 6, (3, 7)), torch.randn(3, 5)
    with torch.no_grad():
        last, new_state = chunk.module()(ids, state)
        expected, expected_state = model(ids, state)
    assert torch.equal(last, expected[:, -1]) and torch.equal(new_state, expected_state)
    recorded = chunk.graph.output_node().args[0][0].meta["val"]  # (b, 5): the last position's
    assert recorded.dim() == 2 and recorded.shape[1] == 5


def test_program_without_states_is_refused():
    _, prefill, _ = _stateful_prefill()
    with pytest.raises(PassError, match="run expose_recurrent_state first"):
        run_passes(prefill, [chunk_state_passing])


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, "64", None])
def test_chunk_size_must_be_a_positive_integer(bad):
    with pytest.raises(InputError, match="chunk_size must be a positive integer"):
        check_chunk_size(bad)


def test_chunk_size_option_reaches_the_pass():
    _, _, stateful = _stateful_prefill()
    ctx = PassContext(options={"chunk_state_passing": {"chunk_size": 0}})
    message = r"chunk_size must be a positive integer \(tokens per chunk\), got 0"
    with pytest.raises(PassError, match=message):
        run_passes(stateful, [chunk_state_passing], ctx)
