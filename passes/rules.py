"""Rewrite rules as small data, and the engine that applies them node by node.

A ``NodeRule`` has a name, the op targets it looks at, a ``check`` that either accepts the node or
says why not (``Reject("...")``), and a ``rewrite`` that edits the graph around the node. The engine
visits nodes in order, applies the first rule whose check accepts, counts hits by rule name, and
keeps the rejection reasons so a caller can say which rule came closest and why it did not fire.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable

import torch
from torch.fx import Graph, Node

from ssmcc.ops.contracts import bind_arguments


@dataclasses.dataclass(frozen=True)
class Reject:
    """A check's negative answer, with the reason in words."""

    reason: str

    def __bool__(self) -> bool:
        return False


# Patterns: a rule's structure as data. ``Op`` matches a call (its targets, its operands by
# position or by schema name), ``Var`` binds any value (a name used twice must be the same value),
# a plain constant must be equal, ``Either`` takes the first alternative that matches, and
# ``Through`` looks through a chain of one-operand calls (casts). A miss says where and why.


@dataclasses.dataclass(frozen=True)
class Var:
    """Any operand, bound to ``name`` (``"_"``: not bound). A name met twice must be one value."""

    name: str = "_"


@dataclasses.dataclass(frozen=True)
class Op:
    """A call of one of ``targets``; ``operands`` match its arguments by position, ``named`` by
    schema name (defaults filled in). ``commutative``: the first two may come in either order;
    ``one_user``: nothing but the node above reads it; ``why``: the miss, said for users."""

    targets: frozenset
    operands: tuple = ()
    named: tuple = ()  # ((schema name, pattern), ...)
    bind: str | None = None
    commutative: bool = False
    one_user: bool = False
    why: str | None = None


@dataclasses.dataclass(frozen=True)
class Either:
    """The first of ``alternatives`` that matches."""

    alternatives: tuple


@dataclasses.dataclass(frozen=True)
class Through:
    """``pattern`` under zero or more calls of ``targets`` on their first operand (bound to
    ``bind`` as a tuple, outermost first); ``one_user``: each read only by the node above it."""

    targets: frozenset
    pattern: object
    bind: str | None = None
    one_user: bool = False


def op(targets, *operands, bind=None, commutative=False, one_user=False, why=None, **named):
    """``Op`` spelled as a call: ``op(aten.rsqrt.default, op(aten.add.Tensor, Var("m"), 1e-5))``;
    ``targets`` one target or several."""
    several = isinstance(targets, (tuple, list, set, frozenset))
    targets = frozenset(targets) if several else frozenset({targets})
    return Op(targets, operands, tuple(named.items()), bind, commutative, one_user, why)


class Match(dict):
    """What a pattern bound, by name; ``root`` is the node the rule looked at."""

    def __init__(self, root: Node, bound: dict):
        super().__init__(bound)
        self.root = root


@dataclasses.dataclass
class _Miss:
    reason: str
    depth: int  # operands matched before the miss: the near-miss that got furthest is reported
    bound: frozenset  # names bound when it missed


def _name(target) -> str:
    return str(getattr(target, "__name__", target)) if not isinstance(target, str) else target


def _describe(value) -> str:
    if isinstance(value, Node):
        return f"%{value.name} ({_name(value.target) if value.op == 'call_function' else value.op})"
    return f"constant {value!r}"


def _arguments(node: Node) -> dict:
    """The call's arguments by schema name, defaults filled in (by keyword where no schema)."""
    if getattr(node.target, "_schema", None) is None:
        return dict(node.kwargs)
    return bind_arguments(node.target, node.args, node.kwargs)


