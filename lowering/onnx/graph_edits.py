"""Edits of ONNX graphs after export: what a node reads, and dropping the nodes nobody reads."""

from __future__ import annotations

import onnx


def names_read(node: onnx.NodeProto) -> set[str]:
    """What ``node`` reads: its inputs and, inside its subgraphs, every input of every node."""
    names = set(node.input)
    for attribute in node.attribute:
        for sub in [attribute.g] if attribute.HasField("g") else list(attribute.graphs):
            for inner in sub.node:
                names |= names_read(inner)
    return names


def remove_dead_nodes(graph: onnx.GraphProto) -> None:
    """Drop nodes none of whose outputs is read (a body's constants for a branch another
    attribute value selects, left by inlining; ORT warns about each)."""
    needed = {value.name for value in graph.output}
    kept = []
    for node in reversed(graph.node):
        if any(output in needed for output in node.output):
            kept.append(node)
            needed |= names_read(node)
    del graph.node[:]
    graph.node.extend(reversed(kept))


def remove_unused_initializers(graph: onnx.GraphProto) -> None:
    """Drop initializers no node (subgraphs included) and no graph output reads. Deleted where
    they are: rebuilding the list would copy every kept tensor's data (protobuf copies messages
    on ``extend``), a second copy of the weights while compiling."""
    used = {name for node in graph.node for name in names_read(node)}
    used |= {value.name for value in graph.output}
    for index in reversed(range(len(graph.initializer))):
        if graph.initializer[index].name not in used:
            del graph.initializer[index]
