"""``canonicalize`` — remove what torch.export leaves behind that computes nothing.

Rules (each a ``NodeRule``, hits counted by name):

- ``noop_cast``: ``aten.to.dtype(x, dt)`` / ``aten._to_copy(x, dtype=dt)`` where x already has
  dtype dt (and the same device and layout) is x.
- ``metadata_assert``: ``aten._assert_tensor_metadata(x, ...)`` checks at run time a dtype that
  the graph's metadata already records; it has no users and produces nothing.
- ``full_slice``: ``aten.slice(x, dim, 0, end, 1)`` with ``end >= x.shape[dim]`` (or end the dim's
  own symbolic size) is x.
- ``inverse_transpose``: ``transpose(transpose(x, a, b), a, b)`` is x.
- ``undo_unsqueeze``: ``select(unsqueeze(x, d), d, 0)`` and ``squeeze(unsqueeze(x, d), d)`` are x
  (both are views, so the result is x itself, not a copy of it).

Before: any captured program. After: the same function (bit-identical outputs), no node matched by
these rules, every other node untouched.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ssmcc.passes.dim_labels import is_full_slice, slice_args
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import rebuild_program
from ssmcc.passes.rules import NodeRule, Reject, apply_rules, replace_with

aten = torch.ops.aten


def _value(node) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _is_noop_cast(node: Node) -> bool | Reject:
    source, result = _value(node.args[0]), _value(node)
    if source is None or result is None:
        return Reject("no tensor metadata on input or output")
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return Reject(f"changes memory format to {node.kwargs['memory_format']}")
    if (source.dtype, source.device, source.layout) != (result.dtype, result.device, result.layout):
        return Reject(f"converts {source.dtype} on {source.device} to {result.dtype}")
    return True


def _is_full_slice(node: Node) -> bool | Reject:
    if is_full_slice(node):
        return True
    dim, start, end, step = slice_args(node)
    if _value(node.args[0]) is None:
        return Reject("no tensor metadata on input")
    if start not in (0, None) or step != 1:
        return Reject(f"start {start}, step {step}")
    if isinstance(end, int) and isinstance(_value(node.args[0]).shape[dim], int):
        return Reject(f"end {end} cuts the dim")
    return Reject(f"end {end} is not provably the full dim")


def _dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _producer(node: Node, target) -> Node | None:
    source = node.args[0]
    return source if isinstance(source, Node) and source.target == target else None


def _is_inverse_transpose(node: Node) -> bool | Reject:
    inner, value = _producer(node, aten.transpose.int), _value(node)
    if inner is None or value is None:
        return Reject("input is not a transpose" if inner is None else "no tensor metadata")
    rank = value.dim()
    outer_dims = {_dim(d, rank) for d in node.args[1:3]}
    inner_dims = {_dim(d, rank) for d in inner.args[1:3]}
    return True if outer_dims == inner_dims else Reject(f"swaps {outer_dims}, not {inner_dims}")


def _is_undo_unsqueeze(node: Node) -> bool | Reject:
    inner, source = _producer(node, aten.unsqueeze.default), _value(node.args[0])
    if inner is None or source is None:
        return Reject("input is not an unsqueeze" if inner is None else "no tensor metadata")
    rank = source.dim()
    if _dim(node.args[1], rank) != _dim(inner.args[1], rank):
        return Reject(f"dim {node.args[1]} is not the unsqueezed dim {inner.args[1]}")
    if node.target == aten.select.int and node.args[2] not in (0, -1):
        return Reject(f"selects index {node.args[2]} of a size-1 dim")
    return True


def _bypass(node: Node) -> None:
    replace_with(node, node.args[0])


def _bypass_both(node: Node) -> None:
    replace_with(node, node.args[0].args[0])


def _erase(node: Node) -> None:
    node.graph.erase_node(node)


RULES = (
    NodeRule("noop_cast", (aten.to.dtype, aten._to_copy.default), _is_noop_cast, _bypass),
    NodeRule("metadata_assert", (aten._assert_tensor_metadata.default,), lambda node: True, _erase),
    NodeRule("full_slice", (aten.slice.Tensor,), _is_full_slice, _bypass),
    NodeRule("inverse_transpose", (aten.transpose.int,), _is_inverse_transpose, _bypass_both),
    NodeRule(
        "undo_unsqueeze", (aten.select.int, aten.squeeze.dim), _is_undo_unsqueeze, _bypass_both
    ),
)


def canonicalize(program: ExportedProgram, ctx: PassContext) -> PassResult:
    graph_module = program.graph_module
    hits, rejections = apply_rules(graph_module.graph, RULES)
    for rule, reasons in rejections.items():
        ctx.diagnostics.setdefault(f"canonicalize.{rule}", []).extend(reasons)
    if not hits:
        return PassResult(program, False, hits)
    return PassResult(rebuild_program(program, graph_module), True, hits)
