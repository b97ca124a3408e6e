"""The C++ kernels as Python callables with the ssmcc op signatures (ctypes over raw pointers).

Each function checks its arguments with the op's own shape rules, makes float32 contiguous
copies where needed, allocates the outputs and calls the kernel with ``torch.get_num_threads()``
OpenMP threads. Outputs follow the op contract: ``out`` in the input's dtype, states float32.
Every size passed to C++ is read from the tensor it describes, and the C++ entry points check
the sizes against their input contract (``contracts.h``) again: a violation raises
``RuntimeError`` with the kernel's message instead of reaching memory.
"""

from __future__ import annotations

import torch

import ssmcc.kernels.cpu.mixer_binding  # noqa: F401 (registers its bindings)
import ssmcc.kernels.cpu.moe_binding  # noqa: F401 (registers its bindings)
import ssmcc.kernels.cpu.quantized_binding  # noqa: F401 (registers its bindings)
import ssmcc.kernels.cpu.ssd_binding  # noqa: F401 (registers its bindings)
from ssmcc.kernels.cpu.cpp_kernels import checked_kernels, cpp_kernel, verified_kernels
from ssmcc.kernels.cpu.native import as_f32, available, call_kernel, library, pointer  # noqa: F401
from ssmcc.ops.activations import activation_code
from ssmcc.ops.causal_conv1d import check_causal_conv1d_args, check_causal_conv1d_update_args
from ssmcc.ops.selective_scan import check_selective_scan_args
from ssmcc.ops.selective_state_update import check_selective_state_update_args


@cpp_kernel("selective_scan")
def selective_scan_cpu(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_selective_scan_args(u, delta, A, B, C, D, z, delta_bias, initial_state)
    return _selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)


@cpp_kernel("selective_scan", verified=True)
def _selective_scan(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    batch, dim, length = u.shape
    B4 = B if B.dim() == 4 else B.unsqueeze(1)
    C4 = C if C.dim() == 4 else C.unsqueeze(1)
    args = [as_f32(t) for t in (u, delta, A, B4, C4, D, z, delta_bias, initial_state)]
    out = torch.empty(batch, dim, length, dtype=torch.float32)
    last = torch.empty(batch, dim, A.shape[1], dtype=torch.float32)
    call_kernel(
        "ssmcc_selective_scan_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        last.data_ptr(),
        batch,
        dim,
        length,
        B4.shape[1],
        C4.shape[1],
        A.shape[1],
        int(bool(delta_softplus)),
        torch.get_num_threads(),
    )
    return out.to(u.dtype), last


@cpp_kernel("causal_conv1d")
def causal_conv1d_cpu(x, weight, bias=None, initial_state=None, activation=None):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_causal_conv1d_args(x, weight, bias, initial_state)
    return _causal_conv1d(x, weight, bias, initial_state, activation)


@cpp_kernel("causal_conv1d", verified=True)
def _causal_conv1d(x, weight, bias=None, initial_state=None, activation=None):
    batch, dim, length = x.shape
    width = weight.shape[1]
    args = [as_f32(t) for t in (x, weight, bias, initial_state)]
    out = torch.empty(batch, dim, length, dtype=torch.float32)
    final = torch.empty(batch, dim, width - 1, dtype=torch.float32)
    call_kernel(
        "ssmcc_causal_conv1d_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        final.data_ptr(),
        batch,
        dim,
        length,
        width,
        activation_code("causal_conv1d", activation),
        torch.get_num_threads(),
    )
    return out.to(x.dtype), final


@cpp_kernel("selective_state_update")
def selective_state_update_cpu(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_selective_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    return _selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)


@cpp_kernel("selective_state_update", verified=True)
def _selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False):
    batch, dim, n = state.shape
    B3 = B if B.dim() == 3 else B.unsqueeze(1)
    C3 = C if C.dim() == 3 else C.unsqueeze(1)
    args = [as_f32(t) for t in (state, x, dt, A, B3, C3, D, z, dt_bias)]
    out = torch.empty(batch, dim, dtype=torch.float32)
    new_state = torch.empty(batch, dim, n, dtype=torch.float32)
    call_kernel(
        "ssmcc_selective_state_update_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        new_state.data_ptr(),
        batch,
        dim,
        B3.shape[1],
        C3.shape[1],
        n,
        int(bool(dt_softplus)),
        torch.get_num_threads(),
    )
    return out.to(x.dtype), new_state


@cpp_kernel("causal_conv1d_update")
def causal_conv1d_update_cpu(x, conv_state, weight, bias=None, activation=None):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_causal_conv1d_update_args(x, conv_state, weight, bias)
    return _causal_conv1d_update(x, conv_state, weight, bias, activation)


@cpp_kernel("causal_conv1d_update", verified=True)
def _causal_conv1d_update(x, conv_state, weight, bias=None, activation=None):
    batch, dim = x.shape
    args = [as_f32(t) for t in (x, conv_state, weight, bias)]
    out = torch.empty(batch, dim, dtype=torch.float32)
    new_state = torch.empty_like(args[1])
    call_kernel(
        "ssmcc_causal_conv1d_update_f32",
        *[pointer(t) for t in args],
        out.data_ptr(),
        new_state.data_ptr(),
        batch,
        dim,
        weight.shape[1],
        activation_code("causal_conv1d_update", activation),
        torch.get_num_threads(),
    )
    return out.to(x.dtype), new_state


# op -> binding, read from the registrations of this module and the binding modules it imports
KERNELS = checked_kernels()  # with the op's argument checks
VERIFIED_PROGRAM_KERNELS = verified_kernels()  # without: the IR verifier checked the program
