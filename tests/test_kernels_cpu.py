"""The C++ CPU kernels (torch binding) against the reference ops, at FACTS.md's fp32 tolerances
(scan rtol 6e-4 atol 2e-3; state update rtol 3e-4 atol 1e-3), on odd shapes."""

from __future__ import annotations

import pytest
import torch

from ssmcc.kernels.cpu import torch_binding
from ssmcc.ops import (
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    selective_scan_ref,
    selective_state_update_ref,
)

from .test_ops_reference import scan_case

pytestmark = pytest.mark.skipif(
    not torch_binding.available(), reason="no C++ compiler: kernels cannot be built here"
)
SCAN_TOL = dict(rtol=6e-4, atol=2e-3)
STEP_TOL = dict(rtol=3e-4, atol=1e-3)


def test_kernels_build_here():
    """On our machines (and CI) g++ is present: the kernels must build, not silently skip."""
    assert torch_binding.available()


@pytest.mark.parametrize("length", [1, 7, 119])
@pytest.mark.parametrize("dim,n,groups", [(5, 3, None), (13, 16, None), (6, 2, 3), (12, 5, 1)])
@pytest.mark.parametrize("optional", ["none", "all", "D_z", "bias_h0"])
@pytest.mark.parametrize("softplus", [False, True])
def test_selective_scan_kernel(length, dim, n, groups, optional, softplus):
    flags = {
        "none": (0, 0, 0, 0),
        "all": (1, 1, 1, 1),
        "D_z": (1, 1, 0, 0),
        "bias_h0": (0, 0, 1, 1),
    }[optional]
    case = scan_case(3, dim, n, length, groups, *map(bool, flags), seed=length + dim)
    got = torch_binding.selective_scan_cpu(**case, delta_softplus=softplus)
    expected = selective_scan_ref(**case, delta_softplus=softplus)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **SCAN_TOL)


def test_selective_scan_kernel_softplus_threshold_and_bf16():
    """dt above 20 takes softplus's identity branch; bf16 inputs give bf16 out, f32 state."""
    case = scan_case(1, 9, 4, 33, None, True, True, True, False, seed=2)
    case["delta"] = case["delta"] * 30 - 5  # spans both sides of the threshold
    got = torch_binding.selective_scan_cpu(**case, delta_softplus=True)
    expected = selective_scan_ref(**case, delta_softplus=True)
    torch.testing.assert_close(got[0], expected[0], **SCAN_TOL)
    low = {k: (v.bfloat16() if k in ("u", "delta", "z") else v) for k, v in case.items()}
    out, last = torch_binding.selective_scan_cpu(**low, delta_softplus=True)
    ref_out, _ = selective_scan_ref(**low, delta_softplus=True)
    assert out.dtype == torch.bfloat16 and last.dtype == torch.float32
    torch.testing.assert_close(out.float(), ref_out.float(), rtol=3e-2, atol=5e-2)


@pytest.mark.parametrize("length", [1, 2, 3, 7, 119])
@pytest.mark.parametrize("width", [1, 2, 4])
@pytest.mark.parametrize(
    "with_bias,with_state,activation",
    [
        (False, False, None),
        (True, True, "silu"),
        (True, False, "swish"),
        (True, True, "gelu"),
        (False, True, "gelu_pytorch_tanh"),
        (True, False, "relu2"),
    ],
)
def test_causal_conv1d_kernel(length, width, with_bias, with_state, activation):
    g = torch.Generator().manual_seed(length * 7 + width)
    x = torch.randn(2, 13, length, generator=g)
    weight = torch.randn(13, width, generator=g)
    bias = torch.randn(13, generator=g) if with_bias else None
    state = torch.randn(2, 13, width - 1, generator=g) if with_state else None
    got = torch_binding.causal_conv1d_cpu(x, weight, bias, state, activation)
    expected = causal_conv1d_ref(x, weight, bias, state, activation)
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("groups", [None, 1, 3])
@pytest.mark.parametrize("extras", [False, True])
def test_state_update_kernel(groups, extras):
    case = scan_case(3, 6, 5, 1, groups, extras, extras, extras, True, seed=9)
    sq = lambda t: None if t is None else t[..., 0]  # noqa: E731
    args = (
        case["initial_state"],
        sq(case["u"]),
        sq(case["delta"]),
        case["A"],
        sq(case["B"]),
        sq(case["C"]),
        case["D"],
        sq(case["z"]),
        case["delta_bias"],
        True,
    )
    for a, b in zip(
        torch_binding.selective_state_update_cpu(*args),
        selective_state_update_ref(*args),
        strict=True,
    ):
        torch.testing.assert_close(a, b, **STEP_TOL)


