"""``detect_selective_scan`` — rewrite selective scans that capture did not route into ssmcc ops.

Before: a program whose Mamba-1 scans are written out in ATen — a Python loop unrolled by a
static-length export, torch's ``scan`` higher-order op, or a parallel scan such as mamba.py's
``pscan`` — around the discretisation ``exp(Δ ⊗ A)``, ``Δ ⊗ B ⊗ u`` and a readout ``C · h``;
or Mamba-2 (SSD) scans, as a per-step loop in head layout (state (b, h, p, n), one A per head)
or as the chunked block decomposition of Hugging Face's torch path at a static length.
After: one ``ssmcc::selective_scan`` (Mamba-1) or ``ssmcc::ssd_scan`` (SSD) per scan, whose
result replaces the scan's outputs (and the final state, where it is used); the loop becomes dead
code for ``eliminate_dead_code``.

Rules (hits counted by name; a candidate that is rejected is reported in ``ctx.diagnostics`` with
its location, the rule that came closest, and the check that failed):

- ``unrolled_loop``, ``scan_op``, ``parallel_scan``: the three forms (``recurrence*.py``); a
  loop whose state has four dims is read as SSD (``ssd_loop.py``).
- ``chunked_ssd``: SSD's chunked form, read by its boundary and accepted by a numerical identity
  check against the op's reference (``ssd_chunked.py``).
- ``fold_dt_limit``: (SSD) ``clamp(dt, lo, hi)`` after the softplus becomes ``dt_min``/``dt_max``.
- ``fold_softplus``, ``fold_delta_bias``: Δ = softplus(δ + bias) becomes the op's
  ``delta_softplus`` and ``delta_bias``, where the graph computes it so.
- ``fold_skip``: ``y + D ⊙ u`` after the scan becomes the op's ``D``.
- ``fold_gate``: ``y ⊙ silu(z)`` after the skip becomes the op's ``z``.
- ``functionalize``: a program with in-place ops is functionalized first (``pscan`` writes in
  place), so that data flow is explicit.

The rewrite is exact up to float rounding: the op computes the same recurrence in float32.
"""

from __future__ import annotations

import dataclasses
import operator
from collections import Counter
from typing import TYPE_CHECKING

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.passes.call_args import node_arg
from ssmcc.passes.dim_labels import (
    ArrangeError,
    Labelled,
    Labels,
    arrange,
    broadcast_labels,
    make_emitter,
    shape,
    tensor,
    unlabel_to,
)
from ssmcc.passes.locations import location
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import rebuild_program
from ssmcc.passes.recurrence import MAMBA1, MAMBA1_OR_SSD, SSD, NotACandidate, Recurrence
from ssmcc.passes.recurrence_parallel import find_parallel_scan, parallel_scan_candidates
from ssmcc.passes.recurrence_scan_op import find_scan_op
from ssmcc.passes.recurrence_unrolled import find_unrolled
from ssmcc.passes.rules import fake_mode_of
from ssmcc.passes.scan_factoring import (
    TIME,
    Atom,
    Mismatch,
    ScanFactors,
    StepContext,
    factor,
    label_sizes,
    place_atom,
    read_discretisation,
    require,
)
from ssmcc.passes.scan_readout import read_output
from ssmcc.passes.ssd_chunked import match_chunked_ssd
from ssmcc.passes.ssd_loop import match_ssd_loop
from ssmcc.passes.ssd_match import SsdMatch, rewrite_ssd

if TYPE_CHECKING:
    import networkx as nx

aten = torch.ops.aten
PASS_NAME = "detect_selective_scan"
SCAN = SSMCC_OPS["selective_scan"]


