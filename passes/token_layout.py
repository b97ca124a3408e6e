"""Where a value sits in a token-major tensor: reading a (batch, length, ...) value back through
views, splits and slices of the last axis to the (batch, length, width) tensor it is a slice of
(``token_slice``), and a channel-first (batch, channels, length) value back through the channel
slices of a transposed one (``channel_slice``). The fused mixers' rules use them to find the one
projection output a layer's pieces come from.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from ssmcc.passes.call_args import int_arg, ints_arg, node_arg, size_arg, sizes_arg
from ssmcc.passes.dim_labels import shape
from ssmcc.passes.rules import Reject

aten = torch.ops.aten
VIEWS = {
    aten.view.default,
    aten.reshape.default,
    aten._unsafe_view.default,
    aten.clone.default,
    aten.contiguous.default,
}
SPLITS = {aten.split_with_sizes.default, aten.split.Tensor}


def _same(a, b) -> bool:
    return a is b or str(a) == str(b)


def _last_axis(node: Node, dim) -> bool:
    return isinstance(dim, int) and dim in (-1, len(shape(node)) - 1)


def split_offset(split: Node, index: int) -> int | None:
    """The offset of piece ``index`` of a split along the last axis, or None."""
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    if not _last_axis(node_arg(split), dim):
        return None
    if split.target == aten.split.Tensor:  # equal pieces of ``sizes`` each
        return index * int(size_arg(split, 1))
    return sum(int(s) for s in sizes_arg(split, 1)[:index])


def token_slice(node: Node, walked: set) -> tuple[Node, int] | Reject:
    """(P, offset): ``node`` (b, l, ...) is ``P[..., offset : offset + width]`` viewed, P being
    (b, l, w). Adds the nodes passed through to ``walked``."""
    want = shape(node)
    offset = 0
    while True:
        here = shape(node)
        if len(here) < 2 or not (_same(here[0], want[0]) and _same(here[1], want[1])):
            return Reject(f"{node.name} does not keep (batch, length) in front")
        if node.op != "call_function":
            break
        if node.target in VIEWS:
            walked.add(node)
            node = node_arg(node)
        elif node.target == operator.getitem and node_arg(node).target in SPLITS:
            split = node_arg(node)
            piece = split_offset(split, int_arg(node, 1))
            if piece is None:
                return Reject(f"{split.name} splits another axis than the last")
            walked.update((node, split))
            offset += piece
            node = node_arg(split)
        elif node.target == aten.slice.Tensor and _last_axis(node_arg(node), node.args[1]):
            start = node.args[2] if len(node.args) > 2 and node.args[2] is not None else 0
            step = node.args[4] if len(node.args) > 4 else 1
            if not isinstance(start, int) or step != 1:
                return Reject(f"{node.name} slices with a symbolic start or a step")
            walked.add(node)
            offset += start
            node = node_arg(node)
        else:
            break
    if len(shape(node)) != 3:
        return Reject(f"{node.name} is not a (batch, length, width) tensor")
    return node, offset


def transpose_1_2(node) -> Node | None:
    if not isinstance(node, Node) or node.op != "call_function":
        return None
    if node.target == aten.transpose.int:
        swapped = {int_arg(node, 1) % 3, int_arg(node, 2) % 3}
        return node_arg(node) if swapped == {1, 2} else None
    if node.target == aten.permute.default and ints_arg(node, 1) == [0, 2, 1]:
        return node_arg(node)
    return None


def getitems(node: Node) -> dict[int, Node]:
    return {int_arg(u, 1): u for u in node.users if u.target == operator.getitem}


def channel_slice(node: Node, walked: set) -> tuple[Node, int] | Reject:
    """(P, offset): ``node`` (b, c, l) is ``P^T[:, offset : offset + c]``, P being (b, l, w)."""
    offset = 0
    while node.op == "call_function" and node.target in (
        operator.getitem,
        aten.slice.Tensor,
    ):
        if node.target == operator.getitem:
            split, index = node_arg(node), int_arg(node, 1)
            dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
            if split.target == aten.chunk.default and dim in (1, -2):
                offset += index * (shape(node_arg(split))[1] // int_arg(split, 1))
            elif split.target in SPLITS and dim in (1, -2):
                if split.target == aten.split.Tensor:
                    offset += index * int(size_arg(split, 1))
                else:
                    offset += sum(int(s) for s in sizes_arg(split, 1)[:index])
            else:
                return Reject(f"{node.name} is not a channel slice")
            walked.update((node, split))
            node = node_arg(split)
        else:
            if node.args[1] not in (1, -2) or (len(node.args) > 4 and node.args[4] != 1):
                return Reject(f"{node.name} slices another axis than the channels")
            start = size_arg(node, 2) if len(node.args) > 2 and node.args[2] is not None else 0
            walked.add(node)
            offset += int(start)
            node = node_arg(node)
    token_major = transpose_1_2(node)
    if token_major is None:
        return Reject(f"{node.name} is not a transposed (b, l, w) projection output")
    walked.add(node)
    found = token_slice(token_major, walked)
    if isinstance(found, Reject):
        return found
    return found[0], found[1] + offset
