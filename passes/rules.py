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
