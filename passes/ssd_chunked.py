"""Finder for Mamba-2's chunked SSD form (rule ``chunked_ssd``): HF's own torch path, mamba_ssm's
``ssd_minimal`` and any other block decomposition of the SSD recurrence, exported at a static
length.

The recurrence, per batch row and head (``ssmcc/ops/ssd_scan.py``)::

    h_t = exp(dt_t A) h_{t-1} + dt_t x_t ⊗ B_t        y_t = C_t · h_t + D x_t

The chunked form splits time into chunks of k and computes the same y from segment sums of
``dt A`` (cumsum + masked exp), an intra-chunk product and an inter-chunk state pass. It is read
by its boundary, not by its inside:

- anchor: a ``cumsum`` whose input is, through data movement, zero padding and one chunk split
  (a reshape of the time dim T into (T/k, k)), a product of exactly two factors, A (one dim, no
  time: the head) and dt (batch, time, head) — the discretised decay exponent;
- x: the other factor of a product ``x ⊗ dt`` of rank 4 (batch, time, head, head dim);
- exit: the first value after the anchor with x's shape, optionally followed by one ``add``
  (the ``D x`` skip);
- B and C: the other two tensors split into chunks the same way inside the exit's cone.

Between them any algorithm may run. The region is accepted when the program's own graph, run with
random x, dt > 0, A < 0, B, C (and D, the one parameter the cone reads besides them) in place of
those values, gives the op's reference output at two random points (float32, relative 1e-4): a
numerical identity check, like the parallel-scan rule's for Mamba-1. The cone is also checked to
read nothing else (no other activation), so the identity holds for every input.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind
from torch.fx import Interpreter, Node

from ssmcc.ops.ssd_scan import ssd_scan_ref
from ssmcc.passes.dim_labels import shape, value
from ssmcc.passes.recurrence import NotACandidate
from ssmcc.passes.scan_factoring import Mismatch, StepContext, factor, require
from ssmcc.passes.ssd_match import SsdMatch, fold_dt

aten = torch.ops.aten
RULE = "chunked_ssd"

_MOVEMENT = {
    aten.permute.default,
    aten.transpose.int,
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.contiguous.default,
    aten.clone.default,
    aten.alias.default,
}
_PADS = {aten.pad.default, aten.constant_pad_nd.default}
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}
_FOLLOWED = {aten.unsqueeze.default, aten._to_copy.default, aten.to.dtype}  # dt -> x ⊗ dt
CONE_LIMIT = 4000  # nodes; a cone larger than this is not one scan's


def _same(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
        return a.node.expr == b.node.expr
    return False


def _chunk_split(node: Node) -> tuple[int, int, int] | None:
    """``(dim, length, chunk)`` when ``node`` reshapes dim ``dim`` (length T) into (T/k, k)."""
    if node.op != "call_function" or node.target not in _VIEWS:
        return None
    before, after = shape(node.args[0]), shape(node)
    if len(after) != len(before) + 1:
        return None
    for dim in range(len(before)):
        length, chunks, chunk = before[dim], after[dim], after[dim + 1]
        if not all(isinstance(s, int) for s in (length, chunks, chunk)):
            continue
        if (
            chunks * chunk == length
            and all(_same(a, b) for a, b in zip(before[:dim], after[:dim], strict=True))
            and all(_same(a, b) for a, b in zip(before[dim + 1 :], after[dim + 2 :], strict=True))
        ):
            return dim, length, chunk
    return None


def _is_zero_pad(node: Node) -> bool:
    if node.target not in _PADS:
        return False
    fill = node.args[3] if len(node.args) > 3 else node.kwargs.get("value", 0.0)
    mode = node.args[2] if len(node.args) > 2 else node.kwargs.get("mode", "constant")
    return bool(mode == "constant" and (fill is None or fill == 0))


def _split_source(node: Node):
    """For a chunk split: ``(source before zero padding, (dim, chunk))``; else None."""
    split = _chunk_split(node)
    if split is None:
        return None
    source = node.args[0]
    while isinstance(source, Node) and _is_zero_pad(source):
        source = source.args[0]
    return source, (split[0], split[2])


def _back_to_product(cumsum: Node):
    """Walk from the cumsum's input back through movement, padding and one chunk split."""
    node, split = cumsum.args[0], None
    while isinstance(node, Node) and node.op == "call_function":
        found = _split_source(node)
        if found is not None:
            if split is not None:
                return None
            node, split = found
            continue
        if node.target in _MOVEMENT or _is_zero_pad(node):
            node = node.args[0]
            continue
        break
    if split is None or not isinstance(node, Node) or node.target != aten.mul.Tensor:
        return None
    return node, split


