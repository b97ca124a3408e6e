"""The ssmcc ops as torch.library ops: opcheck, one opaque node under export, symbolic shapes."""

from __future__ import annotations

import pytest
import torch
from torch.export import Dim

import ssmcc.ops  # noqa: F401

from .test_ops_reference import scan_case


def _scan_args():
    case = scan_case(2, 6, 4, 7, 3, True, True, True, True)
    return (
        case["u"],
        case["delta"],
        case["A"],
        case["B"],
        case["C"],
        case["D"],
        case["z"],
        case["delta_bias"],
        True,
        case["initial_state"],
    )


def _conv_args():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 5, 9, generator=g),
        torch.randn(5, 4, generator=g),
        torch.randn(5, generator=g),
        torch.randn(2, 5, 3, generator=g),
        "silu",
    )


def _step_args():
    g = torch.Generator().manual_seed(0)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return (
        r(2, 6, 4),
        r(2, 6),
        r(2, 6).abs(),
        -r(6, 4).abs(),
        r(2, 4),
        r(2, 4),
        r(6),
        r(2, 6),
        r(6),
        True,
    )


def _conv_step_args():
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(2, 5, generator=g),
        torch.randn(2, 5, 3, generator=g),
        torch.randn(5, 4, generator=g),
        None,
        "silu",
    )


OPS = {
    "selective_scan": _scan_args,
    "selective_state_update": _step_args,
    "causal_conv1d": _conv_args,
    "causal_conv1d_update": _conv_step_args,
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_opcheck(name):
    """torch.library's own checks: schema, fake impl agrees with the real one, no aliasing."""
    op = getattr(torch.ops.ssmcc, name).default
    torch.library.opcheck(op, OPS[name](), test_utils=("test_schema", "test_faketensor"))


class ScanAndConv(torch.nn.Module):
    def forward(self, x, weight, dt, A, B, C):
        y, _ = torch.ops.ssmcc.causal_conv1d(x, weight, None, None, "silu")
        out, last = torch.ops.ssmcc.selective_scan(y, dt, A, B, C, None, None, None, True, None)
        return out, last


def test_export_gives_one_node_per_op_with_symbolic_shapes():
    batch, seq = Dim("batch", min=1), Dim("seq", min=1)
    args = (
        torch.randn(2, 6, 9),
        torch.randn(6, 4),
        torch.randn(2, 6, 9),
        -torch.rand(6, 3),
        torch.randn(2, 3, 9),
        torch.randn(2, 3, 9),
    )
    shapes = (
        {0: batch, 2: seq},
        None,
        {0: batch, 2: seq},
        None,
        {0: batch, 2: seq},
        {0: batch, 2: seq},
    )
    program = torch.export.export(ScanAndConv(), args, dynamic_shapes=shapes, strict=False)
    targets = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert targets.count(torch.ops.ssmcc.selective_scan.default) == 1
    assert targets.count(torch.ops.ssmcc.causal_conv1d.default) == 1
    scan = next(
        n for n in program.graph.nodes if n.target == torch.ops.ssmcc.selective_scan.default
    )
    out_meta, last_meta = scan.meta["val"]
    assert isinstance(out_meta.shape[0], torch.SymInt) and isinstance(
        out_meta.shape[2], torch.SymInt
    )
    assert last_meta.shape[1:] == (6, 3) and last_meta.dtype == torch.float32
    for length in (1, 5, 33):
        inputs = (
            torch.randn(3, 6, length),
            args[1],
            torch.randn(3, 6, length),
            args[3],
            torch.randn(3, 3, length),
            torch.randn(3, 3, length),
        )
        torch.testing.assert_close(program.module()(*inputs), ScanAndConv()(*inputs))
    reloaded = _save_load(program)
    assert (
        sum(n.target == torch.ops.ssmcc.selective_scan.default for n in reloaded.graph.nodes) == 1
    )


def _save_load(program):
    import io

    buffer = io.BytesIO()
    torch.export.save(program, buffer)
    buffer.seek(0)
    return torch.export.load(buffer)
