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
from torch.fx import GraphModule
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ssmcc.passes.dim_labels import shape
from ssmcc.passes.pass_base import PassContext
from ssmcc.passes.rules import Either, Match, NodeRule, Reject, Var, apply_rules, op

aten = torch.ops.aten
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _same(a, b) -> bool:
    """Sizes known equal, symbolic ones included, without adding a shape guard."""
    return statically_known_true(a == b)


def _sizes(got, want) -> bool:
    return len(got) == len(want) and all(_same(g, w) for g, w in zip(got, want, strict=True))


def _flattened(name: str):
    """``view(expand(x, batch + (rows, cols)), (prod(batch), rows, cols))``: the expand may be
    absent (x already has that shape), a clone may copy an operand that is not contiguous."""
    broadcast = Either((op(aten.expand.default, Var(name), bind=f"{name}_expand"), Var(name)))
    return op(
        _VIEWS,
        Either((op(aten.clone.default, broadcast), broadcast)),
        bind=f"{name}_flat",
        why="the bmm's operand is not a flattened batched operand",
    )


BATCHED_MATMUL = op(
    (aten._unsafe_view.default, aten.view.default),
    op(
        aten.bmm.default,
        _flattened("a"),
        _flattened("b"),
        bind="bmm",
        one_user=True,
        why="the view does not read a bmm used only there",
    ),
)


def _operand_fits(found: Match, name: str, batch, rows, cols) -> bool:
    """The flattened operand ``name`` is ``batch`` x (rows, cols) read back from its own shape."""
    if not _sizes(shape(found[f"{name}_flat"]), (math.prod(batch), rows, cols)):
        return False
    expand = found.get(f"{name}_expand")
    if expand is not None and not _sizes(shape(expand), (*batch, rows, cols)):
        return False
    own = shape(found[name])
    if len(own) < 3 or not _sizes(own[-2:], (rows, cols)) or len(own) - 2 > len(batch):
        return False
    # each batch dim of the operand is the result's or 1 (broadcast)
    aligned = batch[len(batch) - (len(own) - 2) :]
    return all(_same(o, b) or _same(o, 1) for o, b in zip(own[:-2], aligned, strict=True))


def _is_folded_matmul(found: Match) -> bool | Reject:
    out = shape(found.root)
    if len(out) < 3:
        return Reject("the result has no batch dims")
    batch, (m, n) = out[:-2], out[-2:]
    k = shape(found["a_flat"])[-1]
    if not (_operand_fits(found, "a", batch, m, k) and _operand_fits(found, "b", batch, k, n)):
        return Reject("the bmm's operands are not expanded and flattened batched operands")
    if len(shape(found["a"])) != len(out) and len(shape(found["b"])) != len(out):
        return Reject("neither operand has the result's batch dims")
    return True


def _fold(found: Match) -> None:
    node = found.root
    with node.graph.inserting_before(node):
        matmul = node.graph.call_function(aten.matmul.default, (found["a"], found["b"]))
    matmul.meta = dict(node.meta)
    node.replace_all_uses_with(matmul)


RULE = NodeRule("batched_matmul", BATCHED_MATMUL, _is_folded_matmul, _fold)


def fold_batched_matmuls(graph_module: GraphModule, ctx: PassContext) -> Counter:
    """The rule on the graph, in place, the bypassed chains removed: hits by rule (a graph
    rewrite, ``pass_base``)."""
    hits, _ = apply_rules(graph_module.graph, (RULE,))
    if hits:
        graph_module.graph.eliminate_dead_code()
    return Counter(hits)
