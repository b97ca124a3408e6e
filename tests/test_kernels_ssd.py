"""The Mamba-2 ``ssd_scan`` C++ kernel (sequential below ``kSsdChunkedFrom`` positions, SSD's block
decomposition from there: ``ssd_chunked.h``) against the float64 reference, on the torch binding
and as an ONNX Runtime node: lengths around the chunk (64) and its multiples, real head sizes (the
register tiles of ``small_gemm.h`` span 64 columns), strided views read in place. Tolerances:
FACTS.md's fp32 scan tolerances (rtol 6e-4, atol 2e-3)."""

from __future__ import annotations

import pytest
import torch

from ssmcc.kernels.cpu import ssd_binding
from ssmcc.kernels.cpu.native import available, token_rows
from ssmcc.ops import ssd_scan_ref

pytestmark = pytest.mark.skipif(not available(), reason="no C++ compiler: no kernels here")
TOL = dict(rtol=6e-4, atol=2e-3)


def ssd_case(batch, length, heads, head_dim, groups, n, *, seed, h0=True, z=True, D_dims=1):
    g = torch.Generator().manual_seed(seed)
    rand = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    return dict(
        x=rand(batch, length, heads, head_dim),
        dt=rand(batch, length, heads),
        A=-torch.exp(0.7 * rand(heads)),
        B=rand(batch, length, groups, n),
        C=rand(batch, length, groups, n),
        D=None if D_dims == 0 else rand(heads) if D_dims == 1 else rand(heads, head_dim),
        z=rand(batch, length, heads, head_dim) if z else None,
        dt_bias=rand(heads),
        dt_softplus=True,
        initial_state=rand(batch, heads, head_dim, n) if h0 else None,
    )


def reference(case):
    wide = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    return ssd_scan_ref(**wide)


def assert_matches(got, expected):
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g.double(), e.double(), **TOL)


@pytest.mark.parametrize("length", [15, 16, 63, 64, 65, 130, 257])
@pytest.mark.parametrize(
    "heads,head_dim,groups,n", [(4, 64, 2, 128), (3, 19, 1, 7), (2, 80, 2, 16)]
)
def test_chunked_scan_matches_the_recurrence(length, heads, head_dim, groups, n):
    case = ssd_case(2, length, heads, head_dim, groups, n, seed=length + head_dim)
    assert_matches(ssd_binding.ssd_scan_cpu(**case), reference(case))


@pytest.mark.parametrize("h0,z,D_dims", [(False, False, 0), (True, False, 2), (False, True, 1)])
def test_chunked_scan_optional_inputs(h0, z, D_dims):
    case = ssd_case(1, 150, 6, 16, 3, 32, seed=7, h0=h0, z=z, D_dims=D_dims)
    assert_matches(ssd_binding.ssd_scan_cpu(**case), reference(case))


def test_dt_clamp_that_binds_in_the_chunked_form():
    case = ssd_case(2, 100, 4, 8, 2, 16, seed=3)
    got = ssd_binding.ssd_scan_cpu(**{**case, "dt_min": 0.05, "dt_max": 0.4})
    assert_matches(got, ssd_scan_ref(**{**_double(case), "dt_min": 0.05, "dt_max": 0.4}))


def _double(case):
    return {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}


def test_views_of_a_projection_output_are_read_in_place():
    """x, B, C, dt, z as slices of one (b, l, width) tensor, as a Mamba-2 mixer splits its input
    projection: the binding passes them with their token stride, no copy, same result."""
    batch, length, heads, head_dim, n = 2, 70, 4, 16, 8
    widths = [heads * head_dim, heads * head_dim, n, n, heads]
    packed = torch.randn(batch, length, sum(widths))
    z, x, B, C, dt = packed.split(widths, dim=-1)
    views = dict(
        x=x.view(batch, length, heads, head_dim),
        z=z.view(batch, length, heads, head_dim),
        B=B.view(batch, length, 1, n),
        C=C.view(batch, length, 1, n),
        dt=dt,
    )
    for name, view in views.items():
        rows, stride = token_rows(view)
        assert rows.data_ptr() == view.data_ptr(), f"{name} was copied"
        assert stride == packed.shape[-1], name
    case = dict(views, A=-torch.rand(heads) - 0.1, D=torch.randn(heads), dt_bias=torch.randn(heads))
    contiguous = {k: v.contiguous() for k, v in case.items()}
    strided_out = ssd_binding.ssd_scan_cpu(**case, dt_softplus=True)
    packed_out = ssd_binding.ssd_scan_cpu(**contiguous, dt_softplus=True)
    for a, b in zip(strided_out, packed_out, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_token_rows_copies_what_it_cannot_read_in_place():
    t = torch.randn(3, 5, 4, 2)
    assert token_rows(t) == (t, 0)
    transposed = t.transpose(0, 1)  # batches interleaved: copied
    rows, stride = token_rows(transposed)
    assert rows.data_ptr() != transposed.data_ptr() and stride == 0 and rows.is_contiguous()
    inner = t[..., :1]  # inner dims not packed: copied
    assert token_rows(inner)[0].data_ptr() != inner.data_ptr()
    half = t.to(torch.float16)
    assert token_rows(half)[0].dtype == torch.float32


def test_ort_node_runs_the_chunked_kernel():
    """The SsdScan node with the ssmcc library at a length that runs chunked."""
    from .fuzz_cases import Case
    from .fuzz_onnx import run_onnx

    case = {**ssd_case(2, 200, 4, 64, 2, 32, seed=11), "dt_min": 0.0, "dt_max": float("inf")}
    got = run_onnx(Case("ssd_scan", 0, case, torch.float32), library=True)
    assert_matches(got, reference(case))


def test_low_precision_inputs_keep_their_dtype():
    """bf16 x/z/B/C (copied to float32 for the kernel): out in bf16, the state in float32."""
    case = ssd_case(1, 80, 2, 16, 1, 8, seed=5)
    low = {k: (v.bfloat16() if k in ("x", "z", "B", "C") else v) for k, v in case.items()}
    out, state = ssd_binding.ssd_scan_cpu(**low)
    assert out.dtype == torch.bfloat16 and state.dtype == torch.float32
    expected_out, _ = ssd_scan_ref(
        **{k: (v.float() if k in ("x", "z", "B", "C") else v) for k, v in low.items()}
    )
    torch.testing.assert_close(out.float(), expected_out.float(), rtol=3e-2, atol=5e-2)
