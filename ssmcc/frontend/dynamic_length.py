"""Make a token program captured at a static length dynamic again, when nothing in it still
depends on that length.

A Python loop over time (a model's own scan, captured with routing off) fixes the length at
export. Once ``detect_selective_scan`` and ``detect_causal_conv1d`` have replaced the loop and the
cut convolution with ssmcc ops, the program may hold no other use of the length: then running its
graph at another length and exporting that with a symbolic ``seq`` dim succeeds, and the program
runs at any length, with prefill/step/generate like a routed capture. When some node still
depends on the captured length (an unrecognised loop, a view with the length written in), the
export fails and the program stays static; the reason is returned.
"""

from __future__ import annotations

import math

import sympy
import torch
from torch import nn
from torch.export import Dim, ExportedProgram

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def _expr(size):
    return sympy.Integer(size) if isinstance(size, int) else size.node.expr


def _product(sizes) -> sympy.Expr:
    return sympy.expand(math.prod((_expr(s) for s in sizes), start=sympy.Integer(1)))


def _generalised_sizes(node, source: torch.Tensor, sizes: list, length: int) -> list:
    """``sizes`` of a view with the captured ``length`` replaced where it is a time dim."""
    captured_in = tuple(node.args[0].meta["val"].shape)
    captured_out = tuple(node.meta["val"].shape)
    time_dims = [
        i
        for i, size in enumerate(captured_in)
        if isinstance(size, int)
        and size == length
        and not (isinstance(source.shape[i], int) and source.shape[i] == length)
    ]
    sizes = list(sizes)
    for j, size in enumerate(sizes):
        if not (isinstance(size, int) and size == length):
            continue
        before = _product(captured_out[:j])
        for i in time_dims:
            if _product(captured_in[:i]) == before:
                sizes[j] = source.shape[i]
                break
    return sizes


class _LengthFree(torch.fx.Interpreter):
    """Runs a graph captured at ``length`` at another length (see the module docstring)."""

    def __init__(self, module, length: int):
        super().__init__(module)
        self.length = length

    def run_node(self, node):
        if node.op == "call_function" and node.target in _VIEWS:
            (source, sizes), _ = self.fetch_args_kwargs_from_env(node)
            return node.target(source, _generalised_sizes(node, source, sizes, self.length))
        return super().run_node(node)


class _RunGraph(nn.Module):
    """Runs a program's graph as a plain function of ``input_ids`` (no input-shape guard)."""

    def __init__(self, program: ExportedProgram, length: int):
        super().__init__()
        self.inner = program.module(check_guards=False)
        self.length = length

    def forward(self, input_ids):
        result = _LengthFree(self.inner, self.length).run(input_ids)
        return result[0] if isinstance(result, (tuple, list)) else result


def relax_static_length(
    program: ExportedProgram, length: int, vocab_size: int
) -> tuple[ExportedProgram | None, str]:
    """``(program with a dynamic seq dim, "")``, or ``(None, why it stays static)``."""
    example = torch.randint(0, vocab_size, (2, length + 3))  # a length it was not captured at
    shapes = {"input_ids": {0: Dim("batch", min=1), 1: Dim("seq", min=1)}}
    try:
        relaxed = torch.export.export(
            _RunGraph(program, length), (example,), dynamic_shapes=shapes, strict=False
        )
    except Exception as error:  # torch.export's own exception types
        text = str(error).strip()
        return None, f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    return relaxed, ""
