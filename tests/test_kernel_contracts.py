"""Kernel input contracts: B and C grouped independently on every path, and inputs that break a
kernel's contract refused with the op, the input and the shapes named -- never a crash.

Tolerances: FACTS.md fp32 (scan rtol 6e-4 / atol 2e-3; state update 3e-4 / 1e-3).
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
import torch

import ssmcc
from ssmcc.kernels.cpu import torch_binding
from ssmcc.kernels.cpu.registration import CALLS
from ssmcc.ops import selective_scan_ref, selective_state_update_ref

from . import fuzzing

SCAN_TOL = dict(rtol=6e-4, atol=2e-3)
STEP_TOL = dict(rtol=3e-4, atol=1e-3)
# (B groups, C groups) for dim 12: None = shared (rank 3), else the group count.
MIXES = [(1, 2), (None, 4), (12, None), (3, 4), (6, 12), (2, None)]


def _scan_args(groups_b, groups_c, length=9, dim=12, n=5, batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    bc = lambda k: (batch, n, length) if k is None else (batch, k, n, length)  # noqa: E731
    return dict(
        u=r(batch, dim, length),
        delta=r(batch, dim, length),
        A=-torch.rand(dim, n, generator=g) - 0.1,
        B=r(*bc(groups_b)),
        C=r(*bc(groups_c)),
        D=r(dim),
        z=r(batch, dim, length),
        delta_bias=r(dim) * 0.3,
        delta_softplus=True,
        initial_state=r(batch, dim, n),
    )


def _oracle(args):
    case = fuzzing.Case("selective_scan", 0, args, torch.float32)
    return fuzzing.oracle(case)


@pytest.mark.parametrize("groups_b,groups_c", MIXES)
def test_mixed_groups_scan_on_reference_kernel_and_eager_op(groups_b, groups_c):
    args = _scan_args(groups_b, groups_c)
    expected = _oracle(args)
    before = CALLS["selective_scan", "cpp"]
    for got in (
        selective_scan_ref(**args),
        torch_binding.selective_scan_cpu(**args),
        torch.ops.ssmcc.selective_scan(**args),  # dispatches to the C++ kernel
    ):
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g.double(), e, **SCAN_TOL)
    assert CALLS["selective_scan", "cpp"] == before + 1


@pytest.mark.parametrize("groups_b,groups_c", MIXES)
def test_mixed_groups_state_update(groups_b, groups_c):
    scan = _scan_args(groups_b, groups_c, length=1)
    at0 = lambda t: t[..., 0]  # noqa: E731
    args = dict(
        state=scan["initial_state"],
        x=at0(scan["u"]),
        dt=at0(scan["delta"]),
        A=scan["A"],
        B=at0(scan["B"]),
        C=at0(scan["C"]),
        D=scan["D"],
        z=at0(scan["z"]),
        dt_bias=scan["delta_bias"],
        dt_softplus=True,
    )
    expected = fuzzing.oracle(fuzzing.Case("selective_state_update", 0, args, torch.float32))
    for got in (
        selective_state_update_ref(**args),
        torch_binding.selective_state_update_cpu(**args),
    ):
        for g, e in zip(got, expected, strict=True):
            torch.testing.assert_close(g.double(), e, **STEP_TOL)


class MixedScan(torch.nn.Module):
    def forward(self, u, delta, A, B, C, D, z, delta_bias, initial_state):
        return torch.ops.ssmcc.selective_scan(
            u, delta, A, B, C, D, z, delta_bias, True, initial_state
        )


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("groups_b,groups_c", [(1, 2), (12, None), (3, 4)])
def test_mixed_groups_on_the_onnx_target(groups_b, groups_c, kernels):
    """The emitter brings B and C to one group count: the ORT library and the portable body both
    match the oracle (before this, 2 of 3 mixes failed in Reshape/MatMul)."""
    args = _scan_args(groups_b, groups_c)
    inputs = tuple(v for k, v in args.items() if k != "delta_softplus")
    compiled = ssmcc.compile(MixedScan(), target="onnx", example_inputs=inputs, kernels=kernels)
    for g, e in zip(compiled(*inputs), _oracle(args), strict=True):
        torch.testing.assert_close(torch.as_tensor(g).double(), e, **SCAN_TOL)


def test_per_channel_B_with_shared_C_at_full_size():
    """The shape that segfaulted: B (1, 1024, 16, L) per channel, C (1, 16, L) shared."""
    args = _scan_args(1024, None, length=256, dim=1024, n=16, batch=1)
    expected = selective_scan_ref(**args)
    got = torch_binding.selective_scan_cpu(**args)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, **SCAN_TOL)


def test_cpp_entry_refuses_sizes_outside_its_contract():
    """Called with sizes no tensor could have (3 groups for 8 channels): an error, no access."""
    lib = torch_binding.library()
    null = ctypes.c_void_p()
    code = lib.ssmcc_selective_scan_f32(*[null] * 11, 1, 8, 4, 3, 1, 2, 0, 1)
    assert code == 1
    assert lib.ssmcc_last_error() == b"selective_scan: B has 3 groups, which does not divide dim=8"
    code = lib.ssmcc_causal_conv1d_f32(*[null] * 6, 1, 4, 4, 0, 0, 1)
    assert code == 1 and b"kernel width is 0" in lib.ssmcc_last_error()


def test_the_checked_entry_names_the_argument():
    args = _scan_args(None, None)
    args["C"] = args["C"][..., :-1]
    with pytest.raises(RuntimeError, match="ssmcc.selective_scan: C has length 8, expected 9"):
        torch_binding.selective_scan_cpu(**args)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda f: f.update(C=np.ascontiguousarray(f["C"][:, :, :, :-1])), "C must have shape"),
        (lambda f: f.update(B=np.ascontiguousarray(f["B"][:, :, :-1])), "B must have shape"),
        (lambda f: f.update(D=np.zeros(3, np.float32)), "D must have shape"),
        (lambda f: f.update(initial_state=f["initial_state"][:1].copy()), "initial_state must"),
        (lambda f: f.update(A=np.zeros((12, 4), np.float32)), "B must have shape"),
    ],
)
def test_ort_kernel_refuses_inconsistent_shapes(change, message):
    """ORT checks only element types: the ssmcc kernel checks shapes and fails the run."""
    case = fuzzing.Case("selective_scan", 0, _scan_args(3, 3), torch.float32)
    feed, attrs = fuzzing.node_form(case)
    change(feed)
    session = fuzzing.session_for("selective_scan", feed, attrs, library=True)
    with pytest.raises(Exception, match=f"ssmcc.SelectiveScan: {message}"):
        session.run(None, feed)


def test_ort_kernel_refuses_groups_that_do_not_divide_dim():
    state = np.zeros((1, 8, 4), np.float32)
    feed = dict(
        state=state,
        x=np.zeros((1, 8), np.float32),
        dt=np.zeros((1, 8), np.float32),
        A=np.zeros((8, 4), np.float32),
        B=np.zeros((1, 3, 4), np.float32),
        C=np.zeros((1, 3, 4), np.float32),
        D=np.zeros(8, np.float32),
        z=np.zeros((1, 8), np.float32),
        dt_bias=np.zeros(8, np.float32),
    )
    attrs = {"dt_softplus": 1, "has_z": 1}
    session = fuzzing.session_for("selective_state_update", feed, attrs, library=True)
    with pytest.raises(Exception, match="B has 3 groups, which does not divide dim=8"):
        session.run(None, feed)


@pytest.mark.parametrize("dtype", [torch.complex64, torch.int64])
def test_non_real_inputs_are_refused(dtype):
    """Complex A used to lose its imaginary part silently."""
    args = _scan_args(None, None)
    args["A"] = args["A"].to(dtype)
    for run in (selective_scan_ref, torch_binding.selective_scan_cpu):
        with pytest.raises(RuntimeError, match=f"A must be a real floating-point tensor.*{dtype}"):
            run(**args)


def test_causal_conv1d_at_length_zero_returns_the_state_on_every_path():
    x = torch.zeros(2, 3, 0)
    weight, state = torch.randn(3, 4), torch.randn(2, 3, 3)
    for run in (ssmcc.ops.causal_conv1d_ref, torch_binding.causal_conv1d_cpu):
        out, final = run(x, weight, None, state, "silu")
        assert out.shape == (2, 3, 0)
        assert torch.equal(final, state)
