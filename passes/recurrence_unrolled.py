"""Rule ``unrolled_loop``: a Python loop over time, unrolled by a static-length export.

Per-step outputs are gathered by one ``stack``; each node belongs to the latest time step it
depends on (``select``/``slice`` of one index of a time axis). The state is the one value step t
reads from step t-1; all steps compute one expression (same ops, same invariant inputs, slices at
their own index); the update is ``add(mul(a, h), b)``, a and b free of h (or ``h_0 = b_0``)."""

from __future__ import annotations

import torch
from torch.fx import Node

from ssmcc.passes.call_args import int_arg, nodes_arg
from ssmcc.passes.dim_labels import Labelled, broadcast_labels, shape, tensor, value
from ssmcc.passes.recurrence import (
    NotACandidate,
    Recurrence,
    ScanLayout,
    is_zero_fill,
    split_affine,
    with_outputs,
)
from ssmcc.passes.scan_factoring import Mismatch, StepContext, require
from ssmcc.passes.step_forms import StepForms, describe, first_difference

aten = torch.ops.aten
COLLECTORS = {aten.stack.default, aten.cat.default}


def _time_slice(node: Node, steps: dict, T: int) -> tuple[Node, int, bool, int] | None:
    """``select(X, axis, i)`` / ``slice(X, axis, i, i+1)`` of a step-free X along a dim of size T:
    (X, axis, keepdim, i)."""
    if node.op != "call_function" or not node.args:
        return None
    source, source_value = node.args[0], value(node.args[0])
    if not isinstance(source, Node) or steps.get(source) or source_value is None:
        return None
    rank = source_value.dim()
    if node.target == aten.select.int:
        axis, index = int_arg(node, 1) % rank, node.args[2]
        keep = False
    elif node.target == aten.slice.Tensor and len(node.args) >= 4:
        axis, index = int_arg(node, 1) % rank, node.args[2]
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
        deps: frozenset = frozenset()
        for arg in node.all_input_nodes:
            deps |= steps.get(arg, frozenset())
        steps[node] = deps
    return steps, slices


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


def find_unrolled(stack: Node, layout: ScanLayout) -> Recurrence:
    """A recurrence whose per-step outputs ``stack`` gathers (see the module docstring)."""
    outputs = nodes_arg(stack, 0)
    axis = int_arg(stack, 1) if len(stack.args) > 1 else 0
    T = len(outputs)
    if T < 2:
        raise NotACandidate
    axis %= tensor(stack).dim()
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
    forms = StepForms(owner, slices)
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
            here, there = first_difference(update_forms[t], update_forms[first])
            raise Mismatch(
                f"{where}: the steps do not share one update: step {t} computes "
                f"{describe(here, 2)} where step {first} computes {describe(there, 2)}"
            )
    out_forms = [forms.of(outputs[t], t, {states[t]: "S"}) for t in range(T)]
    for t in range(1, T):
        require(
            out_forms[t] == out_forms[0],
            f"{where}: step {t} outputs {describe(out_forms[t])}, step 0 {describe(out_forms[0])}",
        )
    h = states[1]
    for t, state in enumerate(states[:-1]):
        outside = [u for u in state.users if owner.get(u) not in (t, t + 1) and u is not stack]
        require(
            not outside,
            f"{where}: the state of step {t} is also used after the loop by "
            f"{[u.name for u in outside]}",
        )
    rank = tensor(h).dim()
    layout.check_state(rank, where, f"the state {h.name}")
    root = tuple(f"r{i}" for i in range(rank))

    ctx = StepContext(
        resolve=lambda n: slices[n][:3] if n in slices and slices[n][3] == step else None,
        is_local=lambda n: owner.get(n) == step,
    )
    init_value = None if init is None or is_zero_fill(init) else Labelled(init, root)
    if init_value is not None and shape(init_value.node) != shape(h):
        raise Mismatch(
            f"{where}: the initial state {init_value.node.name} has shape "
            f"{shape(init_value.node)}, the state {shape(h)}"
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
    return with_outputs(rec, outputs[step], states[step], stack, axis)


def _depends_on(node, H, owner, step, memo) -> bool:
    if node is H:
        return True
    if not isinstance(node, Node) or owner.get(node) != step:
        return False
    if node not in memo:
        memo[node] = any(_depends_on(a, H, owner, step, memo) for a in node.all_input_nodes)
    return memo[node]
