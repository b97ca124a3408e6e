"""Rule ``parallel_scan``: a data-movement + ``add``/``mul`` region (e.g. mamba.py's Blelloch
``pscan``) from a decay tensor P (an ``exp``) and an input tensor Q to a result H of the same shape.

Such a region computes a polynomial in P and Q; it is accepted when, at two random float64 points,
it equals ``H_t = P_t * H_{t-1} + Q_t`` along exactly one axis (Schwartz-Zippel: two different
polynomials of degree <= T agree at a random point with probability <= T/|S|), so any
parallel-scan algorithm qualifies.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx import Graph, GraphModule, Node

from ssmcc.passes.call_args import node_arg
from ssmcc.passes.dim_labels import Labelled, dim_sources, shape, value
from ssmcc.passes.recurrence import NotACandidate, Recurrence, ScanLayout
from ssmcc.passes.scan_factoring import TIME, StepContext, require

if TYPE_CHECKING:
    import networkx as nx

aten = torch.ops.aten

# Ops that only move or pick data of one tensor (a constant pad fills zeros).
MOVEMENT = {
    aten.clone.default,
    aten.alias.default,
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.transpose.int,
    aten.permute.default,
    aten.select.int,
    aten.slice.Tensor,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.dims,
    aten.expand.default,
    aten.pad.default,
    aten.constant_pad_nd.default,
}

# What a parallel scan is built from: data movement, scatters back into a buffer, + and x.
REGION_OPS = MOVEMENT | {
    aten.select_scatter.default,
    aten.slice_scatter.default,
    aten.mul.Tensor,
    aten.add.Tensor,
    aten.cat.default,
    aten.stack.default,
    aten.copy.default,
}


def _layout_chain_down(node: Node) -> list[Node]:
    """``node`` and the single-user data-movement ops that follow it."""
    chain = [node]
    while len(chain[-1].users) == 1:
        user = next(iter(chain[-1].users))
        if dim_sources(user) is None or user.args[0] is not chain[-1]:
            break
        chain.append(user)
    return chain


def _movement_chain_up(node: Node) -> list[Node]:
    """``node`` and what it reads through ops that only move or pick data of one tensor."""
    chain = [node]
    while chain[-1].op == "call_function" and chain[-1].target in MOVEMENT:
        chain.append(node_arg(chain[-1]))
    return chain


def parallel_scan_candidates(graph: Graph, layout: ScanLayout) -> Iterator[Node]:
    """``exp`` nodes with at least the state's rank whose values may feed a scan region."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target == aten.exp.default:
            val = value(node)
            if val is not None and val.dim() >= layout.state_rank:
                yield node


def find_parallel_scan(exp: Node, dag: nx.DiGraph, layout: ScanLayout) -> Recurrence:
    import networkx as nx  # imported when a pattern search runs, not when a program is loaded

    where = f"decay {exp.name}"
    region_nodes = {
        n for n in nx.descendants(dag, exp) if n.op == "call_function" and n.target in REGION_OPS
    }
    reach = _forward_region(exp, region_nodes)
    if not any(
        n.target in (aten.select_scatter.default, aten.slice_scatter.default, aten.cat.default)
        for n in reach
    ):
        raise NotACandidate
    chain_p = _layout_chain_down(exp)
    shapes = {_key(n) for n in chain_p}
    outputs = [
        n
        for n in reach
        if _key(n) in shapes and any(u not in reach for u in n.users) and n not in chain_p
    ]
    if not outputs:
        raise NotACandidate
    result = max(outputs, key=_order(exp.graph))
    P = [n for n in chain_p if _key(n) == _key(result)][-1]
    inside = nx.ancestors(dag, result) & (nx.descendants(dag, P))
    entries = {
        a
        for n in inside | {result}
        for a in n.all_input_nodes
        if a not in inside and a is not P and not _is_symbolic_size(a)
    }
    require(entries, f"{where}: the region below it has only one input")
    chains = [set(_movement_chain_up(e)) for e in entries]
    common = set.intersection(*chains)
    candidates = [n for n in common if _key(n) == _key(result) and n not in inside]
    require(
        candidates,
        f"{where}: the region from the decay to {result.name} reads "
        f"{sorted(e.name for e in entries)}, not one input tensor of the decay's shape",
    )
    Q = max(candidates, key=_order(exp.graph))
    region = (nx.ancestors(dag, result) | {result}) & (
        nx.descendants(dag, P) | nx.descendants(dag, Q)
    )
    region = {n for n in region if not _is_symbolic_size(n)}  # sizes read off a tensor
    for n in region:
        require(
            n.target in REGION_OPS,
            f"{where}: {n.name} ({n.target}) inside the scan region is not data movement or +/x",
        )
        for a in n.all_input_nodes:
            require(
                a in region or a is P or a is Q or _is_symbolic_size(a),
                f"{where}: {n.name} inside the region also reads {a.name}",
            )
    for n in region - {result}:
        outside = [u.name for u in n.users if u not in region and not _is_symbolic_size(u)]
        require(not outside, f"{where}: {n.name} inside the region is also used by {outside}")
    axis = _verify_linear_scan(P, Q, result, region, where)
    rank = len(shape(result))
    layout.check_state(rank - 1, where, "the state (its time axis aside)")
    root = tuple(TIME if i == axis else f"r{i}" for i in range(rank))
    return Recurrence(
        rule="parallel_scan",
        anchor=result,
        state_labels=root,
        decay=(P, root),
        drive=(Q, root),
        ctx=StepContext(),
        init=None,
        last_state=[],
        states=Labelled(result, root),
    )


