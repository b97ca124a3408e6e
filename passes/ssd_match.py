"""What a found Mamba-2 (SSD) scan is, and its rewrite into one ``ssmcc::ssd_scan``.

Both SSD finders — the chunked form (``ssd_chunked.py``) and a per-step loop in head layout
(``ssd_loop.py``) — end in an ``SsdMatch``: graph values already in the op's layout

    x (b, l, h, p), dt (b, l, h), A (h,), B and C (b, l, g, n), D (h,) or (h, p)

and the value the op's output replaces. A loop's values are ``Placed``: a factor with the dims
the op wants, arranged (and its per-step chain applied) when the op is inserted.

``fold_dt`` reads ``dt = clamp(softplus(raw + bias), lo, hi)`` into the op's ``dt_bias``,
``dt_softplus``, ``dt_min`` and ``dt_max`` (so the step program and the kernels see the raw
projection, as after routing), and ``groups_of`` reads B/C that were repeated per head
(``repeat_interleave(B, h/g, dim=2)``) back to their g groups: the op maps head i to group
i // (h/g), which is what that repeat computes.
"""

from __future__ import annotations

import dataclasses
import math
import operator

import torch
from torch.fx import GraphModule, Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.passes.call_args import node_arg
from ssmcc.passes.dim_labels import Labels, make_emitter, shape, tensor, unlabel_to
from ssmcc.passes.rules import fake_mode_of
from ssmcc.passes.scan_factoring import TIME, Atom, label_sizes, place_atom

aten = torch.ops.aten
SSD_SCAN = SSMCC_OPS["ssd_scan"]


@dataclasses.dataclass(frozen=True)
class Placed:
    """A factor of a loop step and the op layout it is brought into (labels of the op's dims)."""

    atom: Atom
    want: Labels


# The op's layout in labels: a loop's factors are placed into these.
B_, H_, P_, N_, G_ = "b", "h", "p", "n", "g"
OP_LAYOUT = {
    "x": (B_, TIME, H_, P_),
    "dt": (B_, TIME, H_),
    "A": (H_,),
    "B": (B_, TIME, G_, N_),
    "C": (B_, TIME, G_, N_),
    "D": (H_,),
    "D_hp": (H_, P_),
    "state": (B_, H_, P_, N_),
}


@dataclasses.dataclass
class SsdMatch:
    rule: str
    anchor: Node  # where it is reported; new nodes take its module metadata
    output: Node  # the value ssd_scan's output replaces, shape (b, l, h, p)
    x: Node | Placed
    dt: Node | Placed
    A: Node | Placed
    B: Node | Placed
    C: Node | Placed
    D: Node | Placed | None = None
    dt_bias: Node | None = None
    dt_softplus: bool = False
    dt_min: float = 0.0
    dt_max: float | None = None
    initial_state: Node | Placed | None = None
    last_state: list[Node] = dataclasses.field(default_factory=list)
    folds: list[str] = dataclasses.field(default_factory=list)
    output_labels: Labels | None = None  # the output's dims when it is not in the op's layout
    state_labels: Labels | None = None  # the final-state uses' dims, likewise


