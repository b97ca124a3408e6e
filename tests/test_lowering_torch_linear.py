"""The torch target's linear layers (``lowering/torch/linear.py``): ssmcc's matrix-vector kernel
for a few rows (decode), oneDNN for more, against ``aten.linear`` (fp32: rtol 1e-5 relative to
the output scale), on odd shapes; routed at lowering only, and not with ``kernels="reference"``."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.kernels.cpu import native
from ssmcc.kernels.cpu.linear_binding import GEMV_MAX_ROWS, linear_cpu
from ssmcc.lowering.torch import linear as routing

from .conftest import make_hf_model

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler here")


def _close(got, expected):
    scale = expected.abs().max().clamp(min=1.0)
    assert (got - expected).abs().max() <= 1e-5 * scale * expected.shape[-1] ** 0.5


@pytest.mark.parametrize("rows", [1, 3, 4, GEMV_MAX_ROWS])  # 3-row tiles, with 1 or 2 left over
@pytest.mark.parametrize("out_features,in_features", [(1, 1), (7, 5), (50, 19), (9, 64), (33, 768)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_gemv_kernel_matches_aten(rows, out_features, in_features, with_bias):
    g = torch.Generator().manual_seed(rows * 1000 + out_features)
    x = torch.randn(rows, in_features, generator=g)
    weight = torch.randn(out_features, in_features, generator=g)
    bias = torch.randn(out_features, generator=g) if with_bias else None
    _close(linear_cpu(x, weight, bias), torch.nn.functional.linear(x, weight, bias))


def test_gemv_kernel_takes_leading_dims_and_strided_inputs():
    x = torch.randn(2, 1, 40)[..., ::2]  # (2, 1, 20), strided: copied first
    weight = torch.randn(11, 20)
    got = linear_cpu(x, weight)
    assert got.shape == (2, 1, 11)
    _close(got, torch.nn.functional.linear(x, weight))


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("rows", [0, 1, 5])
def test_gemv_kernel_of_no_input_features_is_the_bias(rows, with_bias):
    """``in_features == 0``: an empty sum, so the bias alone (or zeros), never unwritten memory."""
    x, weight = torch.randn(2, rows, 0), torch.randn(6, 0)
    bias = torch.randn(6) if with_bias else None
    expected = torch.nn.functional.linear(x, weight, bias)
    for _ in range(3):  # fresh allocations that would hold garbage
        assert torch.equal(linear_cpu(x, weight, bias), expected)


@pytest.mark.parametrize("rows", [1, GEMV_MAX_ROWS + 1, 300])
def test_dispatch_matches_aten_at_every_size(rows):
    x, weight, bias = torch.randn(1, rows, 48), torch.randn(30, 48), torch.randn(30)
    _close(routing.linear_cpu(x, weight, bias), torch.nn.functional.linear(x, weight, bias))


@pytest.mark.parametrize("kernels,routed", [("auto", True), ("reference", False)])
def test_lowering_routes_the_linears(kernels, routed):
    model = make_hf_model("mamba2", num_hidden_layers=2)
    compiled = ssmcc.compile(model, "torch", kernels=kernels)
    ids = torch.randint(0, 101, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    assert (torch.as_tensor(compiled(ids)) - expected).abs().max() <= 1e-4
    module = compiled.executable.module("prefill")
    targets = [n.target for n in module.graph.nodes if n.op == "call_function"]
    assert (routing.linear_cpu in targets) == routed
    assert (torch.ops.aten.linear.default in targets) == (not routed)
