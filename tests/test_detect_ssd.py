"""Mamba-2 (SSD) scans that capture did not route: HF's own chunked torch path exported at a static
length, a per-step loop in head layout, a hand-written chunked block decomposition; look-alikes
reported with the failing check and left as they are.

Tolerance: 1e-4 (fp32) against the original model, as for Mamba-1's detected scans.
"""

from __future__ import annotations

import pytest
import torch

import ssmcc
from benchmarks.handwritten_ssd import build

from .conftest import make_hf_model, odd_mamba2_sizes

TOLERANCE = 1e-4
SSD_RULES = ("chunked_ssd", "fold_softplus", "fold_delta_bias", "fold_dt_limit", "fold_skip")


def _mamba2(**overrides):
    return make_hf_model("mamba2", eos_token_id=None, num_hidden_layers=2, **overrides)


def _hits(compiled) -> dict:
    prefix = "detect_selective_scan."
    return {k.removeprefix(prefix): v for k, v in compiled.report.rule_hits.items() if prefix in k}


def _hf_logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _ssd_nodes(compiled):
    return [
        node
        for node in compiled.program.graph.nodes
        if node.op == "call_function" and "ssd_scan" in str(node.target)
    ]


@pytest.mark.parametrize(
    "chunk,capture_length,target",
    [(16, 24, "torch"), (256, 24, "torch"), pytest.param(16, 32, "onnx", marks=pytest.mark.slow)],
    ids=["chunk16-pad8-torch", "chunk256-pad232-torch", "chunk16-nopad-onnx"],
)
def test_hugging_face_chunked_path_becomes_one_ssd_scan_per_layer(chunk, capture_length, target):
    """HF's torch path at a static length (padded to the chunk or not): one ssd_scan per layer,
    the length made dynamic again, logits and greedy tokens as HF's."""
    model = _mamba2(chunk_size=chunk)
    ids = torch.randint(0, 101, (2, capture_length))
    compiled = ssmcc.compile(model, target, example_inputs=(ids,), route=False)
    # 2 block norms and norm_f fused; the mixers' gated norms stay ATen (their group view)
    assert compiled.report.op_counts == {"causal_conv1d": 2, "rmsnorm_gated": 3, "ssd_scan": 2}
    assert _hits(compiled) == {rule: 2 for rule in SSD_RULES}
    assert compiled.report.findings == [] and compiled.static_length is None
    assert "length made dynamic" in compiled.report.capture.notes[-1]
    for batch, length in ((1, 1), (3, 7), (2, 37), (1, 257)):
        rows = torch.randint(0, 101, (batch, length))
        got = torch.as_tensor(compiled(rows))
        assert (got - _hf_logits(model, rows)).abs().max() <= TOLERANCE
    prompt = ids[:, :5]
    with torch.no_grad():
        expected = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    assert torch.equal(torch.as_tensor(compiled.generate(prompt, 8)), expected)


def test_groups_are_read_back_from_the_per_head_repeat():
    """HF repeats B/C per head before the chunked math; the op gets the g groups themselves."""
    model = _mamba2(num_heads=6, n_groups=3)
    compiled = ssmcc.compile(
        model, "torch", example_inputs=(torch.zeros(1, 16).long(),), route=False
    )
    for node in _ssd_nodes(compiled):
        x, _, _, B, C = node.args[:5]
        assert x.meta["val"].shape[2] == 6
        assert B.meta["val"].shape[2] == 3 and C.meta["val"].shape[2] == 3


