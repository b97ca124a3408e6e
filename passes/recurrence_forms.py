"""Find first-order linear recurrences ``h_t = a_t * h_{t-1} + b_t`` in the three forms they take
in an exported graph, and describe each one uniformly (``Recurrence``).

- ``unrolled_loop``: a Python loop over time, unrolled by a static-length export. Per-step outputs
  are gathered by one ``stack``; every node is assigned the latest time step it depends on (through
  ``select``/``slice`` of one index of a time axis), so step t's nodes are those owned by t. The
  state is the one value that step t reads from step t-1; the steps must compute the same
  expression (same ops, same invariant inputs, slices at their own index); the update must be
  ``add(mul(a, h), b)`` with neither a nor b depending on h.
- ``scan_op``: torch's ``scan`` higher-order op; its body is one step (carry in, slices of the
  scanned inputs along dim 0, invariant extra inputs) and is checked the same way.
- ``parallel_scan``: a data-movement + ``add``/``mul`` region (e.g. mamba.py's Blelloch
  ``pscan``) from a decay tensor P (an ``exp``) and an input tensor Q to a result H of the same
  shape. Such a region computes a polynomial in P and Q; it is accepted when, at two random
  float64 points, it equals ``H_t = P_t * H_{t-1} + Q_t`` along exactly one axis (Schwartz-Zippel:
  two different polynomials of degree <= T agree at a random point with probability <= T/|S|).

A candidate that is rejected raises ``Mismatch`` with the check that failed; ``NotACandidate``
means the structure is not recurrence-like at all (nothing to report).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Iterator

import networkx as nx
import torch
from torch.fx import Graph, GraphModule, Node

from ssmcc.passes.dim_labels import (
    Labelled,
    Labels,
    broadcast_labels,
    dim_sources,
    labels_along,
    shape,
    value,
)
from ssmcc.passes.scan_factoring import TIME, Mismatch, StepContext, require, with_time

aten = torch.ops.aten

NONLINEAR_HINT = "the state passes through {op} ({node}), so h_t is not linear in h_{{t-1}}"
MIXING_OPS = {
    aten.matmul.default,
    aten.mm.default,
    aten.bmm.default,
    aten.einsum.default,
    aten.linear.default,
    aten.addmm.default,
}
COLLECTORS = {aten.stack.default, aten.cat.default}
ZERO_FILLS = {aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default}


class NotACandidate(Exception):
    """The structure is not a recurrence over time (a plain map, unrelated stack, ...)."""


@dataclasses.dataclass
class Recurrence:
    """One found recurrence, in terms the factoring reads (see ``scan_factoring.py``)."""

    rule: str
    anchor: Node  # where it is reported, and what the rewritten value replaces
    state_labels: Labels  # labels of h: per step (3 dims), or the state sequence (with TIME)
    decay: tuple[Node, Labels]  # a_t
    drive: tuple[Node, Labels]  # b_t
    ctx: StepContext
    init: Labelled | None  # initial state; None = zeros
    last_state: list[Labelled]  # values equal to the final state
    step_output: tuple[Node, Node] | None = None  # (per-step output, h of that step)
    collected: tuple[Node, int] | None = None  # per-step outputs stacked: (node, time axis)
    states: Labelled | None = None  # the whole state sequence, when that is what is collected


def location(node: Node) -> str:
    """The module path that produced ``node`` (``layers.0.mixer``), else the node's name."""
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path = list(stack.values())[-1][0]
        path = path.replace("L['self'].", "").replace("L__self___", "")
        if path:
            return f"{path} (node {node.name})"
    return f"node {node.name}"


def _is_zero_fill(node) -> bool:
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    if node.target in ZERO_FILLS:
        return True
    if node.target in (aten.full.default, aten.new_full.default):
        return node.args[-1] == 0
    return False


