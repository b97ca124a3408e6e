"""Capture takes every forward signature plain ``torch.export`` takes: ``*args`` (the examples it
receives passed to torch.export as one tuple in ``dynamic_shapes``), parameters left to their
defaults and keyword-only ones; the compiled module runs at other batch sizes and lengths on the
torch and ONNX targets, equal to eager within 1e-5 (fp32)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ssmcc
from ssmcc.frontend.export import auto_dynamic_shapes

TOLERANCE = 1e-5


class Varargs(nn.Module):
    """``forward(self, *xs)``: a running sum along time of the first input, gated by the last."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, *xs):
        return self.proj(torch.cumsum(xs[0], dim=1)) * torch.sigmoid(xs[-1])


class Defaults(nn.Module):
    """A parameter with a default and a keyword-only one, both left to their defaults."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, bias=None, *, scale=2.0):
        y = self.proj(x) * scale
        return y if bias is None else y + bias


def _examples(count: int, batch: int, length: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(batch * 100 + length)
    return tuple(torch.randn(batch, length, 4, generator=generator) for _ in range(count))


def test_varargs_examples_are_one_tuple_in_dynamic_shapes():
    shapes = auto_dynamic_shapes(Varargs(), _examples(2, 2, 5))
    assert list(shapes) == ["xs"] and len(shapes["xs"]) == 2
    assert auto_dynamic_shapes(Defaults(), _examples(1, 2, 5)).keys() == {"x"}


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("module,count", [(Varargs, 2), (Varargs, 3), (Defaults, 1)])
def test_signatures_capture_and_run_at_two_lengths(module, count, target):
    torch.manual_seed(0)
    model = module().eval()
    compiled = ssmcc.compile(model, target, example_inputs=_examples(count, 2, 5))
    assert len(compiled.report.capture.dynamic_dims) == count
    for batch, length in ((3, 9), (1, 2)):
        inputs = _examples(count, batch, length)
        with torch.no_grad():
            expected = model(*inputs)
        assert (torch.as_tensor(compiled(*inputs)) - expected).abs().max() <= TOLERANCE
