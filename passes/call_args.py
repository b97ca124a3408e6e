"""Typed reads of a call node's arguments.

torch.fx types every argument as ``Argument``: a node, a constant, or a container of either.
Which one an argument is, the op's schema says (``aten.unsqueeze``'s are a tensor and an int).
A pass that reads ``node.args[0].target`` relies on the schema; these reads say so to the type
checker as well, and where a graph disagrees (a rewrite bug) they fail naming the node.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from torch.fx import Node
from torch.fx.node import Argument

Size = int | torch.SymInt
T = TypeVar("T")


def _wrong(node: Node, index: int, found: object, what: str) -> TypeError:
    return TypeError(f"%{node.name} argument {index} is {found!r}, not {what}")


def _one(node: Node, index: int, kind: type[T], what: str) -> T:
    found = node.args[index]
    if not isinstance(found, kind):
        raise _wrong(node, index, found, what)
    return found


def _each(node: Node, index: int, kind: type[T], what: str) -> list[T]:
    found = node.args[index]
    if isinstance(found, (list, tuple)):
        items = [item for item in found if isinstance(item, kind)]
        if len(items) == len(found):
            return items
    raise _wrong(node, index, found, what)


def node_arg(node: Node, index: int = 0) -> Node:
    """``node.args[index]``, a value the graph computes (a tensor, or the tuple ``getitem``
    reads): the node computing it."""
    return _one(node, index, Node, "a node")


def optional_node_arg(node: Node, index: int) -> Node | None:
    """``node.args[index]``, an optional tensor argument (``Tensor?``): its node, or None."""
    return None if node.args[index] is None else _one(node, index, Node, "a node or None")


def nodes_arg(node: Node, index: int) -> list[Node]:
    """``node.args[index]``, a list of tensors (``stack``'s, ``cat``'s): their nodes."""
    return _each(node, index, Node, "a list of tensors")


def list_arg(node: Node, index: int) -> list[Argument]:
    """``node.args[index]``, a list argument, its items of any kind (``aten.index``'s: tensors or
    None)."""
    found = node.args[index]
    if not isinstance(found, (list, tuple)):
        raise _wrong(node, index, found, "a list")
    return list(found)


def int_arg(node: Node, index: int) -> int:
    """``node.args[index]``, an int argument (a dim, an index)."""
    return _one(node, index, int, "an int")


def ints_arg(node: Node, index: int) -> list[int]:
    """``node.args[index]``, an int list argument (dims)."""
    return _each(node, index, int, "a list of ints")


def str_arg(node: Node, index: int) -> str:
    """``node.args[index]``, a string argument (an einsum equation)."""
    return _one(node, index, str, "a string")


def size_arg(node: Node, index: int) -> Size:
    """``node.args[index]``, a size argument: an int, or a symbolic one."""
    found = node.args[index]
    if not isinstance(found, Size):
        raise _wrong(node, index, found, "a size")
    return found


def sizes_arg(node: Node, index: int) -> list[Size]:
    """``node.args[index]``, a list of sizes (ints or symbolic ones)."""
    found = node.args[index]
    if isinstance(found, (list, tuple)):
        sizes = [s for s in found if isinstance(s, Size)]
        if len(sizes) == len(found):
            return sizes
    raise _wrong(node, index, found, "a list of sizes")
