"""quantize_weights: golden before/after on the tiny Mamba program after the default pipeline
(int8 and bf16), rule hits, and the quantised program within the scheme's tolerance of the float
one."""

from __future__ import annotations

import pytest
import torch

from ssmcc.passes import PassContext, format_program, pipeline, run_passes
from ssmcc.passes.quantize_weights import quantize_weights

from .test_pass_canonicalize import tiny_mamba_program


@pytest.mark.parametrize("scheme,tolerance", [("int8", 5e-2), ("bf16", 2e-2)])
def test_tiny_mamba_golden(golden, scheme, tolerance):
    model, captured = tiny_mamba_program()
    program, _ = run_passes(captured, pipeline("default"), PassContext())
    ctx = PassContext(verify=True, options={"quantize_weights": {"scheme": scheme}})
    after, report = run_passes(program, [quantize_weights], ctx)
    golden("quantize_weights", f"tiny_mamba_{scheme}", format_program(program),
           format_program(after))
    hits = report.rule_hits
    # in/out projections and the LM head; the fused mixer's x_proj and dt_proj; the embedding,
    # tied to the head: one small copy
    assert hits["quantize_weights.linear"] == 3
    assert hits["quantize_weights.mixer"] == 2
    assert hits["quantize_weights.embedding"] == 1 and hits["quantize_weights.tied"] == 1
    ids = torch.randint(0, 16, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = program.module()(ids), after.module()(ids)
    assert (got - expected).abs().max() <= tolerance * expected.abs().max()
