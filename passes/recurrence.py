"""First-order linear recurrences ``h_t = a_t * h_{t-1} + b_t`` as the finders describe them.

An exported graph holds such a recurrence in one of three forms, each read by its own finder:

- ``recurrence_unrolled.py`` (rule ``unrolled_loop``): a Python loop over time, unrolled by a
  static-length export;
- ``recurrence_scan_op.py`` (rule ``scan_op``): torch's ``scan`` higher-order op;
- ``recurrence_parallel.py`` (rule ``parallel_scan``): a data-movement + ``add``/``mul`` region
  such as mamba.py's Blelloch ``pscan``.

Each returns a ``Recurrence`` (what the factoring in ``scan_factoring.py`` reads), raises
``Mismatch`` with the check that failed, or ``NotACandidate`` when the structure is not
recurrence-like at all (nothing to report). ``ScanLayout`` says what the carried state looks like
(its rank; the rank of A): the finders take it as a parameter, so a detector for another scan
family (Mamba-2's SSD: state (b, h, p, n), scalar A per head) reuses them with its own layout.
This file holds what the three share: the record, the layout, and reading the affine update.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.fx import Node

from ssmcc.passes.call_args import node_arg
from ssmcc.passes.dim_labels import Labelled, Labels, dim_sources, labels_along, shape
from ssmcc.passes.scan_factoring import Mismatch, StepContext, require, with_time

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class ScanLayout:
    """What a scan family's state looks like to the finders and the factoring.

    ``state_rank``: dims of the carried state h, batch included (Mamba-1 (b, d, n): 3; SSD
    (b, h, p, n): 4); ``A_rank``: dims of the time-invariant factor A of the decay exponent
    (Mamba-1 (d, n): 2; SSD (h,): 1).
    """

    name: str
    state_rank: int
    A_rank: int
    also_rank: int | None = None  # a second family's state rank the finder also accepts

    def check_state(self, rank: int, where: str, what: str) -> None:
        ranks = {r for r in (self.state_rank, self.also_rank) if r is not None}
        require(
            rank in ranks,
            f"{where}: {what} has {rank} dims; a {self.name} state has "
            f"{' or '.join(str(r) for r in sorted(ranks))}",
        )


MAMBA1 = ScanLayout("Mamba-1 selective scan", state_rank=3, A_rank=2)
SSD = ScanLayout("Mamba-2 SSD scan", state_rank=4, A_rank=1)
# Loops are read for both families; the state's rank says which factoring applies.
MAMBA1_OR_SSD = ScanLayout("Mamba-1 or SSD scan", state_rank=3, A_rank=2, also_rank=4)


class NotACandidate(Exception):
    """The structure is not a recurrence over time (a plain map, unrelated stack, ...)."""


@dataclasses.dataclass
class Recurrence:
    """One found recurrence, in terms the factoring reads (see ``scan_factoring.py``)."""

    rule: str
    anchor: Node  # where it is reported, and what the rewritten value replaces
    state_labels: Labels  # labels of h: per step, or the state sequence (with TIME)
    decay: tuple[Node, Labels]  # a_t
    drive: tuple[Node, Labels]  # b_t
    ctx: StepContext
    init: Labelled | None  # initial state; None = zeros
    last_state: list[Labelled]  # values equal to the final state
    step_output: tuple[Node, Node] | None = None  # (per-step output, h of that step)
    collected: tuple[Node, int] | None = None  # per-step outputs stacked: (node, time axis)
    states: Labelled | None = None  # the whole state sequence, when that is what is collected


NONLINEAR_HINT = "the state passes through {op} ({node}), so h_t is not linear in h_{{t-1}}"
MIXING_OPS = {
    aten.matmul.default,
    aten.mm.default,
    aten.bmm.default,
    aten.einsum.default,
    aten.linear.default,
    aten.addmm.default,
}
ZERO_FILLS = {aten.zeros.default, aten.new_zeros.default, aten.zeros_like.default}


def is_zero_fill(node) -> bool:
    if not isinstance(node, Node) or node.op != "call_function":
        return False
    if node.target in ZERO_FILLS:
        return True
    if node.target in (aten.full.default, aten.new_full.default):
        return bool(node.args[-1] == 0)
    return False


def split_affine(h: Node, H: Node, depends) -> tuple[Node, Node]:
    """``h = add(mul(a, H), b)`` (either operand order) or ``addcmul(b, a, H)``: returns (a, b);
    else why not."""
    if (
        h.op == "call_function"
        and h.target == aten.addcmul.default
        and h.kwargs.get("value", 1) == 1
    ):
        drive, x, y = node_arg(h, 0), h.args[1], h.args[2]
        if (x is H) != (y is H) and not depends(drive):
            decay = y if x is H else x
            if not (isinstance(decay, Node) and not depends(decay)):
                raise Mismatch(f"{h.name}: the decay depends on the state")
            return decay, drive
    if h.op == "call_function" and h.target == aten.add.Tensor and "alpha" not in h.kwargs:
        operands = [arg for arg in h.args[:2]]
        on_state = [isinstance(x, Node) and depends(x) for x in operands]
        require(sum(on_state) == 1, f"{h.name}: both terms of the update depend on the state")
        product, term = operands[on_state.index(True)], operands[on_state.index(False)]
        if (
            isinstance(product, Node)
            and product.op == "call_function"
            and product.target == aten.mul.Tensor
        ):
            factors = list(product.args[:2])
            if H in factors:
                decay = factors[1 - factors.index(H)]
                require(
                    not (isinstance(decay, Node) and depends(decay)),
                    f"{product.name}: the decay depends on the state",
                )
                if not isinstance(term, Node):
                    raise Mismatch(f"{h.name}: the input term is a constant")
                if not isinstance(decay, Node):
                    raise Mismatch(f"{product.name}: the decay is the constant {decay}")
                require(
                    shape(decay) == shape(H) or len(shape(decay)) <= len(shape(H)),
                    f"{product.name}: the decay has more dims than the state",
                )
                return decay, term
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


def with_outputs(rec: Recurrence, step_output: Node, h: Node, collected: Node, axis: int):
    """What a step outputs, gathered along ``axis`` of ``collected``: the state itself (moved
    only), so ``collected`` is the whole state sequence, or a value read out of the state."""
    labels = labels_along(h, step_output, rec.state_labels)
    if labels is not None:
        rec.states = Labelled(collected, with_time(labels, axis, False))
    else:
        rec.step_output = (step_output, h)
        rec.collected = (collected, axis)
    return rec
