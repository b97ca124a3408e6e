"""Where a graph node came from, in the user's terms: the module path that produced it.

``torch.export`` records each node's module stack (``nn_module_stack``); its last entry is the
innermost module, e.g. ``backbone.layers.3.mixer``. Reports, refusals and state names use it.
"""

from __future__ import annotations

import re

from torch.fx import Node


def module_path(node: Node) -> str:
    """The innermost module that produced ``node`` (``layers.0.mixer``), or ``""``."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return ""
    path = list(stack.values())[-1][0]
    return path.replace("L['self'].", "").replace("L__self___", "")


def location(node: Node) -> str:
    """``<module path> (node <name>)``, or ``node <name>`` when no module is recorded."""
    path = module_path(node)
    return f"{path} (node {node.name})" if path else f"node {node.name}"


def layer_of(node: Node) -> str | None:
    """``layers.<i>`` of the innermost enclosing ``layers.<i>`` module, if any."""
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        match = re.search(r"layers\.(\d+)", path)
        if match:
            return f"layers.{match.group(1)}"
    return None
