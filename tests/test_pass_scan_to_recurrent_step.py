"""scan_to_recurrent_step / expose_recurrent_state: golden graphs, rule hits, numerics."""

from __future__ import annotations

import torch

from ssmcc.passes import PassContext, format_program, pipeline, run_passes
from ssmcc.passes.scan_to_recurrent_step import (
    expose_recurrent_state,
    scan_to_recurrent_step,
    state_specs,
)

from .conftest import KEEP_MIXERS
from .test_pass_canonicalize import tiny_mamba_program


def _clean(program, fuse_mixers: bool = False):
    """The goldens show the single-state ops (the conv, the scan); the fused mixer, whose one op
    carries both states, has its own test below."""
    ctx = PassContext(options={} if fuse_mixers else KEEP_MIXERS)
    return run_passes(program, pipeline("default"), ctx)[0]


def test_step_program_golden(golden):
    model, captured = tiny_mamba_program()
    prefill = _clean(captured)
    step, report = run_passes(prefill, [scan_to_recurrent_step], PassContext(verify=True))
    step = _clean(step)
    golden("scan_to_recurrent_step", "tiny_mamba", format_program(prefill), format_program(step))
    assert report.rule_hits == {
        "scan_to_recurrent_step.causal_conv1d->causal_conv1d_update": 1,
        "scan_to_recurrent_step.selective_scan->selective_state_update": 1,
    }
    targets = [n.target for n in step.graph.nodes if n.op == "call_function"]
    assert torch.ops.ssmcc.selective_scan.default not in targets
    assert targets.count(torch.ops.ssmcc.selective_state_update.default) == 1


def test_exposed_state_golden_and_numerics(golden):
    model, captured = tiny_mamba_program()
    prefill = _clean(captured)
    stateful, report = run_passes(prefill, [expose_recurrent_state], PassContext(verify=True))
    stateful = _clean(stateful)
    golden(
        "expose_recurrent_state", "tiny_mamba", format_program(prefill), format_program(stateful)
    )
    assert report.rule_hits == {"expose_recurrent_state.state_input": 2}
    specs = state_specs(prefill)
    assert [(s.name, s.shape) for s in specs] == [
        ("layers.0.conv_state", (16, 3)),
        ("layers.0.ssm_state", (16, 4)),
    ]
    ids = torch.randint(0, 16, (3, 11))
    zeros = [torch.zeros(3, *s.shape) for s in specs]
    with torch.no_grad():
        logits, *states = stateful.module()(ids, *zeros)
        assert (logits - model(ids).logits).abs().max() <= 1e-5
        step = _clean(run_passes(prefill, [scan_to_recurrent_step])[0])
        head, *head_states = stateful.module()(ids[:, :10], *zeros)
        last, *step_states = step.module()(ids[:, 10:], *head_states)
    assert (last - logits[:, -1]).abs().max() <= 1e-5
    for a, b in zip(step_states, states, strict=True):
        assert (a - b).abs().max() <= 1e-5


def test_fused_mixer_carries_both_states_through_one_step_op():
    """The default pipeline's mixer op has two state slots: the same state names and shapes as
    the unfused program, one step op per layer, and the same numbers."""
    model, captured = tiny_mamba_program()
    fused, unfused = _clean(captured, fuse_mixers=True), _clean(captured)
    assert state_specs(fused) == state_specs(unfused)
    step, report = run_passes(fused, [scan_to_recurrent_step], PassContext(verify=True))
    assert report.rule_hits == {"scan_to_recurrent_step.mamba_mixer->mamba_mixer_step": 1}
    targets = [n.target for n in _clean(step, True).graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.ssmcc.mamba_mixer_step.default) == 1
    unfused_step = _clean(run_passes(unfused, [scan_to_recurrent_step])[0])
    ids = torch.randint(0, 16, (3, 1))
    states = [torch.randn(3, *s.shape) for s in state_specs(fused)]
    with torch.no_grad():
        got, want = step.module()(ids, *states), unfused_step.module()(ids, *states)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max() <= 1e-5


def test_program_without_ssm_is_left_alone():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return x * 2

    program = torch.export.export(Plain(), (torch.randn(2, 3),))
    assert not scan_to_recurrent_step(program, PassContext()).modified
    assert not expose_recurrent_state(program, PassContext()).modified
