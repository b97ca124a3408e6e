"""fold_batched_matmul (a graph rewrite of the Dynamo backend): AOT autograd's decomposition of
a batched ``matmul`` (expand, view, bmm, _unsafe_view; a clone for a non-contiguous operand)
folded back into ``aten.matmul``: golden before/after, hits, the same values; a bmm that was a
bmm, and a 2-D matmul, are left."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from ssmcc.passes import PassContext
from ssmcc.passes.fold_batched_matmul import fold_batched_matmuls


def _graph_text(module: torch.fx.GraphModule) -> str:
    lines = []
    for node in module.graph.nodes:
        if node.op == "call_function":
            args = ", ".join(str(a) for a in node.args)
            lines.append(f"%{node.name} = {node.target}({args})")
        elif node.op in ("placeholder", "output"):
            lines.append(f"{node.op} {node.args if node.op == 'output' else node.name}")
    return "\n".join(lines) + "\n"


def _traced(function, *inputs):
    return make_fx(function)(*inputs)  # matmul decomposes as AOT autograd writes it


def readouts(h, C, x):
    """A readout h . C with batch dims (both contiguous), one through a transpose (a copy)."""
    return h @ C, x.transpose(-1, -2) @ C


def test_batched_readouts_golden(golden):
    g = torch.Generator().manual_seed(0)
    h, C = torch.randn(2, 3, 4, 5, generator=g), torch.randn(2, 3, 5, 1, generator=g)
    x = torch.randn(2, 3, 5, 4, generator=g)
    module = _traced(readouts, h, C, x)
    before = _graph_text(module)
    hits = fold_batched_matmuls(module, PassContext())
    module.recompile()
    golden("fold_batched_matmul", "batched_readouts", before, _graph_text(module))
    assert hits == {"batched_matmul": 2}
    matmuls = [n for n in module.graph.nodes if n.target == torch.ops.aten.matmul.default]
    assert len(matmuls) == 2
    assert not [n for n in module.graph.nodes if n.target == torch.ops.aten.bmm.default]
    for got, expected in zip(module(h, C, x), readouts(h, C, x), strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


def test_a_plain_bmm_and_a_2d_matmul_are_left():
    def plain(a, b, c, d):
        return torch.bmm(a, b), c @ d

    g = torch.Generator().manual_seed(1)
    inputs = (torch.randn(3, 4, 5, generator=g), torch.randn(3, 5, 2, generator=g),
              torch.randn(4, 5, generator=g), torch.randn(5, 2, generator=g))
    module = _traced(plain, *inputs)
    before = _graph_text(module)
    assert fold_batched_matmuls(module, PassContext()) == {}
    assert _graph_text(module) == before