class _Matcher:
    def __init__(self) -> None:
        self.bound: dict = {}
        self.depth = 0

    def miss(self, where: str, reason: str) -> _Miss:
        return _Miss(f"{where}: {reason}" if where else reason, self.depth, frozenset(self.bound))

    def match(self, pattern, value, where: str, reader: Node | None) -> _Miss | None:
        if isinstance(pattern, Var):
            return self.bind(pattern.name, value, where)
        if isinstance(pattern, Either):
            return self.either(pattern.alternatives, value, where, reader)
        if isinstance(pattern, Through):
            chain = []
            while (
                isinstance(value, Node)
                and value.op == "call_function"
                and value.target in pattern.targets
            ):
                if pattern.one_user and set(value.users) != {reader}:
                    return self.miss(where, f"%{value.name} is also read elsewhere")
                chain.append(value)
                reader, value = value, value.args[0]
            missed = self.match(pattern.pattern, value, where, reader)
            return missed or self.bind(pattern.bind, tuple(chain), where)
        if isinstance(pattern, Op):
            return self.call(pattern, value, where, reader)
        if isinstance(value, Node) or value != pattern:
            return self.miss(where, f"expected {pattern!r}, found {_describe(value)}")
        return None

    def bind(self, name, value, where: str) -> _Miss | None:
        if name in (None, "_"):
            return None
        if name in self.bound:
            known = self.bound[name]
            same = (
                known is value
                if isinstance(value, Node) or isinstance(known, Node)
                else (known == value)
            )
            if not same:
                return self.miss(where, f"{_describe(value)} is not {name} ({_describe(known)})")
            return None
        self.bound[name] = value
        return None

    def first_of(self, attempts) -> _Miss | None:
        """None at the first attempt (a no-argument matcher) that matches; else the miss that got
        furthest, with the bindings as they were before the attempts."""
        best, saved = None, (dict(self.bound), self.depth)
        for attempt in attempts:
            missed = attempt()
            if missed is None:
                return None
            if best is None or missed.depth > best.depth:
                best = missed
            self.bound, self.depth = dict(saved[0]), saved[1]
        return best

    def either(self, alternatives, value, where, reader) -> _Miss | None:
        return self.first_of(
            functools.partial(self.match, alternative, value, where, reader)
            for alternative in alternatives
        )

    def call(self, pattern: Op, value, where: str, reader) -> _Miss | None:
        if not (
            isinstance(value, Node)
            and value.op == "call_function"
            and value.target in pattern.targets
        ):
            wanted = " or ".join(sorted(_name(t) for t in pattern.targets))
            return self.miss(where, pattern.why or f"expected {wanted}, found {_describe(value)}")
        if pattern.one_user and reader is not None and set(value.users) != {reader}:
            return self.miss(where, pattern.why or f"%{value.name} is also read elsewhere")
        self.depth += 1
        here = f"%{value.name}"
        orders = [pattern.operands]
        if pattern.commutative and len(pattern.operands) >= 2:
            first, second, *rest = pattern.operands
            orders.append((second, first, *rest))

        def attempt(operands):  # bound first: a miss below it is a near miss of this node
            return self.bind(pattern.bind, value, where) or self.operands(
                value, operands, pattern.named, here
            )

        return self.first_of(functools.partial(attempt, operands) for operands in orders)

    def operands(self, node: Node, operands, named, here: str) -> _Miss | None:
        if len(node.args) < len(operands):
            return self.miss(here, f"{len(node.args)} operands, the pattern reads {len(operands)}")
        for i, (pattern, value) in enumerate(
            zip(operands, node.args[: len(operands)], strict=True)
        ):
            missed = self.match(pattern, value, f"{here} operand {i}", node)
            if missed is not None:
                return missed
        arguments = _arguments(node) if named else {}
        for name, pattern in named:
            missed = self.match(pattern, arguments.get(name), f"{here} {name}", node)
            if missed is not None:
                return missed
        return None


def match(pattern, node: Node) -> Match | Reject:
    """``pattern`` matched at ``node``: what it bound, or why not (where it missed)."""
    found = _match(pattern, node)
    return found if isinstance(found, Match) else Reject(found.reason)


def _match(pattern, node: Node) -> Match | _Miss:
    matcher = _Matcher()
    missed = matcher.match(pattern, node, "", None)
    return Match(node, matcher.bound) if missed is None else missed


def _root_targets(pattern) -> frozenset:
    if isinstance(pattern, Op):
        return pattern.targets
    if isinstance(pattern, Either):
        return frozenset().union(*(_root_targets(p) for p in pattern.alternatives))
    raise TypeError(f"a rule's pattern must start at a call (Op or Either of Ops), not {pattern!r}")


def accept(match: Match) -> bool:
    return True