def split_affine(h: Node, H: Node, depends) -> tuple[Node, Node]:
    """``h = add(mul(a, H), b)`` (either operand order) or ``addcmul(b, a, H)``: returns (a, b);
    else why not."""
    if (
        h.op == "call_function"
        and h.target == aten.addcmul.default
        and h.kwargs.get("value", 1) == 1
    ):
        drive, x, y = h.args[:3]
        if (x is H) != (y is H) and not depends(drive):
            decay = y if x is H else x
            require(
                isinstance(decay, Node) and not depends(decay),
                f"{h.name}: the decay depends on the state",
            )
            return decay, drive
    if h.op == "call_function" and h.target == aten.add.Tensor and "alpha" not in h.kwargs:
        operands = [arg for arg in h.args[:2]]
        on_state = [isinstance(x, Node) and depends(x) for x in operands]
        require(sum(on_state) == 1, f"{h.name}: both terms of the update depend on the state")
        product, drive = operands[on_state.index(True)], operands[on_state.index(False)]
        if product.op == "call_function" and product.target == aten.mul.Tensor:
            factors = list(product.args[:2])
            if H in factors:
                decay = factors[1 - factors.index(H)]
                require(
                    not (isinstance(decay, Node) and depends(decay)),
                    f"{product.name}: the decay depends on the state",
                )
                require(isinstance(drive, Node), f"{h.name}: the input term is a constant")
                require(
                    isinstance(decay, Node), f"{product.name}: the decay is the constant {decay}"
                )
                require(
                    shape(decay) == shape(H) or len(shape(decay)) <= len(shape(H)),
                    f"{product.name}: the decay has more dims than the state",
                )
                return decay, drive
    raise Mismatch(_why_not_affine(h, H, depends))


def _why_not_affine(h: Node, H: Node, depends) -> str:
    """Name the first op on the path from H to h that is not add/mul."""
    frontier = [h]
    seen = set()
    while frontier:
        node = frontier.pop()
        if node in seen or node is H:
            continue
        seen.add(node)
        if node.target in MIXING_OPS:
            return (
                f"the state enters {node.target} ({node.name}), which mixes state channels "
                "(h_t = W h_{t-1} + b); a selective scan's decay is elementwise"
            )
        linear = (aten.add.Tensor, aten.mul.Tensor, aten.addcmul.default)
        if node.target not in linear and dim_sources(node) is None:
            return NONLINEAR_HINT.format(op=node.target, node=node.name)
        frontier += [a for a in node.args if isinstance(a, Node) and depends(a)]
    return f"{h.name}: the update is not add(mul(a, h), b)"


# --- unrolled loops -------------------------------------------------------------------------


def _time_slice(node: Node, steps: dict, T: int) -> tuple[Node, int, bool, int] | None:
    """``select(X, axis, i)`` / ``slice(X, axis, i, i+1)`` of a step-free X along a dim of size T:
    (X, axis, keepdim, i)."""
    if node.op != "call_function" or not node.args or not isinstance(node.args[0], Node):
        return None
    source = node.args[0]
    if steps.get(source) or value(source) is None:
        return None
    rank = value(source).dim()
    if node.target == aten.select.int:
        axis, index = node.args[1] % rank, node.args[2]
        keep = False
    elif node.target == aten.slice.Tensor and len(node.args) >= 4:
        axis, index = node.args[1] % rank, node.args[2]
        end, step = node.args[3], node.args[4] if len(node.args) > 4 else 1
        if not (isinstance(index, int) and isinstance(end, int) and end == index + 1 and step == 1):
            return None
        keep = True
    else:
        return None
    if not isinstance(index, int) or shape(source)[axis] != T:
        return None
    return source, axis, keep, index % T