@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_new", "relu"])
def test_conv_update_kernel(width, activation):
    g = torch.Generator().manual_seed(width)
    x, state = torch.randn(3, 7, generator=g), torch.randn(3, 7, width - 1, generator=g)
    weight, bias = torch.randn(7, width, generator=g), torch.randn(7, generator=g)
    for a, b in zip(
        torch_binding.causal_conv1d_update_cpu(x, state, weight, bias, activation),
        causal_conv1d_update_ref(x, state, weight, bias, activation),
        strict=True,
    ):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_kernel_rejects_bad_shapes_with_the_ops_message():
    case = scan_case(1, 5, 3, 7, None, True, True, True, True)
    case["D"] = torch.ones(4)
    with pytest.raises(RuntimeError, match="ssmcc.selective_scan: D has length 4, expected dim=5"):
        torch_binding.selective_scan_cpu(**case)


@pytest.mark.parametrize("op", ["selective_scan", "causal_conv1d"])
def test_eager_op_calls_run_the_cpp_kernel(op):
    """torch.ops.ssmcc.* called eagerly on CPU tensors reaches the C++ kernel (registered with
    torch.library), with the op's own results."""
    from ssmcc.kernels.cpu.registration import CALLS

    if op == "selective_scan":
        case = scan_case(2, 6, 4, 19, 3, True, True, True, True, seed=5)
        args, reference = case, selective_scan_ref
    else:
        args = {"x": torch.randn(2, 6, 19), "weight": torch.randn(6, 4), "activation": "silu"}
        reference = causal_conv1d_ref
    before = dict(CALLS)
    got = getattr(torch.ops.ssmcc, op)(**args)
    assert CALLS[op, "cpp"] == before.get((op, "cpp"), 0) + 1
    assert CALLS[op, "reference"] == before.get((op, "reference"), 0)
    for g, e in zip(got, reference(**args), strict=True):
        torch.testing.assert_close(g, e, **SCAN_TOL)


def test_eager_op_calls_fall_back_to_the_reference_without_kernels(monkeypatch):
    from ssmcc.kernels.cpu.registration import CALLS

    monkeypatch.setattr(torch_binding, "available", lambda: False)
    case = scan_case(1, 5, 3, 7, None, False, False, False, False, seed=1)
    before = CALLS["selective_scan", "reference"]
    out, _ = torch.ops.ssmcc.selective_scan(**case)
    assert CALLS["selective_scan", "reference"] == before + 1
    torch.testing.assert_close(out, selective_scan_ref(**case)[0], rtol=0, atol=0)


def _denormals_survive() -> bool:
    return (torch.tensor([1e-38]) / 1000).item() != 0.0


@pytest.mark.slow
def test_the_kernels_leave_the_process_float_mode_alone():
    """Loading and running the kernel libraries keeps denormals in the caller's own arithmetic:
    they flush denormals only inside their calls (a library linked with -ffast-math would set
    flush-to-zero for the whole process when loaded)."""
    import ctypes

    from ssmcc.kernels.cpu.build import build_ort_library

    assert _denormals_survive()
    case = scan_case(1, 6, 4, 40, None, True, True, True, True, seed=3)
    torch_binding.selective_scan_cpu(**case, delta_softplus=True)
    library = build_ort_library()
    if library is not None:
        ctypes.CDLL(library)
    assert _denormals_survive()