@dataclasses.dataclass(frozen=True)
class NodeRule:
    """A rewrite: where it applies (``pattern``, rooted at the node it looks at), what else must
    hold (``check``: ``True`` or ``Reject(reason)``), and the edit (``rewrite``). A structural miss
    is a near miss worth reporting only once the pattern bound ``candidate`` (``None``: always)."""

    name: str
    pattern: Op | Either
    check: Callable[[Match], bool | Reject]
    rewrite: Callable[[Match], None]
    candidate: str | None = None

    @property
    def targets(self) -> frozenset:
        return _root_targets(self.pattern)


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
    """Apply ``rules`` once over ``graph``: at each node, the first rule whose pattern matches and
    whose check accepts rewrites it. Returns (hits by rule name, near misses by rule name).
    ``live_only``: look only at nodes an output still depends on."""
    targeted = [(rule, rule.targets) for rule in rules]
    hits: Counter = Counter()
    rejections: dict[str, list[str]] = {}
    live = live_nodes(graph) if live_only else None
    for node in list(graph.nodes):
        if node.op != "call_function" or (live is not None and node not in live):
            continue
        for rule, targets in targeted:
            if node.target not in targets:
                continue
            found = _match(rule.pattern, node)
            if isinstance(found, _Miss):
                if rule.candidate is None or rule.candidate in found.bound:
                    rejections.setdefault(rule.name, []).append(f"{node.name}: {found.reason}")
                continue
            verdict = rule.check(found)
            if isinstance(verdict, Reject):
                rejections.setdefault(rule.name, []).append(f"{node.name}: {verdict.reason}")
                continue
            if verdict:
                rule.rewrite(found)
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


_aten = torch.ops.aten

# The denominator of an RMS normalisation: rsqrt(mean(x^2, dims, keepdim) + eps).
RMS_DENOMINATOR = op(
    _aten.rsqrt.default,
    op(
        _aten.add.Tensor,
        op(
            _aten.mean.dim,
            op(
                _aten.pow.Tensor_Scalar,
                Var("x"),
                Var("exponent"),
                why="the mean is not of a power",
            ),
            Var("dims"),
            keepdim=Var("keepdim"),
            why="rsqrt(a + eps) where a is not a mean",
        ),
        Var("eps"),
        alpha=1,
        why="rsqrt of something other than mean + eps",
    ),
    bind="rsqrt",
)


def rms_normalised(one_user: bool = False) -> Op:
    """``x * rsqrt(mean(x^2, -1, keepdim=True) + eps)`` (either order), bound ``normalised``;
    ``one_user``: the rsqrt is read only by that product, the product only by the node above."""
    denominator = dataclasses.replace(RMS_DENOMINATOR, one_user=one_user)
    return op(
        _aten.mul.Tensor,
        Var("x"),
        denominator,
        commutative=True,
        one_user=one_user,
        bind="normalised",
        why="not x * rsqrt(mean(x^2) + eps)",
    )


def rms_constraints(found: Match) -> bool | Reject:
    """What an RMS pattern's structure does not say: eps a constant, x a float tensor, the mean of
    x^2 over the last axis with keepdim."""
    x, exponent, dims, keepdim, eps = (
        found[k] for k in ("x", "exponent", "dims", "keepdim", "eps")
    )
    if not isinstance(eps, (int, float)) or isinstance(eps, bool):
        return Reject("rsqrt(a + b) where b is not a constant eps")
    val = x.meta.get("val") if isinstance(x, Node) else None
    if not (isinstance(val, torch.Tensor) and val.dtype.is_floating_point):
        return Reject("x^2 of a value that is not a float tensor")
    rank = val.dim()
    if exponent != 2 or not keepdim or [d % rank for d in dims] != [rank - 1]:
        return Reject(f"mean of x^{exponent} over dims {dims} (keepdim={keepdim}), not x^2 over -1")
    return True


def fake_mode_of(graph: Graph):
    """The fake mode of a graph's recorded values (its placeholders', else any node's)."""
    from torch._guards import detect_fake_mode

    found = detect_fake_mode([n.meta.get("val") for n in graph.nodes if n.op == "placeholder"])
    if found is None:
        found = detect_fake_mode([n.meta.get("val") for n in graph.nodes])
    return found
