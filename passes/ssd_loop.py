"""Read a per-step loop in head layout as a Mamba-2 SSD scan (rule ``unrolled_loop``, 4-dim state).

A loop over time (``recurrence_unrolled.py`` finds it) whose state h has four dims is an SSD scan
when, dim for dim (``⊗``: elementwise product under broadcasting)::

    a_t = exp(dt_t ⊗ A)            dt (batch, head, time), A (head): one scalar per head
    b_t = dt_t ⊗ x_t ⊗ B_t         x (batch, head, p, time), B (batch, [head,] n, time)
    y_t[p] = Σ_n C_t[n] h_t[p, n]  C (batch, [head,] n, time)

The roles are read off the factors: A is the exponent's time-invariant factor and its one dim is
the head; dt is the other factor; of the input term's two other factors, x is the one whose
extra dim is not contracted by the readout (p) and B the one whose extra dim is (n). B and C that
carry the head dim (repeated per head) become the op's ``groups = heads`` form. A following
``y + D ⊗ x`` becomes the op's ``D`` (rule ``fold_skip``). Every check that fails says what it
found, so a look-alike (a decay that is not ``exp(dt·A)``, a readout over the wrong dim) is
reported with the reason.
"""

from __future__ import annotations

import dataclasses
import itertools

import torch
from torch.fx import Node

from ssmcc.passes.dim_labels import Labels, broadcast_labels, shape
from ssmcc.passes.recurrence import Recurrence
from ssmcc.passes.scan_factoring import (
    TIME,
    Atom,
    Mismatch,
    StepContext,
    decay_factors,
    factor,
    require,
)
from ssmcc.passes.scan_readout import read_output
from ssmcc.passes.ssd_match import B_, G_, H_, N_, OP_LAYOUT, P_, Placed, SsdMatch

aten = torch.ops.aten


def _renamed(atom: Atom, names: dict) -> Atom:
    chain = tuple(
        (op[0], _renamed(op[1], names) if isinstance(op[1], Atom) else op[1], op[2])
        if isinstance(op, tuple)
        else op
        for op in atom.chain
    )
    return dataclasses.replace(
        atom, labels=tuple(names.get(label, label) for label in atom.labels), chain=chain
    )


def _roles(rec: Recurrence) -> tuple[Atom, Atom, str, str]:
    """(A, dt, head label, batch label) from the decay."""
    A, dt = decay_factors(rec.decay, rec.ctx, "dt")
    state_dims = {label for label in rec.state_labels if label not in (None, TIME)}
    require(
        len(A.named()) == 1 and A.named() <= state_dims and not A.chain,
        f"A = {A.describe()} is not one value per head of the state",
    )
    head = next(iter(A.named()))
    others = dt.named() - {head, TIME}
    require(
        head in dt.named() and len(others) == 1 and others <= state_dims,
        f"dt = {dt.describe()} does not have the dims (batch, head, time)",
    )
    return A, dt, head, others.pop()


def match_ssd_loop(rec: Recurrence) -> SsdMatch:
    """Read ``rec`` (a loop with a 4-dim state) as an SSD scan (``Mismatch`` says why not)."""
    A, dt, head, batch = _roles(rec)
    state_dims = {label for label in rec.state_labels if label not in (None, TIME)}
    inputs = factor(*rec.drive, rec.ctx)
    names = ", ".join(a.describe() for a in inputs)
    require(dt in inputs, f"the input b_t = {names} has no factor dt = {dt.describe()}")
    rest = list(inputs)
    rest.remove(dt)
    require(len(rest) == 2, f"b_t / dt = {names}; expected x and B")
    why = ""
    for x, B in itertools.permutations(rest):
        p = x.named() - {batch, head, TIME}
        n = B.named() - {batch, head, TIME}
        if len(p) != 1 or len(n) != 1 or p | n | {batch, head} != state_dims:
            why = f"b_t / dt = {names} is not x (batch, head, p, time) ⊗ B (batch, n, time)"
            continue
        try:
            readout, (node, labels), last = read_output(rec, next(iter(n)))
        except Mismatch as error:
            why = error.reason
            continue
        mapping = {batch: B_, head: H_, next(iter(p)): P_, next(iter(n)): N_}
        output_labels = tuple(mapping.get(label, label) for label in labels)
        require(
            {label for label in output_labels if label is not None} == {B_, H_, P_, TIME},
            f"the scan output {node.name} has dims {list(labels)}; expected batch, head, p, time",
        )
        C = readout.C
        grouped = "B" if H_ in _renamed(B, mapping).named() else ""
        grouped += "C" if H_ in _renamed(C, mapping).named() else ""
        require(
            grouped in ("", "BC"),
            f"B = {B.describe()} and C = {C.describe()} are not both per head or both shared",
        )
        group = H_ if grouped else G_
        bc_layout = (B_, TIME, group, N_)
        match = SsdMatch(
            rule=rec.rule,
            anchor=rec.anchor,
            output=node,
            x=Placed(_renamed(x, mapping), OP_LAYOUT["x"]),
            dt=Placed(_renamed(dt, mapping), OP_LAYOUT["dt"]),
            A=Placed(_renamed(A, mapping), OP_LAYOUT["A"]),
            B=Placed(_renamed(B, mapping), bc_layout),
            C=Placed(_renamed(C, mapping), bc_layout),
            output_labels=output_labels,
        )
        if rec.init is not None:
            init = _renamed(Atom(rec.init.node, rec.init.labels), mapping)
            match.initial_state = Placed(init, OP_LAYOUT["state"])
        _last_state(match, last, mapping)
        _skip(match, x, mapping, output_labels)
        return match
    raise Mismatch(why)


def _last_state(match: SsdMatch, uses: list, mapping: dict) -> None:
    layouts = {tuple(mapping.get(label, label) for label in use.labels) for use in uses}
    if len(layouts) == 1:
        match.last_state = [use.node for use in uses]
        match.state_labels = layouts.pop()


def _skip(match: SsdMatch, x: Atom, mapping: dict, output_labels: Labels) -> None:
    """``y + D ⊗ x`` after the scan (its output's dims ``output_labels``): the op's D."""
    node = match.output
    if len(node.users) != 1:
        return
    user = next(iter(node.users))
    if user.target != aten.add.Tensor or "alpha" in user.kwargs or shape(user) != shape(node):
        return
    other = user.args[1] if user.args[0] is node else user.args[0]
    if not isinstance(other, Node):
        return
    graph_label = {v: k for k, v in mapping.items()}
    labels = tuple(graph_label.get(label, label) for label in output_labels)
    try:
        atoms = factor(other, broadcast_labels(other, labels, shape(user)), StepContext())
    except Mismatch:
        return
    rest = [a for a in atoms if a != dataclasses.replace(x, chain=())]
    if len(atoms) != 2 or len(rest) != 1 or rest[0].chain:
        return
    D = _renamed(rest[0], mapping)
    if D.named() not in ({H_}, {H_, P_}):
        return
    match.D = Placed(D, OP_LAYOUT["D"] if D.named() == {H_} else OP_LAYOUT["D_hp"])
    match.output = user
    match.folds.append("fold_skip")
