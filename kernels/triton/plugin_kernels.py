"""ssmcc's Triton kernels in the form a TensorRT ahead-of-time plugin launches: one kernel per
ONNX node, parameters ordered inputs, int32 sizes, outputs.

A TensorRT "quickly deployable plugin" with an AOT implementation hands its kernel exactly that:
the node's input pointers in the node's order, then the extra int32 scalars the plugin declares,
then the output pointers; floats cannot be passed at run time. The kernels of this package take
their tensors in another order, with strides, and two of them (the scan and the convolution) are
launched as more than one kernel. Each wrapper below is one ``@triton.jit`` kernel that calls an
existing kernel of this package as a device function (Triton inlines it), so the math is the
kernels' own (``selective_scan.py``, ``causal_conv1d.py``, ``state_update.py``):

    SelectiveScan       the scan's chunk kernel over one chunk = the whole sequence, started
                        from ``initial_state``: a program owns (batch, BLOCK_D channels) and walks
                        every position (no parallelism along the sequence, so no state passing)
    CausalConv1d        the convolution kernel, and in the programs of the first position block
                        also the final-state kernel (same (batch, channel block) mapping)
    SelectiveStateUpdate, CausalConv1dUpdate, RmsNormGated
                        single kernels already, strides derived from the sizes (the norm's
                        group size and eps are constants: a binary per value)

Every tensor is contiguous in the ONNX node's layout (TensorRT's linear format), so strides are
products of sizes. Each node input is present (the ONNX emitters write zeros for an absent
``D``, bias or state), so only ``has_z`` and the activation select code. Grids, per node, with
cdiv(a, b) = ceil(a / b)::

    SelectiveScan         (batch, cdiv(dim, BLOCK_D), 1)
    CausalConv1d          (batch, cdiv(dim, BLOCK_D), max(cdiv(length, BLOCK_L), 1))
    SelectiveStateUpdate  (batch, 1, cdiv(dim, BLOCK_R))
    CausalConv1dUpdate    (batch, cdiv(dim, BLOCK_D), 1)
    RmsNormGated          (rows, dim / GROUP, 1)      rows: the product of x's leading dims
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmcc.kernels.triton.causal_conv1d import (
    _causal_conv1d_final_state_kernel,
    _causal_conv1d_kernel,
    _causal_conv1d_update_kernel,
)
from ssmcc.kernels.triton.rmsnorm_gated import _rmsnorm_gated_kernel
from ssmcc.kernels.triton.selective_scan import _selective_scan_chunk_kernel
from ssmcc.kernels.triton.state_update import _state_update_kernel


@triton.jit
def trt_selective_scan_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,
    dim, length, groups, state,
    out_ptr, last_ptr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    per_group = dim // groups
    _selective_scan_chunk_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,
        out_ptr, last_ptr, last_ptr,
        dim, length, length, per_group, per_group, state,
        dim * length, length, 1, dim * length, length, 1, state, 1,
        groups * state * length, state * length, length, 1,
        groups * state * length, state * length, length, 1,
        dim * length, length, 1,
        dim * state, 0, state, 1, dim * length, length, 1, dim * state, 0, state, 1, 0, 0, 0,
        BLOCK_D, BLOCK_N, True, HAS_Z, True, SOFTPLUS, True, True, True,
    )


@triton.jit
def trt_causal_conv1d_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr,
    dim, length,
    out_ptr, final_ptr,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
    SILU: tl.constexpr,
):
    _causal_conv1d_kernel(
        x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr,
        dim, length,
        dim * length, length, 1, WIDTH, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
        dim * length, length, 1,
        WIDTH, BLOCK_D, BLOCK_L, True, True, SILU,
    )
    if tl.program_id(2) == 0:
        _causal_conv1d_final_state_kernel(
            x_ptr, state_ptr, final_ptr,
            dim, length,
            dim * length, length, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
            dim * (WIDTH - 1), WIDTH - 1, 1,
            WIDTH, BLOCK_D, BLOCK_K, True,
        )


@triton.jit
def trt_selective_state_update_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
    dim, nstate, groups,
    out_ptr, new_ptr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    per_group = dim // groups
    _state_update_kernel(
        state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, out_ptr, new_ptr,
        dim, nstate, per_group, per_group, -float("inf"), 0.0,
        dim * nstate, 0, nstate, 1, dim, 0, 1, dim, 0, 1, 0, nstate, 1,
        groups * nstate, nstate, 1, groups * nstate, nstate, 1, 0, 1, dim, 0, 1, 0, 1,
        dim, 0, 1, dim * nstate, 0, nstate, 1,
        BLOCK_R, BLOCK_N, True, HAS_Z, True, SOFTPLUS, False,
    )


@triton.jit
def trt_causal_conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr,
    dim,
    out_ptr, new_ptr,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, SILU: tl.constexpr,
):
    _causal_conv1d_update_kernel(
        x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, new_ptr,
        dim,
        dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1, WIDTH, 1, dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
        WIDTH, BLOCK_D, True, SILU,
    )


@triton.jit
def trt_rmsnorm_gated_kernel(
    x_ptr, z_ptr, w_ptr,
    rows, dim,
    out_ptr,
    GROUP: tl.constexpr, EPS: tl.constexpr, BLOCK: tl.constexpr, HAS_Z: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
):
    _rmsnorm_gated_kernel(
        x_ptr, z_ptr, w_ptr, out_ptr, GROUP, EPS, dim, 1, dim, 1, dim, 1,
        BLOCK, HAS_Z, NORM_BEFORE_GATE,
    )