@dataclasses.dataclass
class ScanMatch:
    """Everything the rewrite needs: the op's arguments as labelled graph values, the node whose
    value the op's output replaces (with its labels) and the values equal to the final state."""

    recurrence: Recurrence
    factors: ScanFactors
    C: Atom
    output: Labelled
    D: Atom | None = None
    z: Atom | None = None
    delta_bias: Atom | None = None
    softplus: bool = False
    last_state: list[Labelled] = dataclasses.field(default_factory=list)
    folds: list[str] = dataclasses.field(default_factory=list)


def _softplus_and_bias(match: ScanMatch) -> None:
    delta = match.factors.delta
    if delta.chain and delta.chain[-1] == aten.softplus.default:
        delta = dataclasses.replace(delta, chain=delta.chain[:-1])
    elif (
        not delta.chain and delta.node.target == aten.softplus.default and len(delta.node.args) == 1
    ):
        delta = Atom(node_arg(delta.node), delta.labels)
    else:
        return
    match.softplus, match.folds = True, match.folds + ["fold_softplus"]
    channel = match.factors.roles.channel
    if len(delta.chain) == 1 and isinstance(delta.chain[0], tuple):  # per-step softplus(dt + b)
        op, other, _ = delta.chain[0]
        if op == aten.add.Tensor and isinstance(other, Atom) and other.named() == {channel}:
            match.delta_bias = other
            match.folds.append("fold_delta_bias")
            delta = Atom(delta.node, delta.labels)
    node = delta.node
    if delta.chain or node.target != aten.add.Tensor or "alpha" in node.kwargs:
        match.factors.delta = delta
        return
    for i in range(2):
        x, bias = node.args[i], node.args[1 - i]
        if not (isinstance(x, Node) and isinstance(bias, Node)) or shape(x) != shape(node):
            continue
        bias_atoms = factor(bias, broadcast_labels(bias, delta.labels, shape(node)), StepContext())
        if len(bias_atoms) == 1 and bias_atoms[0].named() == {match.factors.roles.channel}:
            match.delta_bias = bias_atoms[0]
            match.folds.append("fold_delta_bias")
            delta = Atom(x, delta.labels)
            break
    match.factors.delta = delta


def _skip_and_gate(match: ScanMatch) -> None:
    node, labels = match.output.node, match.output.labels
    roles, u = match.factors.roles, match.factors.u
    for fold in ("fold_skip", "fold_gate"):
        if len(node.users) != 1:
            break
        user = next(iter(node.users))
        if user.target not in (aten.add.Tensor, aten.mul.Tensor) or "alpha" in user.kwargs:
            break
        if (fold == "fold_skip") != (user.target == aten.add.Tensor) or shape(user) != shape(node):
            continue
        other = user.args[1] if user.args[0] is node else user.args[0]
        if not isinstance(other, Node):
            break
        try:
            atoms = factor(other, broadcast_labels(other, labels, shape(user)), StepContext())
        except Mismatch:
            break
        if fold == "fold_skip":
            rest = [a for a in atoms if a != u]
            if len(atoms) != 2 or len(rest) != 1 or rest[0].named() != {roles.channel}:
                continue
            match.D = rest[0]
        else:
            gate = atoms[0] if len(atoms) == 1 else None
            if gate is None or gate.chain or gate.node.target != aten.silu.default:
                break
            z = Atom(node_arg(gate.node), gate.labels)
            if not {roles.channel, TIME} <= z.named() <= {roles.batch, roles.channel, TIME}:
                break
            match.z = z
        match.folds.append(fold)
        node = user
    match.output = Labelled(node, labels)


def match_scan(recurrence: Recurrence) -> ScanMatch:
    """Read ``recurrence`` as a selective scan (``Mismatch`` says why it is not one)."""
    factors = read_discretisation(
        recurrence.decay, recurrence.drive, recurrence.state_labels, recurrence.ctx, MAMBA1
    )
    readout, (node, labels), last = read_output(recurrence, factors.roles.state)
    roles = factors.roles
    require(
        {lab for lab in labels if lab is not None} == {roles.batch, roles.channel, TIME},
        f"the scan output {node.name} has dims {list(labels)}; expected batch, channel, time",
    )
    match = ScanMatch(recurrence, factors, readout.C, Labelled(node, labels), last_state=last)
    _softplus_and_bias(match)
    _skip_and_gate(match)
    return match


