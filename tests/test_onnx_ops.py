"""Each ssmcc ONNX op alone, portable body and ORT kernel, against the reference ops on odd
shapes (grouped B/C, optional inputs absent or present, length 1, 7, 119)."""

from __future__ import annotations

import pytest
import torch

import ssmcc

from .test_ops_reference import scan_case

SCAN_TOL = dict(rtol=6e-4, atol=2e-3)


class Scan(torch.nn.Module):
    def __init__(self, softplus: bool, with_z: bool):
        super().__init__()
        self.softplus, self.with_z = softplus, with_z

    def forward(self, u, delta, A, B, C, D, z, delta_bias, h0):
        return torch.ops.ssmcc.selective_scan(
            u, delta, A, B, C, D, z if self.with_z else None, delta_bias, self.softplus, h0
        )


class Step(torch.nn.Module):
    def forward(self, state, x, dt, A, B, C, D, z, dt_bias):
        return torch.ops.ssmcc.selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("length", [1, 7, 119])
@pytest.mark.parametrize("dim,n,groups", [(13, 5, None), (12, 4, 3)])
@pytest.mark.parametrize("softplus,with_z", [(True, True), (False, False)])
def test_selective_scan_node(kernels, length, dim, n, groups, softplus, with_z):
    case = scan_case(2, dim, n, length, groups, True, True, True, True, seed=length)
    args = tuple(
        case[k] for k in ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    )
    compiled = ssmcc.compile(
        Scan(softplus, with_z), target="onnx", example_inputs=args, kernels=kernels
    )
    out, last = compiled(*args)
    expected = ssmcc.ops.selective_scan_ref(
        *args[:6], args[6] if with_z else None, args[7], softplus, args[8]
    )
    torch.testing.assert_close(torch.as_tensor(out), expected[0], **SCAN_TOL)
    torch.testing.assert_close(torch.as_tensor(last), expected[1], **SCAN_TOL)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("groups", [None, 3])
def test_selective_state_update_node(kernels, groups):
    case = scan_case(3, 12, 4, 1, groups, True, True, True, True, seed=3)
    at0 = lambda t: t[..., 0]  # noqa: E731
    args = (
        case["initial_state"],
        at0(case["u"]),
        at0(case["delta"]),
        case["A"],
        at0(case["B"]),
        at0(case["C"]),
        case["D"],
        at0(case["z"]),
        case["delta_bias"],
    )
    compiled = ssmcc.compile(Step(), target="onnx", example_inputs=args, kernels=kernels)
    got = compiled(*args)
    expected = ssmcc.ops.selective_state_update_ref(*args, dt_softplus=True)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(torch.as_tensor(g), e, rtol=3e-4, atol=1e-3)