def _step_sets(stack: Node, T: int) -> tuple[dict, dict]:
    """For every node before ``stack``: the set of time steps it depends on; and time slices."""
    steps: dict[Node, frozenset] = {}
    slices: dict[Node, tuple] = {}
    ancestors, frontier = set(), [stack]
    while frontier:
        for arg in frontier.pop().all_input_nodes:
            if arg not in ancestors:
                ancestors.add(arg)
                if not (arg.op == "call_function" and arg.target in COLLECTORS):
                    frontier.append(arg)  # another loop's outputs end the search
    for node in stack.graph.nodes:
        if node is stack:
            break
        if node not in ancestors:
            continue
        if node.op == "call_function" and node.target in COLLECTORS:
            steps[node] = frozenset()  # another loop's gathered outputs: a whole sequence
            continue
        found = _time_slice(node, steps, T)
        if found is not None:
            slices[node] = found
            steps[node] = frozenset({found[3]})
            continue
        deps = frozenset()
        for arg in node.all_input_nodes:
            deps |= steps.get(arg, frozenset())
        steps[node] = deps
    return steps, slices


class _Forms:
    """Canonical form of a step's expression: ops and invariant inputs by name, slices of the
    step's own index as ``@``, the carried state as ``H`` — equal forms mean equal steps."""

    def __init__(self, owner: dict, slices: dict):
        self.owner, self.slices = owner, slices
        self.invariant_forms: dict = {}

    def invariant(self, node: Node) -> object:
        """Structural form of a step-free value (so per-step copies of ``B[:, None]`` agree)."""
        if node not in self.invariant_forms:
            if node.op in ("placeholder", "get_attr"):
                result = ("input", node.name)
            else:
                args = tuple(
                    self.invariant(a) if isinstance(a, Node) else repr(a) for a in node.args
                )
                kwargs = tuple(sorted((k, repr(v)) for k, v in node.kwargs.items()))
                result = (str(node.target), args, kwargs)
            self.invariant_forms[node] = result
        return self.invariant_forms[node]

    def of(self, node, t: int, tokens: dict) -> object:
        memo: dict = {}

        def form(n):
            if isinstance(n, (list, tuple)):
                return tuple(form(x) for x in n)
            if not isinstance(n, Node):
                return repr(n)
            if n in tokens:
                return tokens[n]
            if n in memo:
                return memo[n]
            if n in self.slices:
                source, axis, keep, index = self.slices[n]
                require(index == t, f"step {t} reads {n.name}, the slice at index {index}")
                result = ("slice", self.invariant(source), axis, keep)
            elif self.owner.get(n) is None:
                result = self.invariant(n)
            else:
                require(
                    self.owner[n] == t,
                    f"step {t} reads {n.name} of step {self.owner[n]} (a scan reads only the "
                    "state of the step before)",
                )
                kwargs = tuple(sorted((k, form(v)) for k, v in n.kwargs.items()))
                result = (str(n.target), form(n.args), kwargs)
            memo[n] = result
            return result

        return form(node)


def _first_difference(a, b):
    """The outermost sub-expressions at which two forms differ."""
    while (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b) == 3
        and isinstance(a[0], str)
        and a[0] == b[0]
        and len(a[1]) == len(b[1])
        and a[2] == b[2]
    ):
        differing = [(x, y) for x, y in zip(a[1], b[1], strict=True) if x != y]
        if len(differing) != 1:
            break
        a, b = differing[0]
    return a, b


def _describe(form, depth: int = 4) -> str:
    if isinstance(form, str):
        return form
    if isinstance(form, tuple) and form and form[0] in ("slice", "input"):
        return f"{_describe(form[1], 1)}[t]" if form[0] == "slice" else form[1]
    if isinstance(form, tuple) and len(form) == 3 and isinstance(form[0], str):
        name = form[0].replace("aten.", "").split(".")[0]
        if depth == 0:
            return f"{name}(...)"
        args = [_describe(a, depth - 1) for a in form[1] if a != "None"]
        return f"{name}({', '.join(args)})"
    if isinstance(form, tuple):
        return "[" + ", ".join(_describe(a, depth) for a in form) + "]"
    return str(form)