def _factors(node: Node, labels: tuple) -> list:
    return factor(node, labels, StepContext())


def _find_x(dt: Node, labels: tuple) -> tuple[Node, Node]:
    """The product ``x ⊗ dt`` (rank 4) among dt's users (through movement): (product, x)."""
    frontier, seen = [dt], set()
    while frontier:
        node = frontier.pop()
        for user in node.users:
            if user in seen:
                continue
            seen.add(user)
            if user.target == aten.mul.Tensor and len(shape(user)) == 4:
                atoms = _factors(user, labels + ("p",))
                nodes = [a.node for a in atoms]
                if len(atoms) == 2 and dt in nodes:
                    x = atoms[1 - nodes.index(dt)]
                    if x.labels == labels + ("p",) and not x.chain:
                        return user, x.node
            elif user.target in _MOVEMENT or user.target in _FOLLOWED:
                frontier.append(user)
    raise Mismatch(f"no product x ⊗ dt (batch, time, head, head dim) uses dt = {dt.name}")


def _exit(anchor: Node, x: Node, product: Node) -> list[Node]:
    """Exit candidates: the first node after the anchor with x's shape that depends on both,
    and that node's ``add`` user (the D skip) when there is exactly one."""
    depends, nodes = {anchor, product}, list(anchor.graph.nodes)
    reach_anchor, reach_product = {anchor}, {product}
    for node in nodes[min(nodes.index(anchor), nodes.index(product)) :]:
        inputs = node.all_input_nodes
        if any(i in reach_anchor for i in inputs):
            reach_anchor.add(node)
        if any(i in reach_product for i in inputs):
            reach_product.add(node)
        if node in reach_anchor and node in reach_product and node not in depends:
            if value(node) is not None and _same_shape(node, x):
                users = list(node.users)
                if (
                    len(users) == 1
                    and users[0].target == aten.add.Tensor
                    and _same_shape(users[0], x)
                ):
                    return [users[0], node]
                return [node]
    raise Mismatch(f"no value after {anchor.name} has the shape of x {list(shape(x))}")


def _same_shape(a: Node, b: Node) -> bool:
    sa, sb = shape(a), shape(b)
    return len(sa) == len(sb) and all(_same(p, q) for p, q in zip(sa, sb, strict=True))


def _cone(exit_node: Node, cut: set, split: tuple, program: ExportedProgram):
    """Walk back from the exit to the cut values: (chunk-split sources, free parameters)."""
    kinds = {spec.arg.name: spec.kind for spec in program.graph_signature.input_specs}
    entries, params, seen, frontier = [], [], set(), [exit_node]
    while frontier:
        node = frontier.pop()
        if node in seen or node in cut:
            continue
        seen.add(node)
        require(len(seen) < CONE_LIMIT, f"the region before {exit_node.name} is not bounded")
        if node.op == "placeholder":
            kind = kinds.get(node.name)
            require(
                kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR),
                f"the region before {exit_node.name} reads the input {node.name}",
            )
            params.append(node)
            continue
        if not isinstance(node.meta.get("val"), torch.Tensor):
            continue  # sizes (sym_size) and the like
        found = _split_source(node)
        if found is not None and found[1] == split:
            if found[0] not in entries:
                entries.append(found[0])
            continue
        frontier += node.all_input_nodes
    return entries, params


def _example_args(program: ExportedProgram) -> list:
    args = []
    for spec, node in zip(
        program.graph_signature.input_specs,
        [n for n in program.graph.nodes if n.op == "placeholder"],
        strict=True,
    ):
        if spec.kind == InputKind.USER_INPUT:
            fake = node.meta["val"]
            sizes = [s if isinstance(s, int) else 2 for s in fake.shape]
            if fake.dtype.is_floating_point:
                args.append(torch.randn(sizes, dtype=fake.dtype))
            else:
                args.append(torch.zeros(sizes, dtype=fake.dtype))
        else:
            args.append(program.state_dict.get(spec.target, program.constants.get(spec.target)))
    return args


class _StopAt(Exception):
    def __init__(self, result):
        self.result = result


class _RunTo(Interpreter):
    """Runs the graph up to ``stop`` with some values given, and returns ``stop``'s value."""

    def __init__(self, graph_module, stop: Node):
        super().__init__(graph_module)
        self.stop = stop

    def run_node(self, node):
        result = super().run_node(node)
        if node is self.stop:
            raise _StopAt(result)
        return result


