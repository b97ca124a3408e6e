"""Read a linear recurrence as a selective scan: which graph values are Δ, A, B, C, u.

A recurrence found in a graph (``recurrence*.py``) is ``h_t = a_t * h_{t-1} + b_t`` over a
state ``h`` of three dims, read out as ``y_t = contract(h_t, C_t)``. It is a Mamba-1 selective
scan when, dim for dim,

    a_t = exp(Δ_t ⊗ A)          Δ (batch, channel, time), A (channel, state), time-invariant
    b_t = Δ_t ⊗ B_t ⊗ u_t       B (batch, state, time), u (batch, channel, time)
    y_t[c] = Σ_i C_t[i] h_t[c, i]

where ``⊗`` is an elementwise product under broadcasting. ``factor`` splits an expression into
its multiplicative factors (``mul`` chains and einsums without contraction), following data
movement with dim labels (``dim_labels.py``); the roles batch / channel / state are then read off
which dims each factor has: A is the factor of the exponent that does not vary in time, its two
dims are channel and state, Δ is the other factor (it shares channel), and the state dim of h that
A lacks is batch. Every check that fails says what it found.

Values computed inside a loop step (``is_local``) cannot be referenced outside it; a per-step
elementwise function of a sliced input (``softplus(dt[:, :, t])``) is kept as a chain of unary ops
to re-apply to the whole input.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TypeVar

import torch
from torch.fx import Node
from torch.fx.node import Argument

from ssmcc.passes.call_args import ints_arg, nodes_arg, str_arg
from ssmcc.passes.dim_labels import (
    Labelled,
    Labels,
    arrange,
    broadcast_labels,
    input_labels,
    labels_along,
    shape,
)

aten = torch.ops.aten
TIME = "t"

# A per-step elementwise op of one tensor that can be re-applied to the whole sequence.
HOISTABLE_UNARY = {
    aten.softplus.default,
    aten.exp.default,
    aten.neg.default,
    aten.silu.default,
    aten.sigmoid.default,
}

HOISTABLE_BINARY = {aten.add.Tensor, aten.sub.Tensor}

# resolve(node) -> (source, time axis of source, keepdim) when node is one time step of source.
Resolver = Callable[[Node], "tuple[Node, int, bool] | None"]


class Mismatch(Exception):
    """A check failed; ``reason`` says which and what was found."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def require(condition: object, reason: str) -> None:
    if not condition:
        raise Mismatch(reason)


T = TypeVar("T")


def required(value: T | None, reason: str) -> T:
    """``value``, which must not be None (``Mismatch(reason)`` where it is)."""
    if value is None:
        raise Mismatch(reason)
    return value


@dataclasses.dataclass(frozen=True)
class Atom:
    """A factor: ``chain`` applied to ``node`` (innermost first), dims ``labels``. A chain entry
    is a unary op, or ``(op, other, i)``: a binary op with ``other`` (an ``Atom`` or a constant)
    as its operand ``i``."""

    node: Node
    labels: Labels
    chain: tuple = ()

    def named(self) -> set:
        return {label for label in self.labels if label is not None}

    def describe(self) -> str:
        text = self.node.name
        for op in self.chain:
            if isinstance(op, tuple):
                op, other = op[0], op[1].describe() if isinstance(op[1], Atom) else op[1]
                text = f"{op.__name__.split('.')[0]}({text}, {other})"
            else:
                text = f"{op.__name__.split('.')[0]}({text})"
        return f"{text}{list(self.labels)}"


@dataclasses.dataclass
class StepContext:
    """How to read one step of a recurrence: slices of whole tensors, and step-local nodes."""

    resolve: Resolver = lambda node: None  # noqa: E731
    is_local: Callable[[Node], bool] = lambda node: False  # noqa: E731


def with_time(labels: Labels, axis: int | None, keepdim: bool) -> Labels:
    """Labels of a tensor whose step ``labels`` are its slice at one time index along ``axis``
    (``keepdim``: the slice kept the dim, with size 1); ``axis`` None: the same tensor."""
    if axis is None:
        return labels
    if keepdim:
        return labels[:axis] + (TIME,) + labels[axis + 1 :]
    return labels[:axis] + (TIME,) + labels[axis:]


