"""Triton's interpreter running the scans' kernels: ``runtime.scans_by_slices`` against Triton's
own element-by-element ``tl.associative_scan``."""

from __future__ import annotations

import contextlib

import pytest
import torch

triton = pytest.importorskip(
    "triton", reason='Triton is an optional extra: pip install ".[triton]"'
)
import triton.language as tl  # noqa: E402

from ssmcc.kernels.triton import runtime  # noqa: E402


@triton.jit
def _first_order(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _scan_probe_kernel(a_ptr, b_ptr, out_ptr, AXIS: tl.constexpr):
    i = tl.arange(0, 4)[:, None, None] * 8 + tl.arange(0, 2)[None, :, None] * 4
    offsets = i + tl.arange(0, 4)[None, None, :]
    a, b = tl.associative_scan(
        (tl.load(a_ptr + offsets), tl.load(b_ptr + offsets)), AXIS, _first_order
    )
    tl.store(out_ptr + offsets, b)


@pytest.mark.parametrize("axis", [0, 2])
def test_the_interpreter_scans_slice_by_slice_as_triton_does(monkeypatch, axis):
    """``runtime.scans_by_slices`` (the interpreter's scan one slice at a time) gives Triton's own
    element-by-element results, bit for bit, and the recurrence's."""
    g = torch.Generator().manual_seed(axis)
    a, b = torch.rand(4, 2, 4, generator=g), torch.randn(4, 2, 4, generator=g)
    by_slices, by_elements = torch.empty_like(b), torch.empty_like(b)
    runtime.launch(_scan_probe_kernel, (1,))(a, b, by_slices, AXIS=axis)
    monkeypatch.setattr(runtime, "scans_by_slices", contextlib.nullcontext)
    runtime.launch(_scan_probe_kernel, (1,))(a, b, by_elements, AXIS=axis)
    assert torch.equal(by_slices, by_elements)
    h, states = torch.zeros_like(b.select(axis, 0)), []
    for t in range(b.shape[axis]):
        h = a.select(axis, t) * h + b.select(axis, t)
        states.append(h)
    assert torch.equal(by_slices, torch.stack(states, axis))
