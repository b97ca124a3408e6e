"""Dim labels: which dims of one tensor are which dims of another, through data-movement ops.

A *label* names a logical axis (``"t"`` for time, ``"r0"``, ``"r1"``, ... for the dims of a
recurrence's state); ``None`` marks a size-1 dim that is broadcast or was inserted. A tensor's
labels are a tuple with one entry per dim.

``dim_sources(node)`` says, for a unary data-movement op (unsqueeze, squeeze, a size-1 select,
transpose, permute, movedim, expand, a full slice, a reshape that only adds or drops size-1 dims,
clone, alias, widening casts), which input dim each output dim comes from, so labels can be
carried backwards
(``input_labels``) and forwards (``output_labels``). ``broadcast_labels`` gives an operand's
labels under numpy-style broadcasting against a result whose labels are known. ``arrange`` emits
the ATen nodes that bring a labelled tensor into a wanted label order.
"""

from __future__ import annotations

import dataclasses
import sys

import torch
from torch.fx import Graph, Node
from torch.fx.node import Argument

from ssmcc.passes.call_args import int_arg, ints_arg, node_arg
from ssmcc.passes.rules import CASTS

aten = torch.ops.aten

Labels = tuple

_IDENTITY = {
    aten.clone.default,
    aten.alias.default,
    aten.contiguous.default,
    aten.lift_fresh_copy.default,
}
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def value(node) -> torch.Tensor | None:
    val = node.meta.get("val") if isinstance(node, Node) else None
    return val if isinstance(val, torch.Tensor) else None


def tensor(node) -> torch.Tensor:
    """The tensor value recorded on ``node``, which must have one."""
    val = value(node)
    if val is None:
        raise TypeError(f"{node} has no recorded tensor value")
    return val


def shape(node) -> tuple:
    return tuple(tensor(node).shape)