def _einsum_operand_labels(node: Node, labels: Labels) -> list[tuple[Node, Labels]] | None:
    """Operands of an einsum that contracts nothing, with their labels; else None."""
    equation, operands = str_arg(node, 0), nodes_arg(node, 1)
    if "..." in equation or "->" not in equation:
        return None
    inputs, output = equation.replace(" ", "").split("->")
    terms = inputs.split(",")
    if len(set(output)) != len(output) or any(c not in output for c in "".join(terms)):
        return None
    by_letter = dict(zip(output, labels, strict=True))
    result = []
    for term, operand in zip(terms, operands, strict=True):
        op_shape = shape(operand)
        result.append(
            (
                operand,
                tuple(
                    None
                    if (op_shape[i] == 1 and shape(node)[output.index(c)] != 1)
                    else by_letter[c]
                    for i, c in enumerate(term)
                ),
            )
        )
    return result


def factor(node, labels: Labels, ctx: StepContext) -> list[Atom]:
    """The multiplicative factors of ``node`` (dims ``labels``), through data movement."""
    require(isinstance(node, Node), f"a constant factor {node!r} (only tensor factors are read)")
    resolved = ctx.resolve(node)
    if resolved is not None:
        source, axis, keepdim = resolved
        return factor(source, with_time(labels, axis, keepdim), ctx)
    if node.op == "call_function" and node.target == aten.mul.Tensor:
        out_shape = shape(node)
        atoms = []
        for operand in node.args[:2]:
            require(isinstance(operand, Node), f"{node.name} multiplies by the constant {operand}")
            atoms += factor(operand, broadcast_labels(operand, labels, out_shape), ctx)
        return atoms
    if node.op == "call_function" and node.target == aten.einsum.default:
        operands = _einsum_operand_labels(node, labels)
        if operands is not None:
            return [atom for operand, lab in operands for atom in factor(operand, lab, ctx)]
    source_labels = input_labels(node, labels)
    if source_labels is not None:
        return factor(node.args[0], source_labels, ctx)
    if ctx.is_local(node):
        return [_hoist(node, labels, ctx)]
    return [Atom(node, tuple(labels))]


def _is_step_invariant(operand, ctx: StepContext) -> bool:
    return not isinstance(operand, Node) or (
        not ctx.is_local(operand) and ctx.resolve(operand) is None
    )


def _hoist(node: Node, labels: Labels, ctx: StepContext) -> Atom:
    """A per-step elementwise op of one sliced input (and constants or invariant tensors),
    kept as a chain entry to re-apply to the whole input."""
    extra = list(node.args[1:]) + list(node.kwargs.values())
    if node.target in HOISTABLE_UNARY and not any(isinstance(a, Node) for a in extra):
        atom = _single(node, factor(node.args[0], labels, ctx))
        return dataclasses.replace(atom, chain=atom.chain + (node.target,))
    if node.target in HOISTABLE_BINARY and "alpha" not in node.kwargs:
        operands = list(node.args[:2])
        fixed = [i for i, x in enumerate(operands) if _is_step_invariant(x, ctx)]
        require(len(fixed) == 1, f"{node.name} ({node.target}) combines two per-step values")
        index, base = fixed[0], operands[1 - fixed[0]]
        require(shape(base) == shape(node), f"{node.name} broadcasts its per-step operand")
        atom = _single(node, factor(base, labels, ctx))
        other: Atom | Argument = operands[index]
        if isinstance(other, Node):
            other = _single(
                node, factor(other, broadcast_labels(other, labels, shape(node)), StepContext())
            )
        return dataclasses.replace(atom, chain=atom.chain + ((node.target, other, index),))
    raise Mismatch(
        f"{node.name} ({node.target}) is computed inside each step from the step's inputs; "
        "only data movement, products and elementwise ops with invariant operands can be lifted "
        "out of the loop"
    )


def _single(node: Node, atoms: list[Atom]) -> Atom:
    require(len(atoms) == 1, f"{node.name} applies {node.target} to a product")
    return atoms[0]


def decay_exponent(node, labels: Labels, ctx: StepContext) -> list[Atom]:
    """Factors of x where the decay ``node`` is ``exp(x)`` (through data movement)."""
    while True:
        resolved = ctx.resolve(node)
        if resolved is not None:
            node, labels = resolved[0], with_time(labels, resolved[1], resolved[2])
            continue
        if node.op == "call_function" and node.target == aten.exp.default:
            return factor(node.args[0], labels, ctx)
        labels = required(
            input_labels(node, labels),
            f"the decay is {node.name} ({node.target}), not exp(Δ·A)",
        )
        node = node.args[0]


