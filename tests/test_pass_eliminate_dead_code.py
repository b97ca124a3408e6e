"""eliminate_dead_code: golden before/after, hit counts, and a program with nothing dead."""

from __future__ import annotations

import torch

from ssmcc.passes import PassContext, format_program, run_passes
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code

from .test_pass_canonicalize import tiny_mamba_program


def test_unused_final_states_are_removed(golden):
    _, program = tiny_mamba_program()
    canonical, _ = run_passes(program, [canonicalize])
    after, report = run_passes(canonical, [eliminate_dead_code], PassContext(verify=True))
    golden("eliminate_dead_code", "tiny_mamba", format_program(canonical), format_program(after))
    # The layer's final conv and SSM states are computed by the ops but unused by the logits.
    assert report.rule_hits == {"eliminate_dead_code.dead_node": 2}
    ids = torch.randint(0, 16, (2, 7))
    with torch.no_grad():
        assert torch.equal(after.module()(ids), canonical.module()(ids))


def test_live_program_is_left_alone():
    class Live(torch.nn.Module):
        def forward(self, x):
            a, b = torch.split(x, 2, dim=-1)
            return a * b

    program = torch.export.export(Live(), (torch.randn(3, 4),), strict=False)
    result = eliminate_dead_code(program, PassContext())
    assert not result.modified and result.stats["dead_node"] == 0
    assert result.program is program