def _norm(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _is_one(size) -> bool:
    return isinstance(size, int) and size == 1


def _widening_cast(node: Node) -> bool:
    source, result = value(node.args[0]), value(node)
    if source is None or result is None:
        return False
    if not (source.dtype.is_floating_point and result.dtype.is_floating_point):
        return False
    return result.dtype.itemsize >= source.dtype.itemsize


def _reshape_sources(in_shape: tuple, out_shape: tuple) -> list[int | None] | None:
    """A reshape that only inserts or removes size-1 dims: output dim -> input dim."""
    in_dims = [i for i, s in enumerate(in_shape) if not _is_one(s)]
    out_dims = [j for j, s in enumerate(out_shape) if not _is_one(s)]
    if len(in_dims) != len(out_dims):
        return None
    if any(in_shape[i] != out_shape[j] for i, j in zip(in_dims, out_dims, strict=True)):
        return None
    sources: list[int | None] = [None] * len(out_shape)
    for i, j in zip(in_dims, out_dims, strict=True):
        sources[j] = i
    return sources


def dim_sources(node: Node) -> list[int | None] | None:
    """For a unary data-movement ``node``: output dim -> input dim (``None``: a new size-1 dim).

    Input dims that map to no output dim have size 1. ``None`` when ``node`` is not such an op.
    """
    if not isinstance(node, Node) or node.op != "call_function" or not node.args:
        return None
    source = node.args[0]
    in_val, out_val = value(source), value(node)
    if in_val is None or out_val is None:
        return None
    rank_in, rank_out = in_val.dim(), out_val.dim()
    target = node.target
    if target in _IDENTITY or (target in CASTS and _widening_cast(node)):
        return list(range(rank_in))
    if target == aten.unsqueeze.default:
        inserted = _norm(int_arg(node, 1), rank_out)
        return [None if j == inserted else (j if j < inserted else j - 1) for j in range(rank_out)]
    if target in (aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default):
        if len(node.args) == 1:
            dims = list(range(rank_in))
        else:
            dims = [int_arg(node, 1)] if isinstance(node.args[1], int) else ints_arg(node, 1)
        dropped = {_norm(d, rank_in) for d in dims if _is_one(in_val.shape[_norm(d, rank_in)])}
        return [i for i in range(rank_in) if i not in dropped]
    if target == aten.select.int:
        dim = _norm(int_arg(node, 1), rank_in)
        if not _is_one(in_val.shape[dim]):
            return None
        return [i for i in range(rank_in) if i != dim]
    if target == aten.transpose.int:
        a, b = _norm(int_arg(node, 1), rank_in), _norm(int_arg(node, 2), rank_in)
        sources: list[int | None] = list(range(rank_in))
        sources[a], sources[b] = b, a
        return sources
    if target == aten.permute.default:
        return [_norm(d, rank_in) for d in ints_arg(node, 1)]
    if target == aten.movedim.int:
        order: list[int | None] = list(range(rank_in))
        moved, to = _norm(int_arg(node, 1), rank_in), _norm(int_arg(node, 2), rank_in)
        order.insert(to, order.pop(moved))
        return order
    if target == aten.expand.default:
        offset = rank_out - rank_in
        return [
            None
            if j < offset or (_is_one(in_val.shape[j - offset]) and not _is_one(out_val.shape[j]))
            else j - offset
            for j in range(rank_out)
        ]
    if target in _VIEWS:
        return _reshape_sources(tuple(in_val.shape), tuple(out_val.shape))
    if target == aten.slice.Tensor and is_full_slice(node):
        return list(range(rank_in))
    return None


def slice_args(node: Node) -> tuple:
    """``(dim, start, end, step)`` of an ``aten.slice.Tensor`` node, defaults filled in."""
    return (tuple(node.args[1:]) + (0, None, None, 1)[len(node.args) - 1 :])[:4]


def is_full_slice(node: Node) -> bool:
    """``x[:, 0:end]`` where end provably covers the whole dim (as export writes ``x[:, None]``):
    no end, the maximal int, an int at least the static size, or the dim's own symbolic size."""
    source = value(node.args[0])
    dim, start, end, step = slice_args(node)
    if source is None or start not in (0, None) or step != 1:
        return False
    size = source.shape[_norm(dim, source.dim())]
    if end is None or (isinstance(end, int) and end >= sys.maxsize):
        return True
    if isinstance(end, int) and isinstance(size, int):
        return end >= size
    return isinstance(end, torch.SymInt) and str(end) == str(size)


def labels_along(start: Node, end: Argument, labels: Labels) -> Labels | None:
    """Labels of ``end`` when it is reached from ``start`` (dims ``labels``) through data
    movement only; ``None`` otherwise."""
    chain, node = [], end
    while node is not start:
        if not isinstance(node, Node):
            return None
        sources = dim_sources(node)
        if sources is None:
            return None
        chain.append(sources)
        node = node_arg(node)
    for sources in reversed(chain):
        labels = carried_labels(labels, sources)
    return labels


def input_labels(node: Node, labels: Labels) -> Labels | None:
    """Labels of ``node``'s input, given labels of its output (``None``: not data movement)."""
    sources = dim_sources(node)
    if sources is None:
        return None
    result: list = [None] * tensor(node.args[0]).dim()
    for out_dim, in_dim in enumerate(sources):
        if in_dim is not None:
            result[in_dim] = labels[out_dim]
    return tuple(result)


def output_labels(node: Node, labels: Labels) -> Labels | None:
    """Labels of ``node``'s output, given labels of its input (``None``: not data movement)."""
    sources = dim_sources(node)
    return None if sources is None else carried_labels(labels, sources)


def carried_labels(labels: Labels, sources: list[int | None]) -> Labels:
    """Labels through a data-movement op with ``sources`` (output dim -> input dim)."""
    return tuple(None if i is None else labels[i] for i in sources)


def broadcast_labels(operand, result_labels: Labels, result_shape: tuple) -> Labels:
    """An operand's labels when it broadcasts (numpy rules) to a result with ``result_labels``."""
    op_shape = shape(operand)
    offset = len(result_shape) - len(op_shape)
    return tuple(
        None
        if _is_one(size) and not _is_one(result_shape[i + offset])
        else result_labels[i + offset]
        for i, size in enumerate(op_shape)
    )


@dataclasses.dataclass(frozen=True)
class Labelled:
    """A graph value and the labels of its dims."""

    node: Node
    labels: Labels

    def named(self) -> tuple:
        return tuple(label for label in self.labels if label is not None)


class ArrangeError(ValueError):
    """The tensor cannot be brought into the wanted labels (a dim would have to be reduced)."""


def arrange(emit, item: Labelled, want: Labels, sizes: dict | None = None) -> Node:
    """Emit nodes that turn ``item`` into a tensor whose dims are ``want`` (in that order).

    Dims labelled ``None`` must have size 1 and are dropped; labels in ``want`` that ``item`` lacks
    are inserted and broadcast with ``expand`` to ``sizes[label]`` (an int, or a node giving a
    symbolic size). ``emit(target, *args)`` creates one node (with metadata).
    """
    node, labels = item.node, list(item.labels)
    dims = shape(node)
    extra = [lab for lab in labels if lab is not None and lab not in want]
    if extra:
        raise ArrangeError(f"{node.name} has dims {extra} that the target layout has no room for")
    named = [lab for lab in labels if lab is not None]
    if len(set(named)) != len(named):
        raise ArrangeError(f"{node.name} has a repeated dim label {labels}")
    drop = [i for i, lab in enumerate(labels) if lab is None]
    if any(not _is_one(dims[i]) for i in drop):
        raise ArrangeError(f"{node.name} broadcasts over a dim of size > 1")
    if drop:
        node = emit(aten.squeeze.dims, node, drop)
        labels = [lab for lab in labels if lab is not None]
    present = [lab for lab in want if lab in labels]
    order = [labels.index(lab) for lab in present]
    if order != list(range(len(order))):
        node = emit(aten.permute.default, node, order)
    labels = present
    missing = [i for i, lab in enumerate(want) if lab not in labels]
    for i in missing:
        node = emit(aten.unsqueeze.default, node, i)
    if missing:
        sizes = sizes or {}
        if any(want[i] not in sizes for i in missing):
            raise ArrangeError(f"no size known for dims {[want[i] for i in missing]}")
        node = emit(
            aten.expand.default,
            node,
            [sizes[want[i]] if i in missing else -1 for i in range(len(want))],
        )
    return node


def unlabel_to(emit, node: Node, have: Labels, want: Labels) -> Node:
    """Bring ``node`` (dims ``have``, all named) into ``want``, which may add size-1 dims (None)."""
    named_want = tuple(lab for lab in want if lab is not None)
    order = [have.index(lab) for lab in named_want]
    if order != list(range(len(order))):
        node = emit(aten.permute.default, node, order)
    for i, lab in enumerate(want):
        if lab is None:
            node = emit(aten.unsqueeze.default, node, i)
    return node


def make_emitter(graph: Graph, fake_mode):
    """``emit(target, *args)``: insert a call (at the graph's insert point) with ``meta["val"]``
    computed by running ``target`` on the arguments' fake values."""

    def fake_of(arg):
        if isinstance(arg, Node):
            return arg.meta["val"]
        if isinstance(arg, (list, tuple)):
            return type(arg)(fake_of(a) for a in arg)
        return arg

    def emit(target, *args, **kwargs):
        node = graph.call_function(target, tuple(args), kwargs)
        with fake_mode:
            node.meta["val"] = target(*fake_of(args), **fake_of(kwargs))
        return node

    return emit
