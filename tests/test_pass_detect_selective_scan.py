"""detect_selective_scan: the three forms on hand-written and Hugging Face Mamba stacks, the folds,
look-alikes left alone and reported, golden graphs with rule hits."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from benchmarks import handwritten_mamba
from benchmarks.handwritten_mamba import build
from ssmcc.frontend.export import CausalLMLogits, capture
from ssmcc.frontend.report import ssmcc_op_counts
from ssmcc.passes import PassContext, format_program, pipeline, run_passes
from ssmcc.passes.detect_selective_scan import detect_selective_scan

from .conftest import FAMILIES, KEEP_MIXERS, make_hf_model

PASS = "detect_selective_scan"
RULE_OF_FORM = {
    "loop": "unrolled_loop",
    "loop_einsum": "unrolled_loop",
    "scan_op": "scan_op",
    "pscan": "parallel_scan",
}
FOLDS = ("fold_gate", "fold_skip", "fold_softplus")
TOLERANCE = 1e-4


def _run(program, fuse_mixers: bool = False):
    """These tests look at what detection leaves: each layer's conv and scan stay apart unless
    ``fuse_mixers`` (the fusion pass would make one mixer op of them)."""
    ctx = PassContext(verify=True, options={} if fuse_mixers else KEEP_MIXERS)
    out, report = run_passes(program, pipeline("default"), ctx)
    hits = {
        rule.split(".", 1)[1]: n for rule, n in report.rule_hits.items() if rule.startswith(PASS)
    }
    findings = {k: v for k, v in ctx.diagnostics.items() if k.startswith(PASS)}
    return out, hits, findings


def _export(model, ids):
    return torch.export.export(model, (ids,), strict=False)


@pytest.mark.parametrize("form", handwritten_mamba.FORMS)
@pytest.mark.thorough
def test_handwritten_stack_one_scan_per_layer(form):
    """Each form, 2 layers, T=64: one selective_scan per layer, outputs within 1e-4."""
    model = build(form, layers=2)
    ids = torch.randint(0, 64, (2, 64), generator=torch.Generator().manual_seed(1))
    program = _export(model, ids)
    out, hits, findings = _run(program)
    expected_hits = {RULE_OF_FORM[form]: 2, **{fold: 2 for fold in FOLDS}}
    if form == "pscan":
        expected_hits["functionalize"] = 1
    assert hits == expected_hits and not findings
    # each block's norm and the final norm fuse too (fuse_scan_norm_mlp)
    assert ssmcc_op_counts(out) == {"causal_conv1d": 2, "rmsnorm_gated": 3, "selective_scan": 2}
    with torch.no_grad():
        expected = model(ids)
    assert (out.module()(ids) - expected).abs().max() <= TOLERANCE
    before, after = len(program.graph.nodes), len(out.graph.nodes)
    if form == "loop":
        assert before >= 10 * after, (before, after)
    elif form == "loop_einsum":
        # 6 nodes a step (precomputed einsums) against ~45 per layer for the rest of the block:
        # 881 -> 95 nodes, 9.3x for the whole program (the loop itself: 768 nodes -> 1 op)
        assert before >= 9 * after, (before, after)
    else:  # scan op: already rolled; pscan: O(log T) levels, not T copies
        assert after < before


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(
    "use_mambapy", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["loop", "pscan"]
)
@pytest.mark.thorough
def test_hugging_face_static_export_without_routing(family, use_mambapy):
    """HF's own slow path (its Python loop, or mamba.py's pscan with use_mambapy), exported at
    T=64 by plain torch.export: one selective_scan per layer, logits within 1e-4."""
    model = make_hf_model(family, use_mambapy=use_mambapy)
    for layer in model.backbone.layers:  # FalconMambaConfig drops use_mambapy; the mixer reads it
        layer.mixer.use_mambapy = use_mambapy
    ids = torch.randint(0, model.config.vocab_size, (2, 64))
    program = _export(CausalLMLogits(model), ids)
    out, hits, findings = _run(program)
    layers = model.config.num_hidden_layers
    rule = "parallel_scan" if use_mambapy else "unrolled_loop"
    assert hits[rule] == layers and not findings
    for fold in (*FOLDS, "fold_delta_bias"):
        assert hits[fold] == layers
    # with the cut padded conv1d found too, the same ops as a routed capture
    ops = {"causal_conv1d": layers, "rmsnorm_gated": layers + 1, "selective_scan": layers}
    assert ssmcc_op_counts(out) == ops
    fused, _, _ = _run(program, fuse_mixers=True)  # and they fuse as a routed capture's do
    assert ssmcc_op_counts(fused) == {"mamba_mixer": layers, "rmsnorm_gated": layers + 1}
    with torch.no_grad():
        expected = model(ids).logits
    assert (out.module()(ids) - expected).abs().max() <= TOLERANCE
    if not use_mambapy:
        assert len(program.graph.nodes) >= 10 * len(out.graph.nodes)


@pytest.mark.thorough
def test_capture_without_routing_keeps_batch_dynamic():
    model = make_hf_model("mamba", num_hidden_layers=2)
    program = capture(model, torch.randint(0, 101, (1, 12)), route=False)
    out, hits, _ = _run(program)
    assert hits["unrolled_loop"] == 2
    for batch in (1, 3):
        ids = torch.randint(0, 101, (batch, 12))
        with torch.no_grad():
            expected = model(ids).logits
        assert (out.module()(ids) - expected).abs().max() <= TOLERANCE


@pytest.mark.thorough
def test_scan_op_program_keeps_a_dynamic_length():
    """torch's scan op exports with a symbolic length; the rewritten program runs at any."""
    from ssmcc.frontend.export import capture_with_report

    model = build("scan_op", layers=1)
    program, report = capture_with_report(model, (torch.randint(0, 64, (2, 16)),))
    assert not all(d.isdigit() for d in report.dynamic_dims["input_ids"])
    out, hits, _ = _run(program)
    assert hits["scan_op"] == 1
    for length in (3, 40):
        ids = torch.randint(0, 64, (2, length))
        with torch.no_grad():
            expected = model(ids)
        assert (out.module()(ids) - expected).abs().max() <= TOLERANCE


