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

import torch
from torch import nn
from torch.export import Dim, ExportedProgram


class _RunGraph(nn.Module):
    """Runs a program's graph as a plain function of ``input_ids`` (no input-shape guard)."""

    def __init__(self, program: ExportedProgram):
        super().__init__()
        self.inner = program.module(check_guards=False)

    def forward(self, input_ids):
        result = torch.fx.Interpreter(self.inner).run(input_ids)
        return result[0] if isinstance(result, (tuple, list)) else result


def relax_static_length(
    program: ExportedProgram, length: int, vocab_size: int
) -> tuple[ExportedProgram | None, str]:
    """``(program with a dynamic seq dim, "")``, or ``(None, why it stays static)``."""
    example = torch.randint(0, vocab_size, (2, length + 3))  # a length it was not captured at
    shapes = {"input_ids": {0: Dim("batch", min=1), 1: Dim("seq", min=1)}}
    try:
        relaxed = torch.export.export(
            _RunGraph(program), (example,), dynamic_shapes=shapes, strict=False
        )
    except Exception as error:  # torch.export's own exception types
        text = str(error).strip()
        return None, f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    return relaxed, ""