def decay_factors(decay: tuple[Node, Labels], ctx: StepContext, step: str) -> tuple[Atom, Atom]:
    """(A, the step) where the decay is ``exp(step ⊗ A)``: A the exponent's time-invariant
    factor, the step (Δ for Mamba-1, dt for SSD: ``step`` names it in errors) the other."""
    exponent = decay_exponent(*decay, ctx)
    names = ", ".join(a.describe() for a in exponent)
    require(
        len(exponent) == 2,
        f"exp(...) of the decay has {len(exponent)} factors ({names}); expected {step}·A",
    )
    constant = [a for a in exponent if TIME not in a.named()]
    varying = [a for a in exponent if TIME in a.named()]
    require(
        len(constant) == 1 and len(varying) == 1,
        f"the decay's factors {names} are not one time-varying {step} and one constant A",
    )
    return constant[0], varying[0]


@dataclasses.dataclass(frozen=True)
class Roles:
    batch: str
    channel: str
    state: str


@dataclasses.dataclass
class ScanFactors:
    delta: Atom
    A: Atom
    B: Atom
    u: Atom
    roles: Roles


def read_discretisation(
    decay: tuple[Node, Labels],
    drive: tuple[Node, Labels],
    state_labels: Labels,
    ctx: StepContext,
    layout,
) -> ScanFactors:
    """Δ, A, B, u and the roles of the state dims from ``a_t`` (decay) and ``b_t`` (drive), for
    a state of ``layout`` (``recurrence.ScanLayout``: the state's rank, A's rank)."""
    A, delta = decay_factors(decay, ctx, "Δ")
    state_dims = [label for label in state_labels if label is not None and label != TIME]
    require(
        len(state_dims) == layout.state_rank,
        f"the state has dims {list(state_labels)}; a {layout.name} state has {layout.state_rank}",
    )
    require(
        len(A.named()) == layout.A_rank and A.named() <= set(state_dims) and not A.chain,
        f"A = {A.describe()} does not span {layout.A_rank} dims of the state",
    )
    shared = delta.named() & A.named()
    require(
        len(shared) == 1, f"Δ = {delta.describe()} and A = {A.describe()} share {len(shared)} dims"
    )
    channel = shared.pop()
    state = (A.named() - {channel}).pop()
    batch = (set(state_dims) - A.named()).pop()
    require(state not in delta.named(), f"Δ = {delta.describe()} varies along the state dim")
    roles = Roles(batch, channel, state)

    inputs = factor(*drive, ctx)
    names = ", ".join(a.describe() for a in inputs)
    require(delta in inputs, f"the input b_t = {names} has no factor Δ = {delta.describe()}")
    rest = list(inputs)
    rest.remove(delta)
    B = [a for a in rest if state in a.named() and channel not in a.named()]
    u = [a for a in rest if channel in a.named() and state not in a.named()]
    require(
        len(rest) == 2 and len(B) == 1 and len(u) == 1,
        f"b_t / Δ = {', '.join(a.describe() for a in rest)}; expected B (state dim) and u "
        "(channel dim)",
    )
    for name, atom in (("B", B[0]), ("u", u[0])):
        require(TIME in atom.named(), f"{name} = {atom.describe()} does not vary in time")
    return ScanFactors(delta, A, B[0], u[0], roles)


@dataclasses.dataclass
class Readout:
    """``y = contract(h, C)`` over the state dim: the node computing it and its output labels."""

    node: Node
    labels: Labels
    C: Atom