@pytest.mark.parametrize("heads,head_dim,groups,state", [(3, 5, 6, 7), (11, 19, 1, 7)])
def test_odd_shapes_without_routing(heads, head_dim, groups, state):
    """Groups 1 and h, state 7, chunk 17 (captured at 40 tokens: 3 chunks, the last padded)."""
    model = _mamba2(**odd_mamba2_sizes(heads, head_dim, groups, state))
    ids = torch.randint(0, 101, (2, 40))
    compiled = ssmcc.compile(model, "torch", example_inputs=(ids,), route=False)
    assert compiled.report.op_counts["ssd_scan"] == 2
    rows = torch.randint(0, 101, (2, 119))
    assert (torch.as_tensor(compiled(rows)) - _hf_logits(model, rows)).abs().max() <= TOLERANCE


def test_a_head_dim_equal_to_the_captured_length_is_not_taken_for_the_length():
    """Captured at 16 tokens with head_dim 16: the views that wrote the length are generalised,
    the ones whose 16 is the head dim are not (the program runs right at other lengths)."""
    model = _mamba2(hidden_size=24, num_heads=3, head_dim=16, n_groups=1, chunk_size=16)
    compiled = ssmcc.compile(
        model, "torch", example_inputs=(torch.zeros(2, 16).long(),), route=False
    )
    assert compiled.static_length is None
    for length in (5, 16, 33):
        rows = torch.randint(0, 101, (2, length))
        assert (torch.as_tensor(compiled(rows)) - _hf_logits(model, rows)).abs().max() <= TOLERANCE


@pytest.mark.parametrize("target", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
def test_a_per_step_loop_in_head_layout_is_found(target):
    model = build("loop")
    ids = torch.randint(0, 64, (2, 12))
    compiled = ssmcc.compile(model, target, example_inputs=(ids,))
    assert compiled.report.op_counts == {"ssd_scan": 2}
    assert _hits(compiled) == {"unrolled_loop": 2, "fold_skip": 2}
    with torch.no_grad():
        assert (torch.as_tensor(compiled(ids)) - model(ids)).abs().max() <= TOLERANCE


def test_a_handwritten_chunked_form_exported_by_the_user_is_found():
    """mamba_ssm's ssd_minimal decomposition, written with einsums, in a static torch.export."""
    model = build("chunked")
    ids = torch.randint(0, 64, (2, 24))
    compiled = ssmcc.compile(torch.export.export(model, (ids,)), "torch")
    assert compiled.report.op_counts == {"ssd_scan": 2}
    assert _hits(compiled)["chunked_ssd"] == 2
    with torch.no_grad():
        assert (torch.as_tensor(compiled(ids)) - model(ids)).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "form,why",
    [
        ("loop_sigmoid", "the decay is sigmoid"),
        ("chunked_squared", "is not dt ⊗ A"),
        ("chunked_no_carry", "does not compute the SSD recurrence"),
    ],
)
def test_look_alikes_are_reported_not_rewritten(form, why):
    model = build(form)
    ids = torch.randint(0, 64, (2, 16))
    program = torch.export.export(model, (ids,))
    compiled = ssmcc.compile(program, "torch")
    assert "ssd_scan" not in compiled.report.op_counts
    findings = compiled.report.findings
    assert len(findings) == 2 and all(why in line for line in findings), findings
    assert all(f"mixers.{i}" in line for i, line in enumerate(findings))
    with torch.no_grad():
        assert (torch.as_tensor(compiled(ids)) - model(ids)).abs().max() <= TOLERANCE


def test_a_bfloat16_model_without_routing():
    """In bf16 HF casts dt and x to float32 around the chunked math; the casts are followed."""
    from .test_mamba2 import LOW_PRECISION_TOLERANCE

    model = _mamba2()
    compiled = ssmcc.compile(model, "torch", route=False, dtype=torch.bfloat16)
    assert compiled.report.op_counts["ssd_scan"] == 2 and compiled.static_length is None
    low = _mamba2().to(torch.bfloat16)
    ids = torch.randint(0, 101, (2, 37))
    torch.testing.assert_close(
        torch.as_tensor(compiled(ids)).float(),
        _hf_logits(low, ids).float(),
        **LOW_PRECISION_TOLERANCE[torch.bfloat16],
    )
