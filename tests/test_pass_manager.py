"""Pass manager, verifier and printer: errors name the pass, the verifier catches broken IR."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.errors import PassError
from ssmcc.passes import (
    PIPELINES,
    PassContext,
    PassResult,
    format_program,
    pipeline,
    run_passes,
    verification_errors,
)
from ssmcc.passes.canonicalize import canonicalize

from .test_pass_canonicalize import tiny_mamba_program


def explode(program, ctx):
    raise ValueError("boom")


def corrupt_scan_metadata(program, ctx):
    """Shrinks the recorded state size of every selective_scan: the verifier must notice."""
    for node in program.graph.nodes:
        if node.target == torch.ops.ssmcc.selective_scan.default:
            out, last = node.meta["val"]
            node.meta["val"] = (out, last[..., :1])
    return PassResult(program, True)


def test_failing_pass_is_named_with_the_passes_before_it():
    _, program = tiny_mamba_program()
    with pytest.raises(
        PassError,
        match=r"pass explode failed \(passes run before it: "
        r"canonicalize\): ValueError: boom",
    ):
        run_passes(program, [canonicalize, explode])


def test_verifier_catches_wrong_ssmcc_metadata():
    _, program = tiny_mamba_program()
    with pytest.raises(
        PassError,
        match="(?s)IR verification failed after pass "
        "corrupt_scan_metadata.*fake implementation gives",
    ):
        run_passes(program, [corrupt_scan_metadata], PassContext(verify=True))


def test_captured_programs_verify_clean():
    _, program = tiny_mamba_program()
    assert verification_errors(program) == []


def test_run_passes_does_not_touch_its_input():
    _, program = tiny_mamba_program()
    before = format_program(program)
    run_passes(program, pipeline("default"))
    assert format_program(program) == before


def test_fixed_point_stops_when_nothing_changes():
    _, program = tiny_mamba_program()
    _, report = run_passes(program, pipeline("default"), until_fixed_point=True)
    # round 1 modifies, round 2 confirms nothing is left to do
    names = [
        "canonicalize",
        "detect_causal_conv1d",
        "detect_selective_scan",
        "fuse_scan_norm_mlp",
        "eliminate_dead_code",
    ]
    assert report.passes_run == names * 2
    # a routed capture has no convolution or scan left to detect; its norms fuse
    assert [r.modified for r in report.records] == [True, False, False, True, True] + [False] * 5


def test_unknown_pipeline_names_the_known_ones():
    with pytest.raises(ssmcc.SSMCCError, match="unknown pipeline 'fast'; known: default"):
        pipeline("fast")
    assert list(PIPELINES) == ["default", "unfused", "none"]


def test_printer_is_stable_and_renames_symbols():
    texts = [format_program(tiny_mamba_program()[1]) for _ in range(2)]
    assert texts[0] == texts[1]
    assert "%input_ids: i64[s0, s1]  (user_input)" in texts[0]
    assert "0x" not in texts[0]  # no object ids
