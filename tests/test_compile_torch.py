"""ssmcc.compile(target="torch"): call surface, report, target errors, lowering coverage."""

from __future__ import annotations

import json

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError, OptionError
from ssmcc.lowering.registry import coverage, get_target
from ssmcc.lowering.torch.lower import lower_to_torch
from ssmcc.ops import SSMCC_OPS

from .conftest import FAMILIES, make_hf_model


@pytest.fixture(scope="module", params=FAMILIES)
def model_and_compiled(request):
    model = make_hf_model(request.param)
    return model, ssmcc.compile(model, target="torch", verify=True)


@pytest.mark.parametrize("batch,length", [(1, 1), (3, 7), (2, 130)])
def test_compiled_logits_match_eager(model_and_compiled, batch, length):
    model, compiled = model_and_compiled
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    with torch.no_grad():
        expected = model(ids).logits
    assert (compiled(ids) - expected).abs().max() <= 1e-4


def test_report_describes_capture_and_passes(model_and_compiled):
    model, compiled = model_and_compiled
    report = compiled.report
    layers = model.config.num_hidden_layers
    assert report.target == "torch" and compiled.target == "torch"
    assert report.op_counts == {
        "mamba_mixer": layers,  # each mixer's conv, projections and scan, fused
        "rmsnorm_gated": layers + 1,  # each block's norm and norm_f, fused
    }
    assert report.passes_run == [
        "canonicalize",
        "detect_causal_conv1d",
        "detect_selective_scan",
        "fuse_scan_norm_mlp",
        "eliminate_dead_code",
    ]
    # the 6 ATen nodes of each fused norm; the 21 of each fused mixer's chain (transposes,
    # chunk, conv, x_proj, split, dt_proj, scan, their getitems and weight-only nodes), and
    # FalconMamba's 3 weightless norms of 6 nodes inside it
    mixer = 21 + (18 if model.config.model_type == "falcon_mamba" else 0)
    assert report.rule_hits["eliminate_dead_code.dead_node"] == 6 * (layers + 1) + mixer * layers
    assert report.node_count == len(compiled.program.graph.nodes) < report.capture.node_count
    text = report.format()
    assert f"SSM layers:     {layers}" in text and "seq[1,inf]" in text
    assert json.loads(report.to_json())["capture"]["routes"] == report.capture.routes


def test_unknown_targets_are_refused_clearly():
    model = make_hf_model("mamba", num_hidden_layers=1)
    available = "available: onnx, tensorrt, torch, triton"
    with pytest.raises(InputError, match=f"unknown target 'cuda'; {available}"):
        ssmcc.compile(model, target="cuda")
    with pytest.raises(OptionError, match=f"unknown target 'cuda'; {available}"):
        get_target("cuda")


@pytest.mark.parametrize("kernels", ["auto", "reference"])
def test_both_kernel_choices_match_eager(kernels):
    from ssmcc.kernels.cpu.torch_binding import VERIFIED_PROGRAM_KERNELS as KERNELS

    model = make_hf_model("mamba")
    compiled = ssmcc.compile(model, kernels=kernels)
    targets = {
        n.target
        for n in compiled.executable.module("forward").graph.nodes
        if n.op == "call_function"
    }
    uses_cpp = KERNELS["mamba_mixer"] in targets
    assert uses_cpp == (kernels == "auto")
    ids = torch.randint(0, model.config.vocab_size, (2, 33))
    with torch.no_grad():
        assert (compiled(ids) - model(ids).logits).abs().max() <= 1e-4


def test_op_without_table_entry_runs_through_its_registered_implementation(monkeypatch):
    """The torch target runs every ssmcc op: one without a kernel entry stays a torch.ops call,
    which PyTorch dispatches to the op's registered implementation."""
    from ssmcc.lowering.torch import lower as torch_lower

    model = make_hf_model("mamba", num_hidden_layers=1)
    program = ssmcc.capture(model, (torch.zeros(2, 4, dtype=torch.long),))
    table = dict(torch_lower.TORCH_TABLE)
    del table["selective_scan"]
    monkeypatch.setattr(torch_lower, "TORCH_TABLE", table)
    module = lower_to_torch(program)
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    assert SSMCC_OPS["selective_scan"] in targets
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        assert (module(ids) - model(ids).logits).abs().max() <= 1e-4


def test_coverage_lists_every_op_for_every_backend():
    rows = coverage()
    backends = {"torch", "onnx", "triton", "tensorrt"}
    assert {(r["op"], r["backend"]) for r in rows} == {
        (op, b) for op in SSMCC_OPS for b in backends
    }
    assert all(r["status"] == "supported" for r in rows if r["backend"] == "torch")
    onnx_rows = {r["op"]: r["status"] for r in rows if r["backend"] == "onnx"}
    assert onnx_rows["selective_scan"] == onnx_rows["causal_conv1d"] == "supported"
    assert all(r["detail"] for r in rows)