class _ScanWithState(nn.Module):
    """A bare loop: given initial state, no D, no gate, no softplus; returns y and the state."""

    def __init__(self, dim=6, state=3):
        super().__init__()
        self.A = nn.Parameter(-torch.rand(dim, state) - 0.1)

    def forward(self, u, dt, B, C, h):
        ys = []
        for t in range(u.shape[-1]):
            h = torch.exp(self.A * dt[:, :, t, None]) * h + B[:, None, :, t] * (
                u[:, :, t] * dt[:, :, t]
            ).unsqueeze(-1)
            ys.append(torch.matmul(h, C[:, :, t].unsqueeze(-1)).squeeze(-1))
        return torch.stack(ys, dim=1), h


def test_initial_and_final_state_without_folds():
    torch.manual_seed(0)
    model = _ScanWithState()
    b, d, n, length = 2, 6, 3, 7
    args = (
        torch.randn(b, d, length),
        torch.rand(b, d, length),
        torch.randn(b, n, length),
        torch.randn(b, n, length),
        torch.randn(b, d, n),
    )
    program = torch.export.export(model, args, strict=False)
    out, hits, findings = _run(program)
    assert hits == {"unrolled_loop": 1} and not findings
    scan = next(
        node for node in out.graph.nodes if node.target == torch.ops.ssmcc.selective_scan.default
    )
    assert scan.args[8] is False  # no softplus found, none assumed
    assert scan.args[5] is None and scan.args[6] is None  # no D, no z
    y, state = out.module()(*args)
    y_ref, state_ref = model(*args)
    assert (y - y_ref).abs().max() <= TOLERANCE and (state - state_ref).abs().max() <= TOLERANCE


class _PerStepDiscretisation(nn.Module):
    """Δ = softplus(dt + bias) computed inside the loop, and a loop that starts from the first
    input term (h_0 = Δ_0 B_0 u_0) instead of from a zero state."""

    def __init__(self, dim=6, state=3):
        super().__init__()
        self.A_log = nn.Parameter(torch.rand(dim, state))
        self.dt_bias = nn.Parameter(torch.rand(dim) - 0.5)
        self.D = nn.Parameter(torch.randn(dim))

    def forward(self, u, dt, B, C, z):
        A = -torch.exp(self.A_log)
        delta = torch.nn.functional.softplus(dt[:, :, 0] + self.dt_bias)
        h = (delta * u[:, :, 0])[..., None] * B[:, None, :, 0]
        ys = [torch.matmul(h, C[:, :, 0, None])[..., 0]]
        for t in range(1, u.shape[2]):
            delta = torch.nn.functional.softplus(dt[:, :, t] + self.dt_bias)
            h = (
                torch.exp(delta[..., None] * A) * h
                + (delta * u[:, :, t])[..., None] * B[:, None, :, t]
            )
            ys.append(torch.matmul(h, C[:, :, t, None])[..., 0])
        y = torch.stack(ys, -1) + self.D[:, None] * u
        return y * torch.nn.functional.silu(z)


