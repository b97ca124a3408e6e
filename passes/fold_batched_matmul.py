"""Rule ``batched_matmul``: AOT autograd's decomposition of a batched ``matmul`` folded back.

``torch.compile`` hands the backend a graph in which ``a @ b`` with batch dims (a (..., m, k),
b (..., k, n), both rank >= 3) is written as::

    _unsafe_view(bmm(view(expand(a, S + (m, k)), (P, m, k)),
                     view(expand(b, S + (k, n)), (P, k, n))), S + (m, n))

with S the broadcast batch shape and P its product (an operand that is not contiguous is copied
first: ``_unsafe_view(clone(expand(a, ...)), ...)``; an expand to a's own shape may be absent).
The detection passes read a readout ``h · C`` as a ``matmul`` of the state (as ``torch.export``
writes it); this rule gives them that form back: the chain becomes ``aten.matmul(a, b)``, which
is the same function (matmul's own decomposition is this chain). Inductor's re-trace decomposes
it again.
"""

from __future__ import annotations

import math
from collections import Counter

import torch
from torch.fx import GraphModule, Node
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ssmcc.passes.dim_labels import shape
from ssmcc.passes.pass_base import PassContext
from ssmcc.passes.rules import NodeRule, Reject, apply_rules

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _same(a, b) -> bool:
    """Sizes known equal, symbolic ones included, without adding a shape guard."""
    return statically_known_true(a == b)


def _sizes(got, want) -> bool:
    return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))


def _operand(node: Node, batch, rows, cols):
    """``x`` when ``node`` is ``view(expand(x, batch + (rows, cols)), (prod(batch), rows, cols))``
    (the expand may be absent where x already has that shape)."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return None
    if not _sizes(shape(node), (math.prod(batch), rows, cols)):
        return None
    source = node.args[0]
    if source.op == "call_function" and source.target == aten.clone.default:
        source = source.args[0]  # reshape's copy of an operand that is not contiguous
    if source.op == "call_function" and source.target == aten.expand.default:
        if not _sizes(shape(source), (*batch, rows, cols)):
            return None
        source = source.args[0]
    own = shape(source)
    if len(own) < 3 or not _sizes(own[-2:], (rows, cols)) or len(own) - 2 > len(batch):
        return None
    # each batch dim of the operand is the result's or 1 (broadcast)
    aligned = batch[len(batch) - (len(own) - 2) :]
    if not all(_same(o, b) or _same(o, 1) for o, b in zip(own[:-2], aligned, strict=True)):
        return None
    return source


def _match(node: Node):
    bmm = node.args[0]
    if not (isinstance(bmm, Node) and bmm.target == aten.bmm.default and len(bmm.users) == 1):
        return Reject("the view does not read a bmm used only there")
    out = shape(node)
    if len(out) < 3:
        return Reject("the result has no batch dims")
    batch, (m, n) = out[:-2], out[-2:]
    k = shape(bmm.args[0])[-1]
    a, b = _operand(bmm.args[0], batch, m, k), _operand(bmm.args[1], batch, k, n)
    if a is None or b is None:
        return Reject("the bmm's operands are not expanded and flattened batched operands")
    if len(shape(a)) != len(out) and len(shape(b)) != len(out):
        return Reject("neither operand has the result's batch dims")
    return a, b


def _is_folded_matmul(node: Node):
    found = _match(node)
    return found if isinstance(found, Reject) else True


def _fold(node: Node) -> None:
    a, b = _match(node)
    with node.graph.inserting_before(node):
        matmul = node.graph.call_function(aten.matmul.default, (a, b))
    matmul.meta = dict(node.meta)
    node.replace_all_uses_with(matmul)


RULE = NodeRule(
    "batched_matmul", (aten._unsafe_view.default, aten.view.default), _is_folded_matmul, _fold
)


def fold_batched_matmuls(graph_module: GraphModule, ctx: PassContext) -> Counter:
    """The rule on the graph, in place, the bypassed chains removed: hits by rule (a graph
    rewrite, ``pass_base``)."""
    hits, _ = apply_rules(graph_module.graph, (RULE,))
    if hits:
        graph_module.graph.eliminate_dead_code()
    return Counter(hits)
