"""Programs whose scans detect_selective_scan rewrote compile on every target, like routed ones."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from benchmarks.handwritten_mamba import build
from ssmcc.errors import InputError, SSMCCError

from .conftest import FAMILIES, make_hf_model

TOLERANCE = 1e-4
RULES = {"loop": "unrolled_loop", "scan_op": "scan_op", "pscan": "parallel_scan"}


@pytest.mark.parametrize(
    "form,target",
    [("scan_op", "torch")]
    + [
        pytest.param(form, target, marks=pytest.mark.slow)
        for form, target in [
            ("loop", "onnx"),
            ("loop", "torch"),
            ("pscan", "torch"),
            ("scan_op", "onnx"),
            ("pscan", "onnx"),
        ]
    ],
)
def test_handwritten_stack_compiles(form, target):
    model = build(form, layers=2)
    ids = torch.randint(0, 64, (2, 16))
    compiled = ssmcc.compile(model, target, example_inputs=(ids,))
    assert compiled.report.op_counts["selective_scan"] == 2
    assert compiled.report.rule_hits[f"detect_selective_scan.{RULES[form]}"] == 2
    assert compiled.report.findings == []
    with torch.no_grad():
        expected = model(ids)
    assert (torch.as_tensor(compiled(ids)) - expected).abs().max() <= TOLERANCE


@pytest.mark.parametrize("target", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
@pytest.mark.parametrize("family", FAMILIES)
def test_hugging_face_without_routing_becomes_a_routed_like_program(family, target):
    """HF's own loop, captured at 24 tokens with routing off: once the scans and the cut conv1d
    are ssmcc ops nothing else uses the length, so the program runs at any length and streams;
    greedy tokens identical to HF generate."""
    model = make_hf_model(family, num_hidden_layers=2)
    ids = torch.randint(0, 101, (2, 24))
    compiled = ssmcc.compile(model, target, example_inputs=(ids,), route=False)
    # each layer's detected conv and scan fused into one mixer; 2 block norms, norm_f
    assert compiled.report.op_counts == {"mamba_mixer": 2, "rmsnorm_gated": 3}
    assert compiled.report.rule_hits["detect_selective_scan.unrolled_loop"] == 2
    assert compiled.report.capture.routes == [] and compiled.static_length is None
    assert "length made dynamic" in compiled.report.capture.notes[-1]
    with torch.no_grad():
        for batch, length in ((1, 1), (3, 7), (2, 40)):
            rows = torch.randint(0, 101, (batch, length))
            assert (torch.as_tensor(compiled(rows)) - model(rows).logits).abs().max() <= TOLERANCE
        expected = model.generate(ids[:, :5], max_new_tokens=6, do_sample=False)
    tokens = torch.as_tensor(compiled.generate(ids[:, :5], 6))
    assert torch.equal(tokens, expected)  # prompt + 6 new tokens, as HF returns them


@pytest.mark.parametrize("target", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
def test_a_program_that_keeps_its_length_runs_at_that_length_only(target, tmp_path):
    """Without the passes (pipeline "none") the unrolled loop keeps the captured length."""
    model = make_hf_model("mamba", num_hidden_layers=2)
    ids = torch.randint(0, 101, (2, 12))
    compiled = ssmcc.compile(model, target, example_inputs=(ids,), route=False, pipeline="none")
    assert compiled.static_length == 12
    assert "length stays static at 12 tokens" in compiled.report.capture.notes[-1]
    with torch.no_grad():
        rows = torch.randint(0, 101, (3, 12))
        assert (compiled(rows) - model(rows).logits).abs().max() <= TOLERANCE
    with pytest.raises(InputError, match="static length of 12 tokens"):
        compiled(ids[:, :10])
    with pytest.raises(SSMCCError, match="prefill/step/generate need a program whose length"):
        compiled.generate(ids, max_new_tokens=2)
    if target == "onnx":
        assert compiled.executable.graphs == ("forward",)  # no step graph to stream with
        compiled.save(str(tmp_path / "artifact"))
        loaded = ssmcc.load(str(tmp_path / "artifact"))
        assert loaded.static_length == 12
        assert (loaded(ids) - compiled(ids)).abs().max() == 0


def test_compile_takes_an_exported_program():
    model = build("loop", layers=1)
    ids = torch.randint(0, 64, (2, 12))
    program = torch.export.export(model, (ids,), strict=False)
    compiled = ssmcc.compile(program, "onnx")
    assert compiled.report.capture.model == "ExportedProgram"
    assert compiled.report.op_counts == {
        "causal_conv1d": 1,
        "rmsnorm_gated": 2,
        "selective_scan": 1,
    }
    with torch.no_grad():
        assert (torch.as_tensor(compiled(ids)) - model(ids)).abs().max() <= TOLERANCE


def test_report_lists_scans_not_rewritten():
    model = build("tanh", layers=1)
    compiled = ssmcc.compile(model, "torch", example_inputs=(torch.randint(0, 64, (2, 6)),))
    assert "selective_scan" not in compiled.report.op_counts
    (finding,) = compiled.report.findings
    assert finding.startswith("unrolled_loop: layers.0.mixer")
    assert "aten.tanh" in finding and "not linear" in finding
    assert "not rewritten:  1 scan-like structure(s)" in compiled.report.format()
