"""Rule ``scan_op``: torch's ``scan`` higher-order op. Its body is one step (carry in, slices of
the scanned inputs along dim 0, invariant extra inputs), read like one step of a loop."""

from __future__ import annotations

import operator

from torch.fx import GraphModule, Node

from ssmcc.passes.dim_labels import Labelled, broadcast_labels, shape, value
from ssmcc.passes.recurrence import (
    Recurrence,
    ScanLayout,
    is_zero_fill,
    split_affine,
    with_outputs,
)
from ssmcc.passes.scan_factoring import StepContext, require


def _getitems(node: Node) -> dict[int, Node]:
    return {
        u.args[1]: u for u in node.users if u.op == "call_function" and u.target is operator.getitem
    }


def find_scan_op(node: Node, module: GraphModule, layout: ScanLayout) -> Recurrence:
    """A recurrence computed by ``torch.ops.higher_order.scan`` (its body is one step)."""
    body_ref, inits, xs = node.args[0], list(node.args[1]), list(node.args[2])
    extra = list(node.args[3]) if len(node.args) > 3 else []
    where = f"scan {node.name}"
    require(len(inits) == 1, f"{where} carries {len(inits)} values; a selective scan carries one")
    body: GraphModule = getattr(module, body_ref.target)
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    H = placeholders[0]
    outer = dict(
        zip(placeholders[1:], [(x, 0) for x in xs] + [(e, None) for e in extra], strict=True)
    )
    body_out = body.graph.output_node().args[0]
    h, ys = body_out[0], list(body_out[1:])
    require(len(ys) == 1, f"{where} stacks {len(ys)} outputs per step; expected one")
    layout.check_state(value(H).dim(), where, "the carried state")
    rank = value(H).dim()
    root = tuple(f"r{i}" for i in range(rank))
    memo: dict = {}

    def depends(n) -> bool:
        if n is H:
            return True
        if not isinstance(n, Node) or n.op == "placeholder":
            return False
        if n not in memo:
            memo[n] = any(depends(a) for a in n.all_input_nodes)
        return memo[n]

    decay, drive = split_affine(h, H, depends)
    ctx = StepContext(
        resolve=lambda n: (outer[n][0], outer[n][1], False) if n in outer else None,
        is_local=lambda n: n.graph is body.graph and n.op != "placeholder",
    )
    results = _getitems(node)
    init = inits[0]
    rec = Recurrence(
        rule="scan_op",
        anchor=node,
        state_labels=root,
        decay=(decay, broadcast_labels(decay, root, shape(h))),
        drive=(drive, broadcast_labels(drive, root, shape(h))),
        ctx=ctx,
        init=None if is_zero_fill(init) else Labelled(init, root),
        last_state=[Labelled(results[0], root)] if 0 in results else [],
    )
    require(1 in results, f"{where}: the stacked outputs are not used")
    return with_outputs(rec, ys[0], h, results[1], 0)