def _corresponding(a_root: Node, b_root: Node, target: Node, where: str, what: str) -> Node:
    """Walk two steps' expressions side by side; the node of ``b_root``'s expression that sits
    where ``a_root``'s has ``target`` (e.g. the initial state where step 1 reads h_0)."""
    found: set = set()
    pairs, seen = [(a_root, b_root)], set()
    while pairs:
        a, b = pairs.pop()
        if (a, b) in seen:
            continue
        seen.add((a, b))
        if a is target:
            found.add(b)
            continue
        if isinstance(a, Node) and isinstance(b, Node) and a.target == b.target:
            pairs += list(zip(a.all_input_nodes, b.all_input_nodes, strict=False))
    require(len(found) == 1, f"{where}: {len(found)} candidates for the {what}")
    return found.pop()


def find_unrolled(stack: Node) -> Recurrence:
    """A recurrence whose per-step outputs ``stack`` gathers (see the module docstring)."""
    outputs = stack.args[0]
    axis = stack.args[1] if len(stack.args) > 1 else 0
    T = len(outputs)
    if T < 2 or not all(isinstance(v, Node) for v in outputs):
        raise NotACandidate
    axis %= value(stack).dim()
    steps, slices = _step_sets(stack, T)
    owner = {n: max(s) for n, s in steps.items() if s}
    if [owner.get(v) for v in outputs] != list(range(T)):
        raise NotACandidate
    carried = []
    for t in range(1, T):
        sources = {
            arg
            for node, o in owner.items()
            if o == t
            for arg in node.all_input_nodes
            if owner.get(arg) is not None and owner[arg] < t
        }
        carried.append(sources)
    if not any(carried):
        raise NotACandidate  # independent steps: a map over time, not a recurrence
    where = f"loop of {T} steps"
    for t, sources in enumerate(carried, start=1):
        names = sorted(s.name for s in sources)
        require(
            len(sources) == 1 and owner[next(iter(sources))] == t - 1,
            f"{where}: step {t} reads {names} from earlier steps; a scan carries one state "
            "from the step before",
        )
    states = [next(iter(s)) for s in carried]  # h_0 .. h_{T-2}
    step = 1
    memo: dict = {}

    def depends(n) -> bool:
        return _depends_on(n, states[0], owner, step, memo)

    if T > 2:  # the update's shape first: it names the op that breaks linearity
        split_affine(states[1], states[0], depends)
    last = _corresponding(outputs[T - 2], outputs[T - 1], states[T - 2], where, "final state")
    states.append(last)
    forms = _Forms(owner, slices)
    decay, drive = split_affine(states[1], states[0], depends)
    # Step 0 either updates an initial state like every other step, or starts from zero and
    # keeps only its input term (h_0 = b_0, as a loop that begins at the second step writes it).
    starts_at_input = forms.of(states[0], 0, {}) == forms.of(drive, 1, {})
    init = None
    if not starts_at_input:
        init = _corresponding(states[1], states[0], states[0], where, "initial state")
    first = 1 if starts_at_input else 0
    update_forms = {
        t: forms.of(states[t], t, {(states[t - 1] if t else init): "H"}) for t in range(first, T)
    }
    for t in range(first + 1, T):
        if update_forms[t] != update_forms[first]:
            here, there = _first_difference(update_forms[t], update_forms[first])
            raise Mismatch(
                f"{where}: the steps do not share one update: step {t} computes "
                f"{_describe(here, 2)} where step {first} computes {_describe(there, 2)}"
            )
    out_forms = [forms.of(outputs[t], t, {states[t]: "S"}) for t in range(T)]
    for t in range(1, T):
        require(
            out_forms[t] == out_forms[0],
            f"{where}: step {t} outputs {_describe(out_forms[t])}, step 0 "
            f"{_describe(out_forms[0])}",
        )
    h = states[1]
    for t, state in enumerate(states[:-1]):
        outside = [u for u in state.users if owner.get(u) not in (t, t + 1) and u is not stack]
        require(
            not outside,
            f"{where}: the state of step {t} is also used after the loop by "
            f"{[u.name for u in outside]}",
        )
    rank = value(h).dim()
    require(rank == 3, f"{where}: the state {h.name} has {rank} dims; expected 3")
    root = tuple(f"r{i}" for i in range(rank))

    ctx = StepContext(
        resolve=lambda n: slices[n][:3] if n in slices and slices[n][3] == step else None,
        is_local=lambda n: owner.get(n) == step,
    )
    init_value = None if init is None or _is_zero_fill(init) else Labelled(init, root)
    if init_value is not None and shape(init) != shape(h):
        raise Mismatch(
            f"{where}: the initial state {init.name} has shape {shape(init)}, the state {shape(h)}"
        )
    rec = Recurrence(
        rule="unrolled_loop",
        anchor=stack,
        state_labels=root,
        decay=(decay, broadcast_labels(decay, root, shape(h))),
        drive=(drive, broadcast_labels(drive, root, shape(h))),
        ctx=ctx,
        init=init_value,
        last_state=[Labelled(last, root)],
    )
    return _with_outputs(rec, outputs[step], states[step], stack, axis)


