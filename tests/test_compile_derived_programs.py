"""The stateful programs (prefill, chunk, step) are derived with the pipeline and the target gates
the user's compile ran with (``pipelines.derivation`` under the compile's ``PassContext``): with
``pipeline="none"`` or ``"unfused"`` they hold no op ``fuse_scan_norm_mlp`` makes, and they
still compute what Hugging Face's model does (logits within 1e-4, fp32)."""

from __future__ import annotations

import functools

import pytest
import torch

import ssmcc
from ssmcc.frontend.report import ssmcc_op_counts
from ssmcc.passes import PassContext
from ssmcc.passes.program_set import STATEFUL_GRAPHS, ProgramSet
from ssmcc.presets import build_preset

TOLERANCE = 1e-4
FUSED = {"mamba_mixer", "mamba_mixer_step", "ssd_mixer", "ssd_mixer_step"}
PRESETS = ("mamba-tiny", "mamba2-tiny", "granite-hybrid-tiny")


@functools.cache
def _model(name: str):
    return build_preset(name).eval()


@functools.cache
def _compiled(name: str, pipeline: str):
    return ssmcc.compile(_model(name), "torch", pipeline=pipeline, chunk_size=4)


def _cases():
    for pipeline in ("none", "unfused"):
        for name in PRESETS:
            slow = pipeline == "unfused" and name != "mamba2-tiny"
            yield pytest.param(name, pipeline, marks=pytest.mark.slow) if slow else (name, pipeline)


@pytest.mark.parametrize("name,pipeline", list(_cases()))
def test_stateful_programs_are_derived_with_the_users_pipeline(name, pipeline):
    compiled = _compiled(name, pipeline)
    programs = compiled.executable.programs
    assert programs.context.pipeline == pipeline
    norms = ssmcc_op_counts(programs.forward).get("rmsnorm_gated", 0)  # routed gated norms
    for graph in STATEFUL_GRAPHS:
        ops = ssmcc_op_counts(programs.program(graph))
        assert not set(ops) & FUSED, (graph, ops)
        assert ops.get("rmsnorm_gated", 0) == norms, (graph, ops)  # no RMSNorm fused
    model = _model(name)
    ids = torch.randint(0, model.config.vocab_size, (2, 10), generator=torch.Generator())
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    logits, _ = compiled.prefill(ids[:, :9])  # the prefill program, chunks of 4
    assert (logits - expected[:, :9]).abs().max() <= TOLERANCE
    last, state = compiled.prefill(ids[:, :9], last_only=True)  # the chunk program
    assert (last - expected[:, 8]).abs().max() <= TOLERANCE
    logits, _ = compiled.step(ids[:, 9], state)  # the step program
    assert (logits - expected[:, 9]).abs().max() <= TOLERANCE


def test_the_derivations_honour_the_targets_gates():
    """An op the context marks unsupported (as a target's ``unsupported_ops`` do) is not made in
    any derived program: the norms a default derivation would fuse stay ATen."""
    forward = _compiled("mamba2-tiny", "unfused").program
    norms = ssmcc_op_counts(forward)["rmsnorm_gated"]
    gates = {"fuse_scan_norm_mlp": {"unsupported": {"rmsnorm_gated": "not in this target"}}}
    gated = ProgramSet(forward, token_model=True, context=PassContext(options=gates))
    ungated = ProgramSet(forward, token_model=True)
    for graph in STATEFUL_GRAPHS:
        assert ssmcc_op_counts(gated.program(graph))["rmsnorm_gated"] == norms
    assert ssmcc_op_counts(ungated.program("step"))["rmsnorm_gated"] > norms