@pytest.mark.parametrize("length", [2, 9])
def test_discretisation_inside_the_loop_and_a_loop_from_the_first_input(length):
    torch.manual_seed(0)
    model = _PerStepDiscretisation()
    b, d, n = 2, 6, 3
    args = (
        torch.randn(b, d, length),
        torch.randn(b, d, length),
        torch.randn(b, n, length),
        torch.randn(b, n, length),
        torch.randn(b, d, length),
    )
    program = torch.export.export(model, args, strict=False)
    out, hits, findings = _run(program)
    assert not findings
    assert hits == {"unrolled_loop": 1, "fold_delta_bias": 1, **{fold: 1 for fold in FOLDS}}
    (scan,) = [n for n in out.graph.nodes if n.target == torch.ops.ssmcc.selective_scan.default]
    assert scan.args[7] is not None and scan.args[8] is True and scan.args[9] is None
    assert (out.module()(*args) - model(*args)).abs().max() <= TOLERANCE


@pytest.mark.parametrize("parallel", [False, True], ids=["sequential", "pscan"])
@pytest.mark.thorough
def test_mambapy_model(parallel):
    """mamba.py's own Mamba (not ours): its sequential loop stacks the states and reads them out
    after the loop; its parallel mode runs pscan. Both become one selective_scan per layer."""
    from mambapy.mamba import Mamba, MambaConfig

    torch.manual_seed(0)
    model = Mamba(MambaConfig(d_model=16, n_layers=2, d_state=4, pscan=parallel)).eval()
    x = torch.randn(2, 16, 16)
    out, hits, findings = _run(torch.export.export(model, (x,), strict=False))
    assert hits[RULE_OF_FORM["pscan" if parallel else "loop"]] == 2 and not findings
    assert hits["fold_delta_bias"] == 2 and all(hits[fold] == 2 for fold in FOLDS)
    # mamba.py's Mamba is a backbone: one norm per block, no final norm
    assert ssmcc_op_counts(out) == {"causal_conv1d": 2, "rmsnorm_gated": 2, "selective_scan": 2}
    with torch.no_grad():
        assert (out.module()(x) - model(x)).abs().max() <= TOLERANCE


class _ScanOpStackedStates(nn.Module):
    """torch's scan along dim 2, the body returning its state; readout by einsum afterwards."""

    def __init__(self, dim=6, state=3):
        super().__init__()
        self.A = nn.Parameter(-torch.rand(dim, state))

    def forward(self, u, dt, B, C):
        from torch._higher_order_ops.scan import scan

        def step(h, xs):
            u_t, dt_t, B_t = xs
            h = torch.exp(dt_t[..., None] * self.A) * h + (dt_t * u_t)[..., None] * B_t[:, None]
            return h, h.clone()

        h0 = torch.zeros(u.shape[0], self.A.shape[0], self.A.shape[1])
        _, hs = scan(step, h0, (u, dt, B), dim=2)
        return torch.einsum("bdln,bnl->bdl", hs, C)


class _TimeSecondLoop(nn.Module):
    """Tensors (batch, time, channel); addcmul update; readout summed over the state dim."""

    def __init__(self, dim=6, state=3):
        super().__init__()
        self.A_log = nn.Parameter(torch.rand(dim, state))
        self.D = nn.Parameter(torch.randn(dim))

    def forward(self, u, dt, B, C, z):
        decay = torch.exp(dt.unsqueeze(-1) * -torch.exp(self.A_log))  # (b, l, d, n)
        drive = (dt * u).unsqueeze(-1) * B.unsqueeze(2)
        h = torch.zeros_like(decay[:, 0])
        ys = []
        for t in range(u.shape[1]):
            h = torch.addcmul(drive[:, t], decay[:, t], h)
            ys.append((h * C[:, t].unsqueeze(1)).sum(dim=2))
        return (torch.stack(ys, 1) + u * self.D) * torch.nn.functional.silu(z)


