"""The reference ops against an independent float64 step-by-step recurrence (NumPy, plain loops).

Tolerances: FACTS.md / mamba_ssm's fp32 ones (scan rtol 6e-4 atol 2e-3, state update rtol 3e-4
atol 1e-3); the float32 references are in practice far closer.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from ssmcc.ops import (
    causal_conv1d_ref,
    causal_conv1d_update_ref,
    selective_scan_ref,
    selective_state_update_ref,
)

SCAN_TOL = dict(rtol=6e-4, atol=2e-3)
STEP_TOL = dict(rtol=3e-4, atol=1e-3)


def softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


def silu(x):
    return x / (1 + np.exp(-x))


def scan_loops(u, delta, A, B, C, D, z, delta_bias, softplus_on, h0):
    """h_t = exp(dt A) h + dt B u, y = C.h + D u, * silu(z): every index an explicit loop."""
    u, delta, A, B, C = (np.asarray(t, dtype=np.float64) for t in (u, delta, A, B, C))
    batch, dim, length = u.shape
    n = A.shape[1]
    out = np.zeros((batch, dim, length))
    last = np.zeros((batch, dim, n))
    for b, c in itertools.product(range(batch), range(dim)):
        h = np.zeros(n) if h0 is None else np.asarray(h0[b, c], dtype=np.float64).copy()
        group = c // (dim // B.shape[1]) if B.ndim == 4 else None
        for t in range(length):
            dt = delta[b, c, t] + (0.0 if delta_bias is None else float(delta_bias[c]))
            dt = softplus(dt) if softplus_on else dt
            Bt = B[b, group, :, t] if group is not None else B[b, :, t]
            Ct = C[b, group, :, t] if group is not None else C[b, :, t]
            for i in range(n):
                h[i] = np.exp(dt * A[c, i]) * h[i] + dt * Bt[i] * u[b, c, t]
            y = float(np.dot(Ct, h)) + (0.0 if D is None else float(D[c]) * u[b, c, t])
            if z is not None:
                y *= silu(float(z[b, c, t]))
            out[b, c, t] = y
        last[b, c] = h
    return out, last


def scan_case(batch, dim, n, length, groups, with_D, with_z, with_bias, with_h0, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    bc_shape = (batch, groups, n, length) if groups else (batch, n, length)
    return dict(
        u=r(batch, dim, length),
        delta=r(batch, dim, length).abs() * 0.5,  # dt >= 0 even without softplus: decay <= 1
        A=-torch.rand(dim, n, generator=g) * 2,
        B=r(*bc_shape),
        C=r(*bc_shape),
        D=r(dim) if with_D else None,
        z=r(batch, dim, length) if with_z else None,
        delta_bias=torch.rand(dim, generator=g) * 0.3 if with_bias else None,
        initial_state=r(batch, dim, n) if with_h0 else None,
    )


@pytest.mark.parametrize("length", [1, 7, 119])
@pytest.mark.parametrize("dim,n,groups", [(5, 3, None), (13, 4, None), (6, 2, 3), (12, 5, 1)])
@pytest.mark.parametrize("optional", ["none", "all", "D_z", "bias_h0"])
def test_selective_scan_matches_loops(length, dim, n, groups, optional):
    flags = {
        "none": (False, False, False, False),
        "all": (True, True, True, True),
        "D_z": (True, True, False, False),
        "bias_h0": (False, False, True, True),
    }[optional]
    case = scan_case(2, dim, n, length, groups, *flags)
    for softplus_on in (False, True):
        out, last = selective_scan_ref(**case, delta_softplus=softplus_on)
        exp_out, exp_last = scan_loops(
            case["u"],
            case["delta"],
            case["A"],
            case["B"],
            case["C"],
            case["D"],
            case["z"],
            case["delta_bias"],
            softplus_on,
            case["initial_state"],
        )
        np.testing.assert_allclose(out.numpy(), exp_out, **SCAN_TOL)
        np.testing.assert_allclose(last.numpy(), exp_last, **SCAN_TOL)
        assert out.dtype == torch.float32 and last.dtype == torch.float32


def test_selective_scan_state_carries_across_splits():
    """scan(x) == scan(x[:k]) then scan(x[k:], initial_state=last): the chunking identity."""
    case = scan_case(2, 7, 3, 23, None, True, True, True, True, seed=3)
    full, full_last = selective_scan_ref(**case, delta_softplus=True)
    k = 9
    head = {
        key: (v[..., :k] if key in "u delta B C z" and v is not None else v)
        for key, v in case.items()
    }
    tail = {
        key: (v[..., k:] if key in "u delta B C z" and v is not None else v)
        for key, v in case.items()
    }
    out1, mid = selective_scan_ref(**head, delta_softplus=True)
    tail["initial_state"] = mid
    out2, last = selective_scan_ref(**tail, delta_softplus=True)
    torch.testing.assert_close(torch.cat([out1, out2], -1), full, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(last, full_last, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_selective_scan_low_precision_keeps_dtype(dtype):
    case = scan_case(1, 5, 3, 7, None, True, True, True, False)
    low = {
        k: (v.to(dtype) if v is not None and k in ("u", "delta", "z") else v)
        for k, v in case.items()
    }
    out, last = selective_scan_ref(**low, delta_softplus=True)
    ref, _ = selective_scan_ref(
        **{
            k: (v.to(dtype).float() if v is not None and k in ("u", "delta", "z") else v)
            for k, v in case.items()
        },
        delta_softplus=True,
    )
    assert out.dtype == dtype and last.dtype == torch.float32
    tol = {torch.float16: (3e-3, 5e-3), torch.bfloat16: (3e-2, 5e-2)}[dtype]
    torch.testing.assert_close(out.float(), ref, rtol=tol[0], atol=tol[1])


@pytest.mark.parametrize("groups", [None, 1, 3])
@pytest.mark.parametrize("with_extras", [False, True])
def test_state_update_is_one_scan_step(groups, with_extras):
    """selective_state_update equals the loop recurrence at length 1 from the given state."""
    case = scan_case(3, 6, 4, 1, groups, with_extras, with_extras, with_extras, True, seed=5)
    sq = lambda t: None if t is None else t[..., 0]  # noqa: E731
    out, new_state = selective_state_update_ref(
        case["initial_state"],
        sq(case["u"]),
        sq(case["delta"]),
        case["A"],
        sq(case["B"]),
        sq(case["C"]),
        case["D"],
        sq(case["z"]),
        case["delta_bias"],
        dt_softplus=True,
    )
    exp_out, exp_last = scan_loops(
        case["u"],
        case["delta"],
        case["A"],
        case["B"],
        case["C"],
        case["D"],
        case["z"],
        case["delta_bias"],
        True,
        case["initial_state"],
    )
    np.testing.assert_allclose(out.numpy(), exp_out[..., 0], **STEP_TOL)
    np.testing.assert_allclose(new_state.numpy(), exp_last, **STEP_TOL)


def conv_loops(x, weight, bias, initial, activation):
    x, weight = np.asarray(x, np.float64), np.asarray(weight, np.float64)
    batch, dim, length = x.shape
    width = weight.shape[1]
    prev = np.zeros((batch, dim, width - 1)) if initial is None else np.asarray(initial, np.float64)
    xs = np.concatenate([prev, x], axis=-1)
    out = np.zeros((batch, dim, length))
    for b, c, t in itertools.product(range(batch), range(dim), range(length)):
        acc = sum(weight[c, j] * xs[b, c, t + j] for j in range(width))
        acc += 0.0 if bias is None else float(bias[c])
        out[b, c, t] = acc
    if activation is not None:  # Hugging Face's own definition of the name
        from transformers.activations import ACT2FN

        out = ACT2FN[activation](torch.from_numpy(out)).numpy()
    return out, xs[:, :, length:]


@pytest.mark.parametrize("length", [1, 2, 7, 119])
@pytest.mark.parametrize("width", [2, 4])
@pytest.mark.parametrize(
    "with_bias,with_state,activation",
    [
        (False, False, None),
        (True, True, "silu"),
        (True, False, "silu"),
        (True, True, "gelu"),
        (False, True, "gelu_new"),
        (True, False, "gelu_fast"),
        (True, True, "relu"),
        (False, False, "relu2"),
    ],
)
def test_causal_conv1d_matches_loops(length, width, with_bias, with_state, activation):
    g = torch.Generator().manual_seed(length * 10 + width)
    x = torch.randn(2, 5, length, generator=g)
    weight = torch.randn(5, width, generator=g)
    bias = torch.randn(5, generator=g) if with_bias else None
    state = torch.randn(2, 5, width - 1, generator=g) if with_state else None
    out, final = causal_conv1d_ref(x, weight, bias, state, activation)
    exp_out, exp_final = conv_loops(x, weight, bias, state, activation)
    np.testing.assert_allclose(out.numpy(), exp_out, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(final.numpy(), exp_final, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_pytorch_tanh", "relu2"])
def test_conv_update_chain_equals_full_conv(activation):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, 12, generator=g)
    weight, bias = torch.randn(7, 4, generator=g), torch.randn(7, generator=g)
    full, full_state = causal_conv1d_ref(x, weight, bias, None, activation)
    out, state = causal_conv1d_ref(x[..., :5], weight, bias, None, activation)
    steps = [out]
    for t in range(5, 12):
        y, state = causal_conv1d_update_ref(x[..., t], state, weight, bias, activation)
        steps.append(y[..., None])
    torch.testing.assert_close(torch.cat(steps, -1), full, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(state, full_state)


@pytest.mark.parametrize(
    "mutate,message",
    [
        (lambda c: c.update(A=c["A"][:-1]), "A has 4 rows, expected dim=5"),
        (lambda c: c.update(B=c["B"][..., :-1]), "B has length 6, expected 7"),
        (lambda c: c.update(D=torch.ones(3)), "D has length 3, expected dim=5"),
        (lambda c: c.update(initial_state=torch.zeros(1, 5, 2)), "initial_state must have shape"),
        (lambda c: c.update(u=c["u"][0]), "u must have shape (batch, dim, length)"),
    ],
)
def test_selective_scan_rejects_bad_shapes_by_name(mutate, message):
    case = scan_case(1, 5, 3, 7, None, True, True, True, True)
    mutate(case)
    with pytest.raises(
        RuntimeError,
        match="ssmcc.selective_scan: " + message.replace("(", r"\(").replace(")", r"\)"),
    ):
        torch.ops.ssmcc.selective_scan(**case)


def test_conv_rejects_unknown_activation():
    with pytest.raises(RuntimeError, match="causal_conv1d: activation 'mish' is not supported"):
        torch.ops.ssmcc.causal_conv1d(torch.zeros(1, 2, 3), torch.zeros(2, 4), None, None, "mish")
