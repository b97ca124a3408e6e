"""Rule ``scan_op``: torch's ``scan`` higher-order op. Its body is one step (carry in, slices of
the scanned inputs along dim 0, invariant extra inputs), read like one step of a loop."""

from __future__ import annotations

import operator

from torch.fx import GraphModule, Node

from ssmcc.passes.call_args import int_arg, list_arg, node_arg, nodes_arg
from ssmcc.passes.dim_labels import Labelled, broadcast_labels, shape, tensor
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
        int_arg(u, 1): u
        for u in node.users
        if u.op == "call_function" and u.target is operator.getitem
    }


def find_scan_op(node: Node, module: GraphModule, layout: ScanLayout) -> Recurrence:
    """A recurrence computed by ``torch.ops.higher_order.scan`` (its body is one step)."""
    body_ref, inits, xs = node_arg(node, 0), nodes_arg(node, 1), nodes_arg(node, 2)
    extra = list_arg(node, 3) if len(node.args) > 3 else []
    where = f"scan {node.name}"
    require(len(inits) == 1, f"{where} carries {len(inits)} values; a selective scan carries one")
    body: GraphModule = getattr(module, str(body_ref.target))  # a get_attr: the body's name
    placeholders = [n for n in body.graph.nodes if n.op == "placeholder"]
    H = placeholders[0]
    outer = dict(
        zip(placeholders[1:], [(x, 0) for x in xs] + [(e, None) for e in extra], strict=True)
    )
    body_out = nodes_arg(body.graph.output_node(), 0)
    h, ys = body_out[0], body_out[1:]
    require(len(ys) == 1, f"{where} stacks {len(ys)} outputs per step; expected one")
    layout.check_state(tensor(H).dim(), where, "the carried state")
    rank = tensor(H).dim()
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
