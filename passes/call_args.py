"""Typed reads of a call node's arguments.

torch.fx types every argument as ``Argument``: a node, a constant, or a container of either.
Which one an argument is, the op's schema says (``aten.unsqueeze``'s are a tensor and an int).
A pass that reads ``node.args[0].target`` relies on the schema; these reads say so to the type
checker as well, and where a graph disagrees (a rewrite bug) they fail naming the node.
"""

from __future__ import annotations

import torch
from torch.fx import Node
from torch.fx.node import Argument

Size = int | torch.SymInt


def _wrong(node: Node, index: int, found: object, what: str) -> TypeError:
    return TypeError(f"%{node.name} argument {index} is {found!r}, not {what}")


def node_arg(node: Node, index: int = 0) -> Node:
    """``node.args[index]``, a value the graph computes (a tensor, or the tuple ``getitem``
    reads): the node computing it."""
    found = node.args[index]
    if not isinstance(found, Node):
        raise _wrong(node, index, found, "a node")
    return found


def optional_node_arg(node: Node, index: int) -> Node | None:
    """``node.args[index]``, an optional tensor argument (``Tensor?``): its node, or None."""
    found = node.args[index]
    if found is not None and not isinstance(found, Node):
        raise _wrong(node, index, found, "a node or None")
    return found


def nodes_arg(node: Node, index: int) -> list[Node]:
    """``node.args[index]``, a list of tensors (``stack``'s, ``cat``'s): their nodes."""
    found = node.args[index]
    if isinstance(found, (list, tuple)):
        nodes = [v for v in found if isinstance(v, Node)]
        if len(nodes) == len(found):
            return nodes
    raise _wrong(node, index, found, "a list of tensors")


def list_arg(node: Node, index: int) -> list[Argument]:
    """``node.args[index]``, a list argument, its items of any kind (``aten.index``'s: tensors or
    None)."""
    found = node.args[index]
    if not isinstance(found, (list, tuple)):
        raise _wrong(node, index, found, "a list")
    return list(found)


def int_arg(node: Node, index: int) -> int:
    """``node.args[index]``, an int argument (a dim, an index)."""
    found = node.args[index]
    if not isinstance(found, int):
        raise _wrong(node, index, found, "an int")
    return found


def ints_arg(node: Node, index: int) -> list[int]:
    """``node.args[index]``, an int list argument (dims)."""
    found = node.args[index]
    if isinstance(found, (list, tuple)):
        ints = [d for d in found if isinstance(d, int)]
        if len(ints) == len(found):
            return ints
    raise _wrong(node, index, found, "a list of ints")


def str_arg(node: Node, index: int) -> str:
    """``node.args[index]``, a string argument (an einsum equation)."""
    found = node.args[index]
    if not isinstance(found, str):
        raise _wrong(node, index, found, "a string")
    return found


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