def _key(node: Node) -> tuple:
    """A node's shape as a hashable key. A symbolic size is keyed by its symbols and its value at
    the example sizes: a Blelloch scan's halving and doubling writes the length L back as
    ``(L//2)*(L//(L//2))``, which Dynamo's guards on the scan's branches keep equal to L."""
    return tuple(
        size
        if isinstance(size, int)
        else (frozenset(map(str, size.node.expr.free_symbols)), _hint(size))
        for size in shape(node)
    )


def _is_symbolic_size(node: Node) -> bool:
    return isinstance(node.meta.get("val"), torch.SymInt)


def _hint(size) -> int:
    return size if isinstance(size, int) else int(size.node.hint)


def _order(graph: Graph):
    index = {n: i for i, n in enumerate(graph.nodes)}
    return lambda n: index[n]


def _forward_region(start: Node, allowed: set) -> set:
    seen, frontier = set(), [start]
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in allowed and user not in seen:
                seen.add(user)
                frontier.append(user)
    return seen


def _verify_linear_scan(P: Node, Q: Node, result: Node, region: set, where: str) -> int:
    """The axis along which the region computes ``H_t = P_t H_{t-1} + Q_t``, checked at two
    random float64 points; ``Mismatch`` when no axis fits."""
    dims = tuple(_hint(size) for size in shape(result))  # symbolic sizes at their example values
    graph = Graph()
    env = {P: graph.placeholder("P"), Q: graph.placeholder("Q")}
    sizes: dict[Node, int] = {}
    for node in result.graph.nodes:
        if node in region:
            for arg in node.all_input_nodes:
                if _is_symbolic_size(arg) and arg not in env:
                    env[arg] = graph.placeholder(f"size_{len(sizes)}")
                    sizes[arg] = _hint(arg.meta["val"])
            env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(env[result])
    fn = GraphModule(torch.nn.Module(), graph)
    generator = torch.Generator().manual_seed(0)
    fits = set(range(len(dims)))
    # real numbers also where the graph comes from a fake-tensor trace (torch.compile's backend)
    with unset_fake_temporarily():
        for _ in range(2):
            p = torch.rand(dims, generator=generator, dtype=torch.float64) * 0.5 + 0.5
            q = torch.rand(dims, generator=generator, dtype=torch.float64) * 2 - 1
            got = fn(p, q, *sizes.values())
            # H_0 = Q_0 along the time axis (zero start): a cheap filter before the full check
            starts = [a for a in range(len(dims)) if _close(got.select(a, 0), q.select(a, 0))]
            here = {axis for axis in starts if _close(got, _linear_scan(p, q, axis))}
            fits &= here
    require(
        len(fits) == 1,
        f"{where}: the region from {P.name}, {Q.name} to {result.name} is not "
        "H_t = P_t H_t-1 + Q_t along one axis (checked at random points)",
    )
    return fits.pop()


def _linear_scan(p: torch.Tensor, q: torch.Tensor, axis: int) -> torch.Tensor:
    p, q = p.movedim(axis, 0), q.movedim(axis, 0)
    h = torch.zeros_like(q[0])
    out = []
    for t in range(p.shape[0]):
        h = p[t] * h + q[t]
        out.append(h)
    return torch.stack(out).movedim(0, axis)


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-9, atol=1e-9)