def rewrite(match: ScanMatch, graph_module: GraphModule) -> None:
    """Insert the ``selective_scan`` call for ``match`` and point the scan's users at it."""
    graph = graph_module.graph
    fake_mode = fake_mode_of(graph)
    emit = make_emitter(graph, fake_mode)
    f, roles = match.factors, match.factors.roles
    b, d, n = roles.batch, roles.channel, roles.state
    with graph.inserting_before(match.output.node):
        sizes = label_sizes(emit, [f.u, f.A, f.B, f.delta, match.C])

        def place(atom: Atom | None, want: Labels):
            return None if atom is None else place_atom(emit, atom, want, sizes)

        init = match.recurrence.init
        initial_state = None
        if init is not None:
            initial_state = arrange(emit, init, (b, d, n), sizes)
            initial_state = emit(aten._to_copy.default, initial_state, dtype=torch.float32)
        scan = emit(
            SCAN,
            place(f.u, (b, d, TIME)),
            place(f.delta, (b, d, TIME)),
            place(f.A, (d, n)),
            place(f.B, (b, n, TIME)),
            place(match.C, (b, n, TIME)),
            place(match.D, (d,)),
            place(match.z, (b, d, TIME)),
            place(match.delta_bias, (d,)),
            match.softplus,
            initial_state,
        )
        out = emit(operator.getitem, scan, 0)
        last = emit(operator.getitem, scan, 1)
        replacement = unlabel_to(emit, out, (b, d, TIME), match.output.labels)
        replacement = _cast_like(emit, replacement, match.output.node)
        states = []
        for use in match.last_state:
            state = unlabel_to(emit, last, (b, d, n), use.labels)
            states.append((use.node, _cast_like(emit, state, use.node)))
    anchor = match.recurrence.anchor
    for node in graph.nodes:  # new nodes belong to the module that computed the scan
        if "val" in node.meta and "nn_module_stack" not in node.meta:
            for key in ("nn_module_stack", "stack_trace"):
                if key in anchor.meta:
                    node.meta[key] = anchor.meta[key]
    match.output.node.replace_all_uses_with(replacement)
    for node, state in states:
        node.replace_all_uses_with(state)


def _cast_like(emit, node: Node, like: Node) -> Node:
    want = tensor(like).dtype
    return node if tensor(node).dtype == want else emit(aten._to_copy.default, node, dtype=want)


def _restore_topological_order(graph) -> None:
    """Reorder nodes so each follows its inputs, keeping the existing order where it can."""
    nodes = list(graph.nodes)
    placed, order = set(), []

    def place(node):
        stack = [(node, False)]
        while stack:
            current, ready = stack.pop()
            if current in placed:
                continue
            if ready:
                placed.add(current)
                order.append(current)
                continue
            stack.append((current, True))
            stack += [(a, False) for a in reversed(current.all_input_nodes) if a not in placed]

    for node in nodes:
        place(node)
    output = graph.output_node()
    for node in order:
        if node is not output and node.op != "placeholder":
            output.prepend(node)


def _has_mutation(program: ExportedProgram) -> bool:
    return any(
        node.op == "call_function"
        and isinstance(node.target, torch._ops.OpOverload)
        and node.target._schema.is_mutable
        for node in program.graph.nodes
    )


def _candidates(graph_module: GraphModule, with_program: bool) -> list[tuple[str, Node]]:
    """(rule, node) for every structure that may be a scan, in graph order (``chunked_ssd``
    only with a program: its check runs the program's parameters)."""
    graph = graph_module.graph
    found = []
    for node in graph.nodes:
        if node.op == "call_function" and node.target == aten.stack.default:
            found.append(("unrolled_loop", node))
        elif node.op == "call_function" and node.target is torch.ops.higher_order.scan:
            found.append(("scan_op", node))
        elif with_program and node.op == "call_function" and node.target == aten.cumsum.default:
            found.append(("chunked_ssd", node))
    found += [("parallel_scan", exp) for exp in parallel_scan_candidates(graph, MAMBA1)]
    return found


