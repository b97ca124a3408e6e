"""Rewrite rules as small data, and the engine that applies them node by node.

A ``NodeRule`` has a name, the op targets it looks at, a ``check`` that either accepts the node or
says why not (``Reject("...")``), and a ``rewrite`` that edits the graph around the node. The engine
visits nodes in order, applies the first rule whose check accepts, counts hits by rule name, and
keeps the rejection reasons so a caller can say which rule came closest and why it did not fire.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterable

import torch
from torch.fx import Graph, Node


@dataclasses.dataclass(frozen=True)
class Reject:
    """A check's negative answer, with the reason in words."""

    reason: str

    def __bool__(self) -> bool:
        return False


Check = Callable[[Node], "bool | Reject"]
Rewrite = Callable[[Node], None]


@dataclasses.dataclass(frozen=True)
class NodeRule:
    name: str
    targets: tuple
    check: Check
    rewrite: Rewrite


def live_nodes(graph: Graph) -> set[Node]:
    """The nodes the graph's outputs depend on (what a rewrite left unused is not among them)."""
    live: set[Node] = set()
    stack = [n for n in graph.nodes if n.op == "output"]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


def apply_rules(
    graph: Graph, rules: Iterable[NodeRule], live_only: bool = False
) -> tuple[Counter, dict[str, list[str]]]:
    """Apply ``rules`` once over ``graph``. Returns (hits by rule name, rejections by rule name).
    ``live_only``: look only at nodes an output still depends on."""
    rules = list(rules)
    hits: Counter = Counter()
    rejections: dict[str, list[str]] = {}
    live = live_nodes(graph) if live_only else None
    for node in list(graph.nodes):
        if node.op != "call_function" or (live is not None and node not in live):
            continue
        for rule in rules:
            if node.target not in rule.targets:
                continue
            verdict = rule.check(node)
            if isinstance(verdict, Reject):
                rejections.setdefault(rule.name, []).append(f"{node.name}: {verdict.reason}")
                continue
            if verdict:
                rule.rewrite(node)
                hits[rule.name] += 1
                break
    return hits, rejections


def replace_with(node: Node, replacement: Node) -> None:
    """Point every user of ``node`` at ``replacement`` and erase ``node``."""
    node.replace_all_uses_with(replacement)
    node.graph.erase_node(node)


# Shared pieces of the pattern passes' checks: one set of casts, one RMS normalisation, one way to
# find a graph's fake mode (each pass used to carry its own copy).

# A cast of its one tensor input that changes only the dtype. (``type_as`` casts too, to another
# tensor's dtype, but reads that tensor: ``through_casts`` looks through it, the dim labels do not.)
CASTS = frozenset(
    {torch.ops.aten._to_copy.default, torch.ops.aten.to.dtype, torch.ops.aten.to.dtype_layout}
)


def through_casts(node):
    """The value under a chain of casts (``CASTS`` and ``type_as``; ``node`` when it is none)."""
    while isinstance(node, Node) and (
        node.target in CASTS or node.target == torch.ops.aten.type_as.default
    ):
        node = node.args[0]
    return node


def rms_denominator(rsqrt: Node) -> tuple[Node, float] | Reject:
    """``(x, eps)`` when ``rsqrt`` is ``rsqrt(mean(x^2, -1, keepdim=True) + eps)`` with eps a
    constant: the denominator of an RMS normalisation over the last axis (x a float tensor)."""
    aten = torch.ops.aten
    if not (isinstance(rsqrt, Node) and rsqrt.target == aten.rsqrt.default):
        return Reject("not an rsqrt")
    add = rsqrt.args[0]
    if not (isinstance(add, Node) and add.target == aten.add.Tensor and "alpha" not in add.kwargs):
        return Reject("rsqrt of something other than mean + eps")
    mean, eps = add.args[:2]
    if not isinstance(eps, (int, float)) or not isinstance(mean, Node):
        return Reject("rsqrt(a + b) where b is not a constant eps")
    if mean.target != aten.mean.dim:
        return Reject(f"rsqrt(mean + eps) reads {mean.target}, not a mean")
    power, dims = mean.args[:2]
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if not (isinstance(power, Node) and power.target == aten.pow.Tensor_Scalar):
        return Reject("the mean is not of a power")
    x, exponent = power.args[:2]
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not (isinstance(val, torch.Tensor) and val.dtype.is_floating_point):
        return Reject("x^2 of a value that is not a float tensor")
    rank = val.dim()
    if exponent != 2 or not keepdim or [d % rank for d in dims] != [rank - 1]:
        return Reject(f"mean of x^{exponent} over dims {dims} (keepdim={keepdim}), not x^2 over -1")
    return x, float(eps)


def fake_mode_of(graph: Graph):
    """The fake mode of a graph's recorded values (its placeholders', else any node's)."""
    from torch._guards import detect_fake_mode

    found = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    if found is None:
        found = detect_fake_mode([n.meta.get("val") for n in graph.nodes])
    return found
