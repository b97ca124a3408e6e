"""canonicalize: golden before/after, rule hits, bit-identical outputs, cases it must leave."""

from __future__ import annotations

import torch

import ssmcc
from ssmcc.passes import PassContext, format_program, run_passes
from ssmcc.passes.canonicalize import canonicalize

from .conftest import make_hf_model


def tiny_mamba_program():
    model = make_hf_model(
        "mamba",
        vocab_size=16,
        hidden_size=8,
        state_size=4,
        num_hidden_layers=1,
        time_step_rank=2,
    )
    ids = torch.randint(0, 16, (2, 5), generator=torch.Generator().manual_seed(0))
    return model, ssmcc.capture(model, (ids,))


def test_tiny_mamba_golden(golden):
    model, program = tiny_mamba_program()
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [canonicalize], ctx)
    golden("canonicalize", "tiny_mamba", format_program(program), format_program(after))
    assert report.rule_hits == {
        "canonicalize.full_slice": 2,
        "canonicalize.inverse_transpose": 1,  # the mixer's conv output, transposed twice
        # per layer 8 (A_log/D/dt bias .float(), the mixer's .to(dtype) casts, the norm's),
        # 4 outside the layers (final norm, logits .float()), each with its metadata assert
        "canonicalize.metadata_assert": 12,
        "canonicalize.noop_cast": 12,
    }
    ids = torch.randint(0, 16, (3, 13))
    with torch.no_grad():
        assert torch.equal(after.module()(ids), program.module()(ids))


class RealCastsAndSlices(torch.nn.Module):
    def forward(self, x):
        half = x.half().float()  # real round trip: both casts change the dtype
        same = x.float()  # no-op: x is already float32
        everything = torch.ops.aten.slice.Tensor(same, 1, 0, 2**63 - 1)  # as HF writes [:, -0:]
        return half[:, :3] + same[:, :3], everything * 2


def test_real_casts_and_partial_slices_are_kept(golden):
    model = RealCastsAndSlices()
    program = torch.export.export(model, (torch.randn(2, 6),), strict=False)
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [canonicalize], ctx)
    golden("canonicalize", "real_casts_kept", format_program(program), format_program(after))
    hits = report.rule_hits
    assert hits.get("canonicalize.noop_cast") == 1
    assert hits.get("canonicalize.full_slice") == 1
    kept = [n.target for n in after.graph.nodes if n.op == "call_function"]
    assert kept.count(torch.ops.aten.to.dtype) == 2  # to f16, back to f32
    assert kept.count(torch.ops.aten.slice.Tensor) == 2  # the [:, :3] slices
    assert any("converts torch.float32" in r for r in ctx.diagnostics["canonicalize.noop_cast"])
    assert any("end 3 cuts the dim" in r for r in ctx.diagnostics["canonicalize.full_slice"])
    x = torch.randn(2, 6)
    for got, expected in zip(after.module()(x), model(x), strict=True):
        assert torch.equal(got, expected)


class ViewRoundTrips(torch.nn.Module):
    def forward(self, x, y):
        back = x.transpose(1, 2).transpose(2, 1)  # inverse: x
        turned = x.transpose(0, 1).transpose(1, 2)  # not an inverse: kept
        selected = y.unsqueeze(-1).select(2, 0)  # inverse: y
        squeezed = y.unsqueeze(0).squeeze(0)  # inverse: y
        other = y.unsqueeze(1).select(2, 0)  # another dim: kept
        return back * 2, turned + 1, selected + squeezed, other


def test_view_round_trips_are_removed_and_others_kept(golden):
    model = ViewRoundTrips()
    args = (torch.randn(2, 3, 4), torch.randn(5, 6))
    program = torch.export.export(model, args, strict=False)
    ctx = PassContext(verify=True)
    after, report = run_passes(program, [canonicalize], ctx)
    golden("canonicalize", "view_round_trips", format_program(program), format_program(after))
    assert report.rule_hits == {
        "canonicalize.inverse_transpose": 1,
        "canonicalize.undo_unsqueeze": 2,
    }
    assert any("swaps" in r for r in ctx.diagnostics["canonicalize.inverse_transpose"])
    assert any(
        "is not the unsqueezed dim" in r for r in ctx.diagnostics["canonicalize.undo_unsqueeze"]
    )
    for got, expected in zip(after.module()(*args), model(*args), strict=True):
        assert torch.equal(got, expected)


def test_nothing_to_do_reports_unmodified():
    class Plain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) * 2

    program = torch.export.export(Plain(), (torch.randn(3),), strict=False)
    result = canonicalize(program, PassContext())
    assert not result.modified and not result.stats
