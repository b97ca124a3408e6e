"""ssmcc's Triton kernels in the form a TensorRT ahead-of-time plugin launches: one kernel per
ONNX node, parameters ordered inputs, int32 sizes, outputs.

A TensorRT "quickly deployable plugin" with an AOT implementation hands its kernel exactly that:
the node's input pointers in the node's order, then the extra int32 scalars the plugin declares,
then the output pointers; floats cannot be passed at run time. The kernels of this package take
their tensors in another order, with strides, and two of them (the scan and the convolution) are
launched as more than one kernel. Each wrapper below is one ``@triton.jit`` kernel that calls an
existing kernel of this package as a device function (Triton inlines it), so the math is the
kernels' own (``selective_scan.py``, ``causal_conv1d.py``, ``state_update.py``):

    SelectiveScan       the scan's chunk-scan kernel over one chunk = the whole sequence,
                        started from ``initial_state``: a program owns (batch, BLOCK_D channels)
                        and steps through every position in tiles (no parallelism along the
                        sequence, so no state passing; B and C loaded per channel, as the group
                        size is a run-time value)
    CausalConv1d        the convolution kernel, and in the programs of the first position block
                        also the final-state kernel (same (batch, channel block) mapping)
    SelectiveStateUpdate, SsdStateUpdate, CausalConv1dUpdate, RmsNormGated
                        single kernels already, strides derived from the sizes (the norm's
                        group size and eps, and Mamba-2's dt limits, are constants: a binary per
                        value)
    SsdScan             a kernel of its own (the SSD scan is 4 kernels in ``ssd_scan.py``): the
                        recurrence one position after another, a program per (batch, head,
                        BLOCK_P head-dim rows)

Every tensor is contiguous in the ONNX node's layout (TensorRT's linear format), so strides are
products of sizes. Each node input is present (the ONNX emitters write zeros for an absent
``D``, bias or state), so only ``has_z`` and the activation (its code a constant of the
specialisation: ``activations.py``) select code. Grids, per node, with
cdiv(a, b) = ceil(a / b)::

    SelectiveScan         (batch, cdiv(dim, BLOCK_D), 1)
    CausalConv1d          (batch, cdiv(dim, BLOCK_D), max(cdiv(length, BLOCK_L), 1))
    SelectiveStateUpdate  (batch, 1, cdiv(dim, BLOCK_R))
    CausalConv1dUpdate    (batch, cdiv(dim, BLOCK_D), 1)
    RmsNormGated          (rows, dim / GROUP, 1)      rows: the product of x's leading dims
    SsdStateUpdate        (batch, heads, cdiv(head_dim, BLOCK_R))
    SsdScan               (batch, heads, cdiv(head_dim, BLOCK_P))
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, scan_tiles
from ssmcc.kernels.triton.causal_conv1d import (
    _causal_conv1d_final_state_kernel,
    _causal_conv1d_kernel,
    _causal_conv1d_update_kernel,
)
from ssmcc.kernels.triton.rmsnorm_gated import _rmsnorm_gated_kernel
from ssmcc.kernels.triton.selective_scan import _selective_scan_chunk_scan_kernel
from ssmcc.kernels.triton.state_update import _state_update_kernel

SCAN_BLOCK_L = tl.constexpr(configs.SELECTIVE_SCAN_GPU.block_l)  # the scan's positions per tile


@triton.jit
def trt_selective_scan_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,
    dim, length, groups, state,
    out_ptr, last_ptr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    per_group = dim // groups
    _selective_scan_chunk_scan_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr, out_ptr, last_ptr,
        dim, length, length, per_group, per_group, state,
        dim * length, length, 1, dim * length, length, 1, state, 1,
        groups * state * length, state * length, length, 1,
        groups * state * length, state * length, length, 1,
        dim * length, length, 1,
        dim * state, 0, state, 1, dim * length, length, 1, dim * state, state, 1,
        BLOCK_D, BLOCK_N, SCAN_BLOCK_L, scan_tiles.ALONG, scan_tiles.ALONG, False,
        True, HAS_Z, True, SOFTPLUS, True,
    )


@triton.jit
def trt_causal_conv1d_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr,
    dim, length,
    out_ptr, final_ptr,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
    ACTIVATION: tl.constexpr,
):
    _causal_conv1d_kernel(
        x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr,
        dim, length,
        dim * length, length, 1, WIDTH, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
        dim * length, length, 1,
        WIDTH, BLOCK_D, BLOCK_L, True, True, ACTIVATION,
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
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, ACTIVATION: tl.constexpr,
):
    _causal_conv1d_update_kernel(
        x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, new_ptr,
        dim,
        dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1, WIDTH, 1, dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
        WIDTH, BLOCK_D, True, ACTIVATION,
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


@triton.jit
def trt_ssd_state_update_kernel(
    state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr,
    heads, head_dim, nstate, groups,
    out_ptr, new_ptr,
    BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
    DT_MIN: tl.constexpr, DT_MAX: tl.constexpr, CLAMP_MAX: tl.constexpr,
):
    per_group = heads * head_dim // groups  # channels (head rows) per B/C group
    _state_update_kernel(
        state_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, out_ptr, new_ptr,
        head_dim, nstate, per_group, per_group, DT_MIN, DT_MAX,
        heads * head_dim * nstate, head_dim * nstate, nstate, 1,
        heads * head_dim, head_dim, 1, heads, 1, 0, 1, 0, 0,
        groups * nstate, nstate, 1, groups * nstate, nstate, 1, head_dim, 1,
        heads * head_dim, head_dim, 1, 1, 0,
        heads * head_dim, head_dim, 1, heads * head_dim * nstate, head_dim * nstate, nstate, 1,
        BLOCK_R, BLOCK_N, True, HAS_Z, True, SOFTPLUS, CLAMP_MAX,
    )


@triton.jit
def trt_ssd_scan_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, h0_ptr,
    length, heads, head_dim, groups, nstate,
    out_ptr, final_ptr,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
    DT_MIN: tl.constexpr, DT_MAX: tl.constexpr, CLAMP_MAX: tl.constexpr,
):
    """The SSD recurrence (``ssmcc.ops.ssd_scan``) one position after another: a program owns
    head ``i`` of batch row ``b`` and ``BLOCK_P`` of its head-dim rows, its (BLOCK_P, n) state in
    registers::

        dt_t = clamp(softplus(dt_t + dt_bias[i]), DT_MIN, DT_MAX)
        h    = exp(dt_t A[i]) h + dt_t x_t[p] B_t[n]
        out  = (sum_n C_t[n] h[p, n] + D[i, p] x_t[p]) * silu(z_t[p])

    x, z, out (b, l, h, p); dt (b, l, h); B, C (b, l, g, n), head i reading group i // (h / g);
    D (h, p); initial and final state (b, h, p, n). Not SSD's block decomposition (4 kernels in
    ``ssd_scan.py``): one launch, parallel over batch x heads x row blocks only."""
    b = tl.program_id(0)
    i = tl.program_id(1)
    p = tl.program_id(2) * BLOCK_P + tl.arange(0, BLOCK_P)
    n = tl.arange(0, BLOCK_N)
    mask_p = p < head_dim
    mask_n = n < nstate
    mask = mask_p[:, None] & mask_n[None, :]
    g = i // (heads // groups)
    state_at = (b * heads + i) * head_dim * nstate + p[:, None] * nstate + n[None, :]
    h = tl.load(h0_ptr + state_at, mask=mask, other=0.0).to(tl.float32)
    a = tl.load(A_ptr + i).to(tl.float32)
    bias = tl.load(bias_ptr + i).to(tl.float32)
    skip = tl.load(D_ptr + i * head_dim + p, mask=mask_p, other=0.0).to(tl.float32)
    for t in range(0, length):
        row = ((b * length + t) * heads + i) * head_dim + p
        x = tl.load(x_ptr + row, mask=mask_p, other=0.0).to(tl.float32)
        dt = tl.load(dt_ptr + (b * length + t) * heads + i).to(tl.float32) + bias
        if SOFTPLUS:
            dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
        dt = tl.maximum(dt, DT_MIN)
        if CLAMP_MAX:
            dt = tl.minimum(dt, DT_MAX)
        group_at = ((b * length + t) * groups + g) * nstate + n
        Bt = tl.load(B_ptr + group_at, mask=mask_n, other=0.0).to(tl.float32)
        Ct = tl.load(C_ptr + group_at, mask=mask_n, other=0.0).to(tl.float32)
        h = tl.exp(dt * a) * h + (dt * x)[:, None] * Bt[None, :]
        y = tl.sum(h * Ct[None, :], axis=1) + skip * x
        if HAS_Z:
            z = tl.load(z_ptr + row, mask=mask_p, other=0.0).to(tl.float32)
            y = y * z / (1.0 + tl.exp(-z))
        tl.store(out_ptr + row, y, mask=mask_p)
    tl.store(final_ptr + state_at, h, mask=mask)