def fold_dt(match: SsdMatch) -> None:
    """``dt = clamp(softplus(raw + bias), lo, hi)`` -> the op's dt options (each step optional)."""
    node = match.dt
    if not isinstance(node, Node):  # a loop's dt, already placed: nothing to fold
        return
    if node.target == aten.clamp.default and len(node.args) >= 2 and not node.kwargs:
        lo = node.args[1] if node.args[1] is not None else -math.inf
        hi = node.args[2] if len(node.args) > 2 and node.args[2] is not None else math.inf
        source = node.args[0]
        if (
            isinstance(lo, (int, float))
            and isinstance(hi, (int, float))
            and isinstance(source, Node)
            and source.target == aten.softplus.default
        ):
            match.dt_max = None if hi == math.inf else float(hi)
            match.dt_min = max(float(lo), 0.0)  # softplus > 0: a limit <= 0 clamps nothing
            match.folds.append("fold_dt_limit")
            node = source
    if node.target != aten.softplus.default or len(node.args) != 1 or node.kwargs:
        if match.folds:  # a clamp without softplus below it stays in the graph
            match.dt_min, match.dt_max, match.folds = 0.0, None, []
        return
    match.dt_softplus = True
    match.folds.append("fold_softplus")
    node = node_arg(node)
    if node.target == aten.add.Tensor and "alpha" not in node.kwargs:
        for i in range(2):
            raw, bias = node.args[i], node.args[1 - i]
            if (
                isinstance(raw, Node)
                and isinstance(bias, Node)
                and shape(raw) == shape(node)
                and shape(bias) == (shape(node)[-1],)
            ):
                match.dt_bias = bias
                match.folds.append("fold_delta_bias")
                node = raw
                break
    match.dt = node


def groups_of(node: Node, heads: int) -> Node:
    """B or C before a per-head ``repeat_interleave`` along the group dim, else itself."""
    if node.target == aten.repeat_interleave.self_int:
        source, repeats = node.args[0], node.args[1]
        dim = node.args[2] if len(node.args) > 2 else node.kwargs.get("dim")
        if (
            isinstance(source, Node)
            and dim in (2, -2)
            and isinstance(repeats, int)
            and len(shape(source)) == 4
            and shape(source)[2] * repeats == heads
        ):
            return source
    return node


def rewrite_ssd(match: SsdMatch, graph_module: GraphModule) -> None:
    """Insert ``ssd_scan`` for ``match`` and point the output's (and final state's) users at it."""
    graph = graph_module.graph
    fake_mode = fake_mode_of(graph)
    emit = make_emitter(graph, fake_mode)
    before = set(graph.nodes)
    with graph.inserting_before(match.output):
        placed = [match.x, match.dt, match.A, match.B, match.C, match.D, match.initial_state]
        sizes = label_sizes(emit, [v.atom for v in placed if isinstance(v, Placed)])
        sizes.setdefault(G_, 1)

        def place(v):
            return place_atom(emit, v.atom, v.want, sizes) if isinstance(v, Placed) else v

        x = place(match.x)
        heads = shape(x)[2]
        scan = emit(
            SSD_SCAN,
            x,
            place(match.dt),
            place(match.A),
            groups_of(place(match.B), heads),
            groups_of(place(match.C), heads),
            place(match.D),
            None,
            match.dt_bias,
            match.dt_softplus,
            match.dt_min,
            match.dt_max,
            _float32(emit, place(match.initial_state)),
        )
        out = emit(operator.getitem, scan, 0)
        if match.output_labels is not None:
            out = unlabel_to(emit, out, OP_LAYOUT["x"], match.output_labels)
        out = _cast_like(emit, out, match.output)
        last = emit(operator.getitem, scan, 1)
        if match.state_labels is not None:
            last = unlabel_to(emit, last, OP_LAYOUT["state"], match.state_labels)
        states = [(use, _cast_like(emit, last, use)) for use in match.last_state]
    for node in set(graph.nodes) - before:  # new nodes belong to the module of the scan
        for key in ("nn_module_stack", "stack_trace"):
            if key in match.anchor.meta:
                node.meta[key] = match.anchor.meta[key]
    match.output.replace_all_uses_with(out)
    for use, state in states:
        use.replace_all_uses_with(state)


def _float32(emit, node: Node | None) -> Node | None:
    if node is None or tensor(node).dtype == torch.float32:
        return node
    return emit(aten._to_copy.default, node, dtype=torch.float32)


def _cast_like(emit, node: Node, like: Node) -> Node:
    want = tensor(like).dtype
    return node if tensor(node).dtype == want else emit(aten._to_copy.default, node, dtype=want)