def _with_outputs(rec: Recurrence, step_output: Node, h: Node, collected: Node, axis: int):
    """What a step outputs, gathered along ``axis`` of ``collected``: the state itself (moved
    only), so ``collected`` is the whole state sequence, or a value read out of the state."""
    labels = labels_along(h, step_output, rec.state_labels)
    if labels is not None:
        rec.states = Labelled(collected, with_time(labels, axis, False))
    else:
        rec.step_output = (step_output, h)
        rec.collected = (collected, axis)
    return rec


def _depends_on(node, H, owner, step, memo) -> bool:
    if node is H:
        return True
    if not isinstance(node, Node) or owner.get(node) != step:
        return False
    if node not in memo:
        memo[node] = any(_depends_on(a, H, owner, step, memo) for a in node.all_input_nodes)
    return memo[node]


# --- torch scan higher-order op -------------------------------------------------------------


def _getitems(node: Node) -> dict[int, Node]:
    return {
        u.args[1]: u for u in node.users if u.op == "call_function" and u.target is operator.getitem
    }


def find_scan_op(node: Node, module: GraphModule) -> Recurrence:
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
    rank = value(H).dim()
    require(rank == 3, f"{where}: the carried state has {rank} dims; expected 3")
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
        init=None if _is_zero_fill(init) else Labelled(init, root),
        last_state=[Labelled(results[0], root)] if 0 in results else [],
    )
    require(1 in results, f"{where}: the stacked outputs are not used")
    return _with_outputs(rec, ys[0], h, results[1], 0)


# --- parallel scans (data movement + add/mul regions) ---------------------------------------

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
        chain.append(chain[-1].args[0])
    return chain


def parallel_scan_candidates(graph: Graph) -> Iterator[Node]:
    """``exp`` nodes of rank >= 3 whose values feed an add/mul data-movement region."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target == aten.exp.default:
            val = value(node)
            if val is not None and val.dim() >= 3:
                yield node


def find_parallel_scan(exp: Node, dag: nx.DiGraph) -> Recurrence:
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
        outside = [u.name for u in n.users if u not in region]
        require(not outside, f"{where}: {n.name} inside the region is also used by {outside}")
    axis = _verify_linear_scan(P, Q, result, region, where)
    rank = len(shape(result))
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
    """A node's shape as a hashable key (symbolic sizes by name)."""
    return tuple(str(size) for size in shape(node))


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
    sizes = {}
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
    fits = None
    for _ in range(2):
        p = torch.rand(dims, generator=generator, dtype=torch.float64) * 0.5 + 0.5
        q = torch.rand(dims, generator=generator, dtype=torch.float64) * 2 - 1
        got = fn(p, q, *sizes.values())
        # H_0 = Q_0 along the time axis (zero start): a cheap filter before the full comparison
        starts = [a for a in range(len(dims)) if _close(got.select(a, 0), q.select(a, 0))]
        here = {axis for axis in starts if _close(got, _linear_scan(p, q, axis))}
        fits = here if fits is None else fits & here
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