class _Finder:
    """Reads a candidate with the finder of its rule; the data-flow graph the parallel-scan
    finder needs is built once and rebuilt after each rewrite."""

    def __init__(self, graph_module: GraphModule, program: ExportedProgram | None):
        self.program = program
        self.graph_module = graph_module
        self._dag = None

    def changed(self) -> None:
        self._dag = None

    def dag(self) -> nx.DiGraph:
        if self._dag is None:
            import networkx as nx  # 15 MB of modules: imported when a search needs the DAG

            graph = self.graph_module.graph
            self._dag = nx.DiGraph((a, n) for n in graph.nodes for a in n.all_input_nodes)
        return self._dag

    def __call__(self, rule: str, node: Node) -> ScanMatch | SsdMatch:
        if rule == "chunked_ssd":
            if self.program is None:  # its candidates are looked for only in a program
                raise NotACandidate
            return match_chunked_ssd(node, self.program)
        if rule == "unrolled_loop":
            recurrence = find_unrolled(node, MAMBA1_OR_SSD)
            rank = len([lab for lab in recurrence.state_labels if lab not in (None, TIME)])
            return match_ssd_loop(recurrence) if rank == SSD.state_rank else match_scan(recurrence)
        if rule == "scan_op":
            return match_scan(find_scan_op(node, self.graph_module, MAMBA1))
        return match_scan(find_parallel_scan(node, self.dag(), MAMBA1))


def rewrite_scans(
    graph_module: GraphModule, ctx: PassContext, program: ExportedProgram | None = None
) -> Counter:
    """The pass on a functional ATen graph, in place: hits by rule (empty: the graph is as it
    was). Without ``program`` (a graph from ``torch.compile``) the ``chunked_ssd`` rule is off."""
    hits: Counter = Counter()
    consumed: set = set()
    find = _Finder(graph_module, program)
    for rule, node in _candidates(graph_module, program is not None):
        if node in consumed:
            continue
        try:
            match = find(rule, node)
        except NotACandidate:
            continue
        except (Mismatch, ArrangeError) as error:
            ctx.diagnostics.setdefault(f"{PASS_NAME}.{rule}", []).append(
                f"{location(node)}: {getattr(error, 'reason', error)}"
            )
            continue
        if isinstance(match, SsdMatch):
            rewrite_ssd(match, graph_module)
            hits[match.rule] += 1
        else:
            rewrite(match, graph_module)
            hits[match.recurrence.rule] += 1
        hits.update(match.folds)
        consumed |= _dead_after(graph_module)
        find.changed()
    if hits:
        _restore_topological_order(graph_module.graph)
        graph_module.graph.eliminate_dead_code()
        graph_module.graph.lint()
    return hits


def detect_selective_scan(program: ExportedProgram, ctx: PassContext) -> PassResult:
    original = program
    functionalized = _has_mutation(program)
    if functionalized:
        program = program.run_decompositions({})
    hits = rewrite_scans(program.graph_module, ctx, program)
    if not hits:
        return PassResult(original, False, Counter())  # nothing found: the program as it was
    if functionalized:
        hits["functionalize"] += 1
    return PassResult(rebuild_program(program, program.graph_module), True, hits)


def _dead_after(graph_module: GraphModule) -> set:
    """Nodes no longer needed (so later candidates inside a rewritten loop are skipped)."""
    live: set[Node] = set()
    nodes = list(graph_module.graph.nodes)
    for node in reversed(nodes):
        if node.op == "output" or node.users.keys() & live or (node.op == "placeholder"):
            live.add(node)
    return set(nodes) - live
