"""The fused Mamba-2 mixer: rule ``fuse_scan_norm_mlp.ssd_mixer`` (golden before/after, hit counts,
near misses reported), the fused op on every path against the unfused chain (1e-5, fp32; the
float64 fuzz oracle covers odd shapes: ``test_fuzz_kernels``), the decode program it gives
(one op per layer between the two matmuls), and states interchangeable with unfused programs."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.ops import SSMCC_OPS
from ssmcc.passes import PassContext, format_program, run_passes
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp

from .conftest import make_hf_model

TOLERANCE = 1e-5


def _mamba2(**sizes):
    base = dict(
        vocab_size=16,
        hidden_size=8,
        state_size=4,
        num_hidden_layers=1,
        num_heads=4,
        head_dim=4,
        n_groups=2,
    )
    return make_hf_model("mamba2", **{**base, **sizes})


def test_golden_tiny_mamba2(golden):
    """split, two transposes, the conv, split, views, the scan and the gated norm -> ssd_mixer."""
    model = _mamba2()
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    program = ssmcc.capture(model, (ids,))
    canonical, _ = run_passes(program, [canonicalize], PassContext())
    after, report = run_passes(
        canonical, [fuse_scan_norm_mlp, eliminate_dead_code], PassContext(verify=True)
    )
    golden("fuse_scan_norm_mlp", "tiny_mamba2", format_program(canonical), format_program(after))
    assert report.rule_hits["fuse_scan_norm_mlp.ssd_mixer"] == 1
    targets = {n.target for n in after.graph.nodes}
    assert SSMCC_OPS["ssd_mixer"] in targets
    for gone in ("ssd_scan", "causal_conv1d"):
        assert SSMCC_OPS[gone] not in targets
    assert not any(n.target == torch.ops.aten.transpose.int for n in after.graph.nodes)
    for batch, length in ((1, 1), (3, 7), (2, 37)):
        ids = torch.randint(0, 16, (batch, length))
        with torch.no_grad():
            assert (after.module()(ids) - program.module()(ids)).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "target,kernels",
    [
        ("torch", "auto"),
        pytest.param("onnx", "auto", marks=pytest.mark.slow),
        pytest.param("onnx", "reference", marks=pytest.mark.slow),
    ],
)
def test_fused_matches_unfused_prefill_step_and_generate(target, kernels):
    model = _mamba2(num_hidden_layers=2, n_groups=1, eos_token_id=None, vocab_size=64)
    fused = ssmcc.compile(model, target, kernels=kernels)
    unfused = ssmcc.compile(model, "torch", pipeline="unfused")
    assert fused.report.op_counts["ssd_mixer"] == 2 and "ssd_scan" not in fused.report.op_counts
    for batch, length in ((1, 1), (3, 7), (2, 70)):
        ids = torch.randint(0, 64, (batch, length))
        assert (torch.as_tensor(fused(ids)) - unfused(ids)).abs().max() <= TOLERANCE
    ids = torch.randint(0, 64, (2, 30))
    logits, state = fused.prefill(ids[:, :21])
    expected, expected_state = unfused.prefill(ids[:, :21])
    assert list(state) == list(expected_state)  # layers.<i>.conv_state / .ssm_state
    for t in range(21, 30):
        logits, state = fused.step(ids[:, t], state)
        expected, expected_state = unfused.step(ids[:, t], expected_state)
        assert (torch.as_tensor(logits) - expected).abs().max() <= TOLERANCE
    prompt = torch.randint(1, 64, (3, 6))
    assert torch.equal(fused.generate(prompt, 12), unfused.generate(prompt, 12))


def test_states_cross_between_fused_and_unfused_programs():
    """Same names, shapes and meaning: a fused prefill's state continues in an unfused step."""
    model = _mamba2(num_hidden_layers=2)
    fused, unfused = ssmcc.compile(model), ssmcc.compile(model, pipeline="unfused")
    ids = torch.randint(0, 16, (2, 12))
    _, state = fused.prefill(ids[:, :11])
    logits, _ = unfused.step(ids[:, 11], state)
    assert (logits - torch.as_tensor(fused(ids))[:, -1]).abs().max() <= TOLERANCE


