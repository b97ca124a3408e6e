"""The fused Mamba-1 mixer: rule ``fuse_scan_norm_mlp.mamba_mixer`` on HF Mamba and FalconMamba
(the golden file is ``fuse_scan_norm_mlp/tiny_mamba``), the fused programs against unfused ones
(1e-5, fp32) on every target, the step program (one op per layer between the two matmuls), and
near misses reported. Odd shapes and every path against a float64 oracle: ``test_fuzz_kernels``.
"""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.ops import SSMCC_OPS
from ssmcc.passes import PassContext, run_passes
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp

from .conftest import make_hf_model

TOLERANCE = 1e-5


@pytest.mark.parametrize("family", ["mamba", pytest.param("falcon_mamba", marks=pytest.mark.slow)])
@pytest.mark.parametrize(
    "target,kernels",
    [
        ("torch", "auto"),
        pytest.param("onnx", "auto", marks=pytest.mark.slow),
        pytest.param("onnx", "reference", marks=pytest.mark.slow),
    ],
)
def test_fused_matches_unfused_prefill_step_and_generate(family, target, kernels):
    model = make_hf_model(family, num_hidden_layers=2, eos_token_id=None)
    fused = ssmcc.compile(model, target, kernels=kernels)
    unfused = ssmcc.compile(model, "torch", pipeline="unfused")
    assert fused.report.op_counts["mamba_mixer"] == 2
    assert "selective_scan" not in fused.report.op_counts
    assert fused.report.rule_hits["fuse_scan_norm_mlp.mamba_mixer"] == 2
    for batch, length in ((1, 1), (3, 7), (2, 70)):
        ids = torch.randint(0, 101, (batch, length))
        assert (torch.as_tensor(fused(ids)) - unfused(ids)).abs().max() <= TOLERANCE
    ids = torch.randint(0, 101, (2, 30))
    logits, state = fused.prefill(ids[:, :21])
    expected, expected_state = unfused.prefill(ids[:, :21])
    assert list(state) == list(expected_state)
    for t in range(21, 30):
        logits, state = fused.step(ids[:, t], state)
        expected, expected_state = unfused.step(ids[:, t], expected_state)
        assert (torch.as_tensor(logits) - expected).abs().max() <= TOLERANCE
    prompt = torch.randint(1, 101, (3, 6))
    assert torch.equal(fused.generate(prompt, 12), unfused.generate(prompt, 12))


def test_step_program_is_one_op_per_layer_between_the_matmuls():
    compiled = ssmcc.compile(make_hf_model("mamba", num_hidden_layers=3), "torch")
    step = compiled.executable.programs.program("step")
    ops = [n.target for n in step.graph.nodes if n.op == "call_function"]
    assert ops.count(SSMCC_OPS["mamba_mixer_step"]) == 3
    for unfused in ("selective_state_update", "causal_conv1d_update"):
        assert SSMCC_OPS[unfused] not in ops
    assert not any(t == torch.ops.aten.transpose.int for t in ops)


def test_a_final_state_used_by_the_program_keeps_the_chain():
    """The scan's final state leaves the mixer (a program that returns it): no fusion, reason."""

    class ReturnsState(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = make_hf_model("mamba", num_hidden_layers=1).backbone.layers[0].mixer

        def forward(self, hidden):
            m = self.mixer
            x, z = m.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)
            xc, _ = torch.ops.ssmcc.causal_conv1d(
                x, m.conv1d.weight.squeeze(1), m.conv1d.bias, None, "silu"
            )
            dt, B, C = m.x_proj(xc.transpose(1, 2)).split([3, 5, 5], dim=-1)
            y, last = torch.ops.ssmcc.selective_scan(
                xc,
                m.dt_proj.weight @ dt.transpose(1, 2),
                -torch.exp(m.A_log),
                B.transpose(1, 2),
                C.transpose(1, 2),
                m.D,
                z,
                m.dt_proj.bias,
                True,
            )
            return m.out_proj(y.transpose(1, 2)), last

    model = ReturnsState()
    hidden = torch.randn(2, 5, 24)
    program = torch.export.export(model, (hidden,))
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [canonicalize, fuse_scan_norm_mlp], ctx)
    assert "fuse_scan_norm_mlp.mamba_mixer" not in report.rule_hits
    assert any(
        "final state is used" in r for r in ctx.diagnostics["fuse_scan_norm_mlp.mamba_mixer"]
    )
    for got, want in zip(after.module()(hidden), model(hidden), strict=True):
        assert (got - want).abs().max() == 0


def test_a_target_without_the_op_keeps_the_chain():
    model = make_hf_model("mamba", num_hidden_layers=1)
    program = ssmcc.capture(model, (torch.randint(0, 101, (1, 4)),))
    unsupported = {"mamba_mixer_step": "no kernel (test)"}
    ctx = PassContext(options={"fuse_scan_norm_mlp": {"unsupported": unsupported}})
    _, report = run_passes(program, [canonicalize, fuse_scan_norm_mlp], ctx)
    assert "fuse_scan_norm_mlp.mamba_mixer" not in report.rule_hits
    assert any("no kernel (test)" in r for r in ctx.diagnostics["fuse_scan_norm_mlp.mamba_mixer"])


def test_bad_arguments_name_the_argument():
    m = make_hf_model("mamba", num_hidden_layers=1).backbone.layers[0].mixer
    args = dict(
        zx=torch.randn(1, 3, 96),
        conv_weight=m.conv1d.weight.squeeze(1),
        conv_bias=None,
        x_proj_weight=m.x_proj.weight,
        dt_proj_weight=m.dt_proj.weight,
        A=-torch.exp(m.A_log),
        D=m.D,
        dt_bias=m.dt_proj.bias,
        x_offset=0,
        z_offset=48,
    )
    torch.ops.ssmcc.mamba_mixer(**args)
    with pytest.raises(RuntimeError, match=r"z at \[50, 98\) does not fit zx's last axis of 96"):
        torch.ops.ssmcc.mamba_mixer(**{**args, "z_offset": 50})
    with pytest.raises(RuntimeError, match="x_proj_weight is"):
        torch.ops.ssmcc.mamba_mixer(**{**args, "x_proj_weight": m.x_proj.weight[:-1]})
