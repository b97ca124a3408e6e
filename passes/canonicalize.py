"""``canonicalize`` — remove what torch.export leaves behind that computes nothing.

Rules (each a ``NodeRule``: a pattern, a check, a rewrite; hits counted by name):

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
from ssmcc.passes.rules import (
    Match,
    NodeRule,
    Reject,
    Var,
    accept,
    apply_rules,
    op,
    replace_with,
)

aten = torch.ops.aten


def _value(node) -> torch.Tensor | None:
    value = node.meta.get("val") if isinstance(node, Node) else None
    return value if isinstance(value, torch.Tensor) else None


def _dim(dim: int, rank: int) -> int:
    return dim + rank if dim < 0 else dim


def _is_noop_cast(found: Match) -> bool | Reject:
    node = found.root
    source, result = _value(found["x"]), _value(node)
    if source is None or result is None:
        return Reject("no tensor metadata on input or output")
    if node.kwargs.get("memory_format") not in (None, torch.preserve_format):
        return Reject(f"changes memory format to {node.kwargs['memory_format']}")
    if (source.dtype, source.device, source.layout) != (result.dtype, result.device, result.layout):
        return Reject(f"converts {source.dtype} on {source.device} to {result.dtype}")
    return True


def _is_full_slice(found: Match) -> bool | Reject:
    node = found.root
    if is_full_slice(node):
        return True
    dim, start, end, step = slice_args(node)
    source = _value(found["x"])
    if source is None:
        return Reject("no tensor metadata on input")
    if start not in (0, None) or step != 1:
        return Reject(f"start {start}, step {step}")
    if isinstance(end, int) and isinstance(source.shape[dim], int):
        return Reject(f"end {end} cuts the dim")
    return Reject(f"end {end} is not provably the full dim")


def _is_inverse_transpose(found: Match) -> bool | Reject:
    value = _value(found.root)
    if value is None:
        return Reject("no tensor metadata")
    rank = value.dim()
    outer_dims = {_dim(d, rank) for d in (found["a"], found["b"])}
    inner_dims = {_dim(d, rank) for d in (found["inner_a"], found["inner_b"])}
    return True if outer_dims == inner_dims else Reject(f"swaps {outer_dims}, not {inner_dims}")


def _is_undo_unsqueeze(found: Match) -> bool | Reject:
    node, source = found.root, _value(found["unsqueezed"])
    if source is None:
        return Reject("no tensor metadata")
    rank = source.dim()
    if _dim(found["dim"], rank) != _dim(found["inner_dim"], rank):
        return Reject(f"dim {found['dim']} is not the unsqueezed dim {found['inner_dim']}")
    if node.target == aten.select.int and node.args[2] not in (0, -1):
        return Reject(f"selects index {node.args[2]} of a size-1 dim")
    return True


def _bypass(found: Match) -> None:
    replace_with(found.root, found["x"])


def _erase(found: Match) -> None:
    found.root.graph.erase_node(found.root)


RULES = (
    NodeRule(
        "noop_cast", op((aten.to.dtype, aten._to_copy.default), Var("x")), _is_noop_cast, _bypass
    ),
    NodeRule("metadata_assert", op(aten._assert_tensor_metadata.default), accept, _erase),
    NodeRule("full_slice", op(aten.slice.Tensor, Var("x")), _is_full_slice, _bypass),
    NodeRule(
        "inverse_transpose",
        op(
            aten.transpose.int,
            op(aten.transpose.int, Var("x"), Var("inner_a"), Var("inner_b"), bind="inner"),
            Var("a"),
            Var("b"),
        ),
        _is_inverse_transpose,
        _bypass,
        candidate="inner",
    ),
    NodeRule(
        "undo_unsqueeze",
        op(
            (aten.select.int, aten.squeeze.dim),
            op(aten.unsqueeze.default, Var("x"), Var("inner_dim"), bind="unsqueezed"),
            Var("dim"),
        ),
        _is_undo_unsqueeze,
        _bypass,
        candidate="unsqueezed",
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