def read_contraction(
    node: Node, h: Node, h_labels: Labels, state: str, ctx: StepContext
) -> Readout:
    """``node`` computes Σ over the state dim of h·C (matmul by a column -- ``bmm`` where AOT
    autograd decomposed a batched matmul --, einsum, or sum of a product); returns its output
    labels and C."""
    args = list(node.args)
    if node.target in (aten.matmul.default, aten.bmm.default):
        x_labels = required(
            labels_along(h, args[0], h_labels),
            f"{node.name}: the state is not the left matmul operand",
        )
        other = args[1]
        x_shape, c_shape = shape(args[0]), shape(other)
        require(
            x_labels[-1] == state and len(c_shape) >= 2 and c_shape[-1] == 1,
            f"{node.name}: matmul does not contract the state dim with a column vector",
        )
        lead = x_labels[:-2]
        c_lead = broadcast_labels_from(c_shape[:-2], lead, x_shape[:-2])
        readout_labels = x_labels[:-1] + (None,)
        c_labels = c_lead + (state, None)
    elif node.target == aten.einsum.default and len(nodes_arg(node, 1)) == 2:
        equation, operands = str_arg(node, 0), nodes_arg(node, 1)
        inputs, output = equation.replace(" ", "").split("->")
        terms = inputs.split(",")
        along = [labels_along(h, operand, h_labels) for operand in operands]
        found = [(i, labels) for i, labels in enumerate(along) if labels is not None]
        require(len(found) == 1, f"{node.name}: einsum does not take the state once")
        i, x_labels = found[0]
        letters = dict(zip(terms[i], x_labels, strict=True))
        other_term = terms[1 - i]
        other = operands[1 - i]
        state_letters = [c for c, lab in letters.items() if lab == state]
        require(
            state_letters
            and state_letters[0] not in output
            and all(c in letters for c in other_term)
            and all(c in output for c in terms[i] if c != state_letters[0]),
            f"{node.name}: einsum {equation!r} is not a contraction over the state dim",
        )
        readout_labels = tuple(letters[c] for c in output)
        c_labels = tuple(letters[c] for c in other_term)
    elif node.target == aten.sum.dim_IntList:
        product = args[0]
        if not (isinstance(product, Node) and product.target == aten.mul.Tensor):
            raise Mismatch(
                f"{node.name}: sum of {getattr(product, 'target', product)}, not of a product"
            )
        along = [labels_along(h, x, h_labels) for x in product.args[:2]]
        found = [(j, labels) for j, labels in enumerate(along) if labels is not None]
        require(len(found) == 1, f"{node.name}: the product does not take the state once")
        j, x_labels = found[0]
        x = product.args[j]
        require(shape(x) == shape(product), f"{node.name}: the state is broadcast in the product")
        other = product.args[1 - j]
        c_labels = broadcast_labels(other, x_labels, shape(product))
        rank = len(x_labels)
        dims = [d + rank if d < 0 else d for d in ints_arg(node, 1)]
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        require(
            [x_labels[d] for d in dims] == [state],
            f"{node.name}: sums over {[x_labels[d] for d in dims]}, not the state dim",
        )
        readout_labels = tuple(
            (None if keepdim else "drop") if d in dims else lab for d, lab in enumerate(x_labels)
        )
        readout_labels = tuple(lab for lab in readout_labels if lab != "drop")
    else:
        raise Mismatch(f"{node.name} ({node.target}) is not a contraction of the state with C")
    atoms = factor(other, c_labels, ctx)
    require(len(atoms) == 1, f"{node.name}: C is a product {[a.describe() for a in atoms]}")
    C = atoms[0]
    require(
        state in C.named() and TIME in C.named() and not C.chain,
        f"C = {C.describe()} does not vary in time along the state dim",
    )
    return Readout(node, readout_labels, C)


def broadcast_labels_from(op_shape: tuple, result_labels: Labels, result_shape: tuple) -> Labels:
    offset = len(result_shape) - len(op_shape)
    require(offset >= 0, "the readout operand has more batch dims than the state")
    return tuple(
        None if size == 1 and result_shape[i + offset] != 1 else result_labels[i + offset]
        for i, size in enumerate(op_shape)
    )


def label_sizes(emit, atoms: list[Atom]) -> dict:
    """label -> size (an int, or a ``sym_size`` node) over the dims of ``atoms``."""
    sizes = {}
    for atom in atoms:
        for dim, label in enumerate(atom.labels):
            if label is None or label in sizes:
                continue
            size = shape(atom.node)[dim]
            sizes[label] = (
                size if isinstance(size, int) else emit(aten.sym_size.int, atom.node, dim)
            )
    return sizes


def place_atom(emit, atom: Atom, want: Labels, sizes: dict) -> Node:
    """Emit ``atom`` (its chain applied to the whole tensor) with dims ``want``."""
    node = arrange(emit, Labelled(atom.node, atom.labels), want, sizes)
    for op in atom.chain:
        if isinstance(op, tuple):  # (binary op, other operand, its position)
            op, other, index = op
            other = place_atom(emit, other, want, sizes) if isinstance(other, Atom) else other
            node = emit(op, *((node, other) if index == 1 else (other, node)))
        else:
            node = emit(op, node)
    return node
