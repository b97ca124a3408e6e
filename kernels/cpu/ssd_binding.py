"""The Mamba-2 C++ kernels (``ssd_kernels.h``) as Python callables with the ssmcc op signatures.

As in ``torch_binding``: the checked entry points apply the op's own shape rules, inputs go to
the kernel as float32 contiguous tensors (``ssd_scan``'s x, dt, B, C and z as token rows: a view
into a wider projection output is read in place), ``out`` comes back in the input's dtype and
states in float32; the ``_verified`` forms skip the Python checks (the torch lowering's programs
were verified against the ops' fake implementations), the C++ contract checks still run. ``D``
of shape (h,) reaches the kernels as (h, p).
"""

from __future__ import annotations

import math

import torch

from ssmcc.kernels.cpu.cpp_kernels import cpp_kernel
from ssmcc.kernels.cpu.native import as_f32, call_kernel, pointer, token_rows
from ssmcc.ops.rmsnorm_gated import check_rmsnorm_gated_args
from ssmcc.ops.ssd_scan import check_ssd_scan_args
from ssmcc.ops.ssd_state_update import check_ssd_state_update_args


def _per_channel_D(D, heads: int, head_dim: int):
    if D is None:
        return None
    return D[:, None].expand(heads, head_dim) if D.dim() == 1 else D


@cpp_kernel("ssd_scan", verified=True)
def _ssd_scan(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
    initial_state=None,
):
    batch, length, heads, head_dim = x.shape
    groups, n = B.shape[2], B.shape[3]
    D = _per_channel_D(D, heads, head_dim)
    dtype = x.dtype
    (x, x_stride), (dt, dt_stride), (B, b_stride), (C, c_stride), (z, z_stride) = (
        token_rows(t) for t in (x, dt, B, C, z)
    )
    args = [x, dt, as_f32(A), B, C, as_f32(D), z, as_f32(dt_bias), as_f32(initial_state)]
    out = torch.empty(batch, length, heads, head_dim, dtype=torch.float32)
    final = torch.empty(batch, heads, head_dim, n, dtype=torch.float32)
    call_kernel(
        "ssmcc_ssd_scan_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        final.data_ptr(),
        batch,
        length,
        heads,
        head_dim,
        groups,
        n,
        x_stride,
        dt_stride,
        b_stride,
        c_stride,
        z_stride,
        int(bool(dt_softplus)),
        float(dt_min),
        math.inf if dt_max is None else float(dt_max),
        torch.get_num_threads(),
    )
    return out.to(dtype), final


@cpp_kernel("ssd_scan")
def ssd_scan_cpu(
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
    initial_state=None,
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_ssd_scan_args(x, dt, A, B, C, D, z, dt_bias, initial_state)
    return _ssd_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state)


@cpp_kernel("ssd_state_update", verified=True)
def _ssd_state_update(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
):
    batch, heads, head_dim, n = state.shape
    D = _per_channel_D(D, heads, head_dim)
    args = [as_f32(t) for t in (state, x, dt, A, B, C, D, z, dt_bias)]
    out = torch.empty(batch, heads, head_dim, dtype=torch.float32)
    new_state = torch.empty(batch, heads, head_dim, n, dtype=torch.float32)
    call_kernel(
        "ssmcc_ssd_state_update_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        new_state.data_ptr(),
        batch,
        heads,
        head_dim,
        B.shape[1],
        n,
        int(bool(dt_softplus)),
        float(dt_min),
        math.inf if dt_max is None else float(dt_max),
        torch.get_num_threads(),
    )
    return out.to(x.dtype), new_state


@cpp_kernel("ssd_state_update")
def ssd_state_update_cpu(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_ssd_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    return _ssd_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max)


@cpp_kernel("rmsnorm_gated", verified=True)
def _rmsnorm_gated(x, z, weight, group_size, eps=1e-6, norm_before_gate=False):
    dim = x.shape[-1]
    rows = x.numel() // dim if dim else 0
    args = [as_f32(t) for t in (x, z, weight)]
    out = torch.empty(x.shape, dtype=torch.float32)
    call_kernel(
        "ssmcc_rmsnorm_gated_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        rows,
        dim,
        int(group_size),
        float(eps),
        int(bool(norm_before_gate)),
        torch.get_num_threads(),
    )
    return out.to(x.dtype)


@cpp_kernel("rmsnorm_gated")
def rmsnorm_gated_cpu(x, z, weight, group_size, eps=1e-6, norm_before_gate=False):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_rmsnorm_gated_args(x, z, weight, group_size)
    return _rmsnorm_gated(x, z, weight, group_size, eps, norm_before_gate)