def test_step_program_is_one_op_per_layer_between_the_matmuls():
    model = _mamba2(num_hidden_layers=3)
    compiled = ssmcc.compile(model, "torch")
    step = compiled.executable.programs.program("step")
    ops = [n.target for n in step.graph.nodes if n.op == "call_function"]
    assert ops.count(SSMCC_OPS["ssd_mixer_step"]) == 3
    assert SSMCC_OPS["ssd_state_update"] not in ops and SSMCC_OPS["causal_conv1d_update"] not in ops


class ConvOutputUsedTwice(torch.nn.Module):
    """A Mamba-2 mixer whose conv output is also read by something else: it must stay unfused."""

    def __init__(self):
        super().__init__()
        self.inner = _mamba2().backbone.layers[0].mixer

    def forward(self, hidden):
        mixer = self.inner
        projected = mixer.in_proj(hidden)
        gate, xbc, dt = projected.split([16, 32, 4], dim=-1)
        conv, _ = torch.ops.ssmcc.causal_conv1d(
            xbc.transpose(1, 2), mixer.conv1d.weight.squeeze(1), mixer.conv1d.bias, None, "silu"
        )
        xbc = conv.transpose(1, 2)
        x, B, C = xbc.split([16, 8, 8], dim=-1)
        b, length = hidden.shape[:2]
        y, _ = torch.ops.ssmcc.ssd_scan(
            x.reshape(b, length, 4, 4),
            dt,
            -torch.exp(mixer.A_log),
            B.reshape(b, length, 2, 4),
            C.reshape(b, length, 2, 4),
            mixer.D,
            None,
            mixer.dt_bias,
            True,
        )
        out = torch.ops.ssmcc.rmsnorm_gated(y.reshape(b, length, 16), gate, mixer.norm.weight, 8)
        return out + xbc[..., :16]  # the conv output leaves the chain


def test_a_chain_used_outside_is_reported_and_left():
    model = ConvOutputUsedTwice()
    hidden = torch.randn(2, 5, 8)
    program = torch.export.export(model, (hidden,))
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [canonicalize, fuse_scan_norm_mlp], ctx)
    assert "fuse_scan_norm_mlp.ssd_mixer" not in report.rule_hits
    reasons = ctx.diagnostics["fuse_scan_norm_mlp.ssd_mixer"]
    assert any("also used outside the mixer" in r for r in reasons), reasons
    assert (after.module()(hidden) - model(hidden)).abs().max() == 0


def test_a_target_without_the_op_keeps_the_chain():
    model = _mamba2()
    program = ssmcc.capture(model, (torch.randint(0, 16, (1, 4)),))
    unsupported = {"ssd_mixer": "no kernel (test)"}
    ctx = PassContext(options={"fuse_scan_norm_mlp": {"unsupported": unsupported}})
    _, report = run_passes(program, [canonicalize, fuse_scan_norm_mlp], ctx)
    assert "fuse_scan_norm_mlp.ssd_mixer" not in report.rule_hits
    assert any("no kernel (test)" in r for r in ctx.diagnostics["fuse_scan_norm_mlp.ssd_mixer"])


def test_bad_arguments_name_the_argument():
    model = _mamba2()
    mixer = model.backbone.layers[0].mixer
    args = dict(
        zxbcdt=torch.randn(1, 3, 52),
        conv_weight=mixer.conv1d.weight.squeeze(1),
        conv_bias=None,
        A=-torch.exp(mixer.A_log),
        D=mixer.D,
        dt_bias=mixer.dt_bias,
        norm_weight=mixer.norm.weight,
        groups=2,
        z_offset=0,
        xbc_offset=16,
        dt_offset=48,
        norm_group_size=8,
    )
    torch.ops.ssmcc.ssd_mixer(**args)  # fits exactly
    with pytest.raises(RuntimeError, match=r"dt at \[50, 54\) does not fit zxbcdt's last axis"):
        torch.ops.ssmcc.ssd_mixer(**{**args, "dt_offset": 50})
    with pytest.raises(RuntimeError, match="groups=3 does not divide heads=4"):
        torch.ops.ssmcc.ssd_mixer(**{**args, "groups": 3})
    with pytest.raises(RuntimeError, match="ssm_state must have shape"):
        torch.ops.ssmcc.ssd_mixer(**args, ssm_state=torch.zeros(1, 4, 4, 5))