@pytest.mark.parametrize(
    "model, layout, rule",
    [
        (_ScanOpStackedStates(), "bdl", "scan_op"),
        (_TimeSecondLoop(), "bld", "unrolled_loop"),
    ],
    ids=["scan_op_stacked_states", "time_second_addcmul"],
)
def test_other_spellings(model, layout, rule):
    torch.manual_seed(0)
    b, d, n, length = 2, 6, 3, 10

    def make(channels):
        return (
            torch.randn(b, channels, length)
            if layout == "bdl"
            else torch.randn(b, length, channels)
        )

    args = [make(d), make(d).abs(), make(n), make(n)]
    if isinstance(model, _TimeSecondLoop):
        args.append(make(d))
    out, hits, findings = _run(torch.export.export(model, tuple(args), strict=False))
    assert hits[rule] == 1 and not findings
    assert ssmcc_op_counts(out) == {"selective_scan": 1}
    with torch.no_grad():
        assert (out.module()(*args) - model(*args)).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "form, reason",
    [
        ("tanh", "passes through aten.tanh.default"),
        ("mixing", "mixes state channels"),
        ("alternating", "do not share one update: step 1 computes sigmoid"),
    ],
)
def test_look_alikes_are_left_alone_and_reported(form, reason):
    from ssmcc.passes.canonicalize import canonicalize

    model = build(form, layers=2)
    ids = torch.randint(0, 64, (2, 8))
    program, _ = run_passes(_export(model, ids), [canonicalize])
    ctx = PassContext(verify=True)
    result = detect_selective_scan(program, ctx)
    assert not result.modified and result.program is program and not result.stats
    reported = ctx.diagnostics[f"{PASS}.unrolled_loop"]
    assert len(reported) == 2  # one per layer, each with its module path
    assert reported[0].startswith("layers.0.mixer") and reported[1].startswith("layers.1.mixer")
    assert all(reason in line for line in reported), reported


def test_decay_that_is_not_an_exponential_is_reported():
    class SigmoidDecay(nn.Module):
        def forward(self, u, dt, B, C):
            h = u.new_zeros(u.shape[0], u.shape[1], B.shape[1])
            ys = []
            for t in range(u.shape[2]):
                h = torch.sigmoid(dt[:, :, t, None]) * h + (u[:, :, t, None] * B[:, None, :, t])
                ys.append((h * C[:, None, :, t]).sum(-1))
            return torch.stack(ys, -1)

    args = (torch.randn(2, 4, 5), torch.rand(2, 4, 5), torch.randn(2, 3, 5), torch.randn(2, 3, 5))
    program = torch.export.export(SigmoidDecay(), args, strict=False)
    _, hits, findings = _run(program)
    assert hits == {}
    assert "not exp(Δ·A)" in findings[f"{PASS}.unrolled_loop"][0]


def test_independent_steps_are_not_candidates():
    """A stack over time with no state carried (a map) is neither rewritten nor reported."""

    class PerStep(nn.Module):
        def forward(self, x):
            return torch.stack([torch.tanh(x[:, t]) * 2 for t in range(x.shape[1])], 1)

    program = torch.export.export(PerStep(), (torch.randn(2, 5, 3),), strict=False)
    _, hits, findings = _run(program)
    assert hits == {} and findings == {}


def test_program_without_scans_is_returned_unchanged():
    model = make_hf_model("mamba", num_hidden_layers=1)
    routed = capture(model, torch.randint(0, 101, (2, 8)))
    result = detect_selective_scan(routed, PassContext())
    assert not result.modified and result.program is routed and not result.stats


@pytest.mark.parametrize("form", ["loop", "scan_op", "pscan"])
def test_golden(form, golden):
    model = build(form, layers=1, d_model=4, d_state=2, expand=1, vocab=8)
    ids = torch.randint(0, 8, (1, 4), generator=torch.Generator().manual_seed(0))
    program = _export(model, ids)
    out, hits, _ = _run(program)
    assert hits[RULE_OF_FORM[form]] == 1 and all(hits[fold] == 1 for fold in FOLDS)
    golden(PASS, form, format_program(program), format_program(out))


def test_golden_hugging_face_loop(golden):
    model = make_hf_model("mamba", num_hidden_layers=1, hidden_size=4, state_size=2, vocab_size=8)
    ids = torch.randint(0, 8, (1, 3), generator=torch.Generator().manual_seed(0))
    program = _export(CausalLMLogits(model), ids)
    out, hits, _ = _run(program)
    assert hits == {"unrolled_loop": 1, "fold_delta_bias": 1, **{fold: 1 for fold in FOLDS}}
    golden(PASS, "hf_mamba_loop", format_program(program), format_program(out))
