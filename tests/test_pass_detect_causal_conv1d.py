"""detect_causal_conv1d: a padded depthwise conv1d cut to the input length becomes the op."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from ssmcc.frontend.report import ssmcc_op_counts
from ssmcc.passes import PassContext, format_program, run_passes
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.detect_causal_conv1d import detect_causal_conv1d
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code


class _Conv(nn.Module):
    def __init__(self, channels=5, width=4, padding=None, activation=True, bias=True):
        super().__init__()
        padding = width - 1 if padding is None else padding
        self.conv = nn.Conv1d(
            channels, channels, width, groups=channels, padding=padding, bias=bias
        )
        self.activation = activation

    def forward(self, x):  # (b, d, l)
        y = self.conv(x)[..., : x.shape[-1]]
        return torch.nn.functional.silu(y) if self.activation else y


def _run(model, x):
    program = torch.export.export(model, (x,), strict=False)
    ctx = PassContext(verify=True)
    out, report = run_passes(
        program, [canonicalize, detect_causal_conv1d, eliminate_dead_code], ctx
    )
    hits = {
        k.split(".", 1)[1]: v for k, v in report.rule_hits.items() if k.startswith("detect_causal")
    }
    return program, out, hits, ctx.diagnostics


@pytest.mark.parametrize("activation", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_padded_conv_becomes_causal_conv1d(activation, bias):
    torch.manual_seed(0)
    model, x = _Conv(activation=activation, bias=bias), torch.randn(2, 5, 9)
    _, out, hits, _ = _run(model, x)
    assert hits == {"padded_conv_slice": 1, **({"fold_silu": 1} if activation else {})}
    assert ssmcc_op_counts(out) == {"causal_conv1d": 1}
    (conv,) = [n for n in out.graph.nodes if n.target == torch.ops.ssmcc.causal_conv1d.default]
    assert conv.args[4] == ("silu" if activation else None)
    assert (out.module()(x) - model(x)).abs().max() <= 1e-5


def test_a_conv_that_is_not_causal_is_left_alone_and_reported():
    model, x = _Conv(padding=2), torch.randn(2, 5, 9)  # sees one step of the future
    program, out, hits, diagnostics = _run(model, x)
    assert hits == {} and ssmcc_op_counts(out) == {}
    (reason,) = diagnostics["detect_causal_conv1d.padded_conv_slice"]
    assert "padding [2], not kernel width - 1 = 3" in reason
    assert torch.equal(out.module()(x), model(x))


def test_golden(golden):
    torch.manual_seed(0)
    program, out, _, _ = _run(_Conv(channels=3, width=3), torch.randn(1, 3, 4))
    golden("detect_causal_conv1d", "silu_after_cut", format_program(program), format_program(out))