def _evaluate(program, exit_node, given: dict, param_values: dict):
    placeholders = [n for n in program.graph.nodes if n.op == "placeholder"]
    args = [
        param_values.get(p, a) for p, a in zip(placeholders, _example_args(program), strict=True)
    ]
    try:
        _RunTo(program.graph_module, exit_node).run(*args, initial_env=dict(given))
    except _StopAt as stop:
        return stop.result
    raise Mismatch(f"{exit_node.name} was not computed")


def _identity_holds(program, exit_node, roles: dict, D: Node | None) -> float | None:
    """Max relative difference of the region against the reference at two random points."""
    generator = torch.Generator().manual_seed(0)
    worst = 0.0
    for _ in range(2):

        def draw(node, low=None, high=None):
            val = value(node)
            sizes = [s if isinstance(s, int) else 2 for s in val.shape]
            if low is None:
                return torch.randn(sizes, generator=generator).to(val.dtype)
            return (low + (high - low) * torch.rand(sizes, generator=generator)).to(val.dtype)

        values = {
            roles["x"]: draw(roles["x"]),
            roles["dt"]: draw(roles["dt"], 0.1, 1.0),
            roles["A"]: draw(roles["A"], -1.5, -0.2),
            roles["B"]: draw(roles["B"]),
            roles["C"]: draw(roles["C"]),
        }
        params = {D: draw(D)} if D is not None else {}
        got = _evaluate(program, exit_node, values, params)
        x, dt, A, B, C = (values[roles[k]].float() for k in ("x", "dt", "A", "B", "C"))
        if B.shape[2] != x.shape[2] and x.shape[2] % B.shape[2] != 0:
            return None
        want, _ = ssd_scan_ref(x, dt, A, B, C, params[D].float() if D is not None else None)
        scale = 1.0 + want.abs().max().item()
        worst = max(worst, (got.float() - want).abs().max().item() / scale)
    return worst


def match_chunked_ssd(anchor: Node, program: ExportedProgram) -> SsdMatch:
    """Read the region around the cumsum ``anchor`` as one ssd_scan (see the module docstring)."""
    found = _back_to_product(anchor)
    if found is None:
        raise NotACandidate()
    product, split = found
    time_dim = split[0]
    labels = tuple("t" if i == time_dim else f"d{i}" for i in range(len(shape(product))))
    atoms = _factors(product, labels)
    names = ", ".join(a.describe() for a in atoms)
    require(
        len(shape(product)) == 3 and time_dim == 1,
        (
            f"the chunked decay {product.name} has shape {list(shape(product))} split at dim "
            f"{time_dim}; expected (batch, time, head) split along time"
        ),
    )
    require(len(atoms) == 2, f"the chunked decay {product.name} = {names} is not dt ⊗ A")
    A = [a for a in atoms if a.named() == {"d2"} and not a.chain]
    dt = [a for a in atoms if a.labels == labels and not a.chain]
    require(
        len(A) == 1 and len(dt) == 1,
        f"the chunked decay {product.name} = {names} is not dt (batch, time, head) ⊗ A (head)",
    )
    A, dt = A[0].node, dt[0].node
    require(len(shape(A)) == 1, f"A = {A.name} has shape {list(shape(A))}; expected (heads,)")
    x_product, x = _find_x(dt, labels)
    exits = _exit(anchor, x, x_product)
    why = ""
    for exit_node in exits:
        entries, params = _cone(exit_node, {x, dt, A}, split, program)
        others = [e for e in entries if e not in (product, x_product)]
        if product not in entries or x_product not in entries or len(others) != 2:
            why = (
                f"the chunked region before {exit_node.name} splits {len(entries)} tensors "
                f"into chunks ({', '.join(e.name for e in entries)}); expected x·dt, A·dt, B, C"
            )
            continue
        if len(params) > 1 or (params and len(shape(params[0])) not in (1, 2)):
            why = f"the chunked region reads {[p.name for p in params]} besides x, dt, A, B, C"
            continue
        D = params[0] if params else None
        for B, C in (others, others[::-1]):
            roles = dict(x=x, dt=dt, A=A, B=B, C=C)
            difference = _identity_holds(program, exit_node, roles, D)
            if difference is not None and difference < 1e-4:
                match = SsdMatch(RULE, anchor, exit_node, x, dt, A, B, C, D)
                if D is not None:
                    match.folds.append("fold_skip")
                fold_dt(match)
                return match
            why = (
                f"the chunked region before {exit_node.name} does not compute the SSD "
                f"recurrence (relative difference {difference})"
            )
    raise Mismatch(why)
