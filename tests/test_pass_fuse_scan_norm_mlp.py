"""fuse_scan_norm_mlp: golden before/after, rule hits, outputs of fused programs against unfused
ones (1e-5, fp32) for Mamba-1 and Mamba-2, near misses reported, targets that cannot run the op
left alone.
"""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.passes import PassContext, format_program, run_passes
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp

from .conftest import make_hf_model

TOLERANCE = 1e-5


def _tiny(family: str):
    sizes = dict(vocab_size=16, hidden_size=8, state_size=4, num_hidden_layers=1)
    if family == "mamba":
        sizes["time_step_rank"] = 2
    else:
        sizes.update(num_heads=4, head_dim=4, n_groups=1)
    model = make_hf_model(family, **sizes)
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    return model, ssmcc.capture(model, (ids,))


@pytest.mark.parametrize("family,norms", [("mamba", 2), ("mamba2", 2)])
def test_tiny_golden(golden, family, norms):
    """Each block's RMSNorm and the final norm_f become one rmsnorm_gated without a gate."""
    model, program = _tiny(family)
    passes = [canonicalize, fuse_scan_norm_mlp, eliminate_dead_code]
    after, report = run_passes(program, passes, PassContext(verify=True))
    if family == "mamba":
        canonical, _ = run_passes(program, [canonicalize], PassContext())
        golden("fuse_scan_norm_mlp", "tiny_mamba", format_program(canonical), format_program(after))
    assert report.rule_hits["fuse_scan_norm_mlp.rmsnorm"] == norms
    fused = [n for n in after.graph.nodes if "rmsnorm_gated" in str(n.target)]
    assert len(fused) == norms  # Mamba-2's gated norm is inside its ssd_mixer
    mixers = report.rule_hits.get("fuse_scan_norm_mlp.ssd_mixer", 0)
    assert mixers == (1 if family == "mamba2" else 0)
    assert not any(n.target == torch.ops.aten.rsqrt.default for n in after.graph.nodes)
    for batch, length in ((1, 1), (3, 7), (2, 37)):
        ids = torch.randint(0, 16, (batch, length))
        with torch.no_grad():
            assert (after.module()(ids) - program.module()(ids)).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "family,target",
    [("mamba", "torch"), ("mamba2", "onnx")]
    + [
        pytest.param(f, t, marks=pytest.mark.slow)
        for f, t in [("mamba", "onnx"), ("mamba2", "torch")]
    ],
)
@pytest.mark.thorough
def test_fused_programs_match_unfused_and_generate_the_same(family, target):
    model = make_hf_model(family, num_hidden_layers=2, eos_token_id=None)
    fused = ssmcc.compile(model, target)
    unfused = ssmcc.compile(model, "torch", pipeline="none")
    assert fused.report.op_counts["rmsnorm_gated"] >= 3
    for batch, length in ((1, 1), (3, 7), (2, 37)):
        ids = torch.randint(0, 101, (batch, length))
        got = torch.as_tensor(fused(ids))
        assert (got - torch.as_tensor(unfused(ids))).abs().max() <= TOLERANCE
    prompt = torch.randint(1, 101, (3, 6))
    assert torch.equal(
        torch.as_tensor(fused.generate(prompt, 12)), torch.as_tensor(unfused.generate(prompt, 12))
    )


class NotQuiteNorms(torch.nn.Module):
    """Look-alikes: a mean over the wrong dim, and |x|^3 instead of x^2; one real norm."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.rand(6) + 0.5)

    def forward(self, x):
        wrong_dim = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-5) * self.weight
        cubed = x * torch.rsqrt(x.abs().pow(3).mean(-1, keepdim=True) + 1e-5) * self.weight
        real = self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
        return wrong_dim + cubed + real


def test_look_alikes_are_reported_and_left():
    model = NotQuiteNorms()
    x = torch.randn(2, 5, 6)
    program = torch.export.export(model, (x,))
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [fuse_scan_norm_mlp, eliminate_dead_code], ctx)
    assert report.rule_hits["fuse_scan_norm_mlp.rmsnorm"] == 1
    wrong_dim, cubed = ctx.diagnostics["fuse_scan_norm_mlp.rmsnorm"]
    assert "mean of x^2 over dims [1] (keepdim=True), not x^2 over -1" in wrong_dim
    # the pattern misses where it first differs: the power reads |x|, not the x it scales
    assert "operand 0: %abs" in cubed and "is not x" in cubed, cubed
    assert (after.module()(x) - model(x)).abs().max() <= TOLERANCE


def test_a_target_that_cannot_run_the_op_is_left_unfused():
    _, program = _tiny("mamba")
    unsupported = {"rmsnorm_gated": "no kernel for it (test)"}
    ctx = PassContext(options={"fuse_scan_norm_mlp": {"unsupported": unsupported}})
    after, report = run_passes(program, [canonicalize, fuse_scan_norm_mlp], ctx)
    assert "fuse_scan_norm_mlp.rmsnorm" not in report.rule_hits
    assert all("no kernel for it" in r for r in ctx.diagnostics["fuse_scan_norm_mlp.rmsnorm"])


def test_inspect_lists_the_fusions():
    model = make_hf_model("mamba", num_hidden_layers=2)
    text = ssmcc.compile(model, "torch").report.format()
    assert "fuse_scan_norm_mlp.rmsnorm 3" in text and "rmsnorm_gated x3" in text
