"""ssmcc's Triton kernels in the form a TensorRT ahead-of-time plugin launches: one kernel per
ONNX node, parameters ordered inputs, int32 sizes, outputs.

A TensorRT "quickly deployable plugin" with an AOT implementation hands its kernel exactly that:
the node's input pointers in the node's order, then the extra int32 scalars the plugin declares,
then the output pointers; floats cannot be passed at run time. The kernels of this package take
their tensors in another order, with strides, and two of them (the scan and the convolution) are
launched as more than one kernel. Each wrapper below is one ``@triton.jit`` kernel that calls an
existing kernel of this package as a device function (Triton inlines it), so the math is the
kernels' own (``selective_scan.py``, ``causal_conv1d.py``, ``state_update.py``,
``ssd_scan.py``):

    SelectiveScanChunkState, SelectiveScanPassStates, SelectiveScanChunkScan
                        the Mamba-1 scan's three kernels (``selective_scan.py``), one per node of
                        the chain a ``SelectiveScan`` node becomes (``lowering/tensorrt/
                        scan_chain.py``): the chunk length (``CHUNK``), the channel block, the
                        state padded to a power of two and the tile length are constants of the
                        specialisation; K = cdiv(length, CHUNK) is computed in the kernel; the
                        intermediates are the nodes' float32 outputs, contiguous (B and C loaded
                        per channel, as the group size is a run-time value)
    CausalConv1d        the convolution kernel, and in the programs of the first position block
                        also the final-state kernel (same (batch, channel block) mapping)
    SelectiveStateUpdate, SsdStateUpdate, CausalConv1dUpdate, RmsNormGated
                        single kernels already, strides derived from the sizes (the norm's
                        group size and eps, and Mamba-2's dt limits, are constants: a binary per
                        value)
    SsdChunkCumsum, SsdChunkState, SsdStatePassing, SsdBmm, SsdChunkScan
                        the SSD scan's five kernels (``ssd_scan.py``), one per node of the chain
                        an ``SsdScan`` node becomes (``lowering/tensorrt/ssd_chain.py``): the
                        chunk length Q (``CHUNK``) and the head and state sizes' tiles are
                        constants of the specialisation; K = cdiv(length, Q) is computed in the
                        kernel; the intermediates are the nodes' float32 outputs, contiguous

The Mamba-1 chain, per batch row and channel c (math in ``selective_scan.py``)::

    SelectiveScanChunkState  dt_t = softplus?(delta_t + delta_bias_c), 0 past l; each chunk from
                             a zero state: S_k = sum_t exp(A_c (dt_{t+1} + ..)) dt_t u_t B_t
                             -> chunk_ends (b, K, n, d), dt_sums (b, K, d)
    SelectiveScanPassStates  h_in[0] = initial_state, h_in[k+1] = exp(A dt_sum_k) h_in[k] + S_k
                             -> chunk_starts (b, K, n, d)
    SelectiveScanChunkScan   every chunk again from h_in[k] -> out (b, d, l), last_state (b, d, n)
                             (the last chunk's programs)

The SSD chain, per batch row and head i (group g = i // (h / G); math in ``ssd_scan.py``)::

    SsdChunkCumsum   dt_t = clamp(softplus(dt_t + dt_bias_i)), 0 past l; a_t = cumsum dt A_i
                     -> dt_chunks, dA_cumsum (b, h, K, Q)
    SsdChunkState    S_k = x^T diag(exp(a_last - a_t) dt_t) B  (the chunk from a zero state)
                     -> chunk_states (b, K, h, p, n)
    SsdStatePassing  h_in[0] = initial_state, h_in[k+1] = exp(a_last(k)) h_in[k] + S_k
                     -> chunk_starts (b, K, h, p, n), final_state (b, h, p, n)
    SsdBmm           CB_k = C B^T per chunk and group (causal tiles only) -> CB (b, K, G, Q, Q)
    SsdChunkScan     y = exp(a) C h_in^T + (CB o L) x + D x, times silu(z) -> out (b, l, h, p)

Memory access: each program reads whole rows of x (head_dim-contiguous), B and C (state-
contiguous) and the chunk's dt / a (Q-contiguous); only SsdStatePassing walks the K chunks, over
flat (p n) float32 vectors; the products are ``tl.dot`` on the node's 16-bit dtype when x, B
and C share one (float32 accumulation; the k block 16: ``specs.PLUGIN_16BIT_BLOCK_K`` says why),
IEEE float32 otherwise (one pipeline stage, k block 16, as the triton target's FMA products).

Every tensor is contiguous in the ONNX node's layout (TensorRT's linear format), so strides are
products of sizes. Each node input is present (the ONNX emitters write zeros for an absent
``D``, bias or state), so only ``has_z`` and the activation (its code a constant of the
specialisation: ``activations.py``) select code. Grids, per node, with
cdiv(a, b) = ceil(a / b)::

    SelectiveScanChunkState  (batch, cdiv(dim, BLOCK_D), K)
    SelectiveScanPassStates  (batch, cdiv(dim, BLOCK_D), 1)
    SelectiveScanChunkScan   (batch, cdiv(dim, BLOCK_D), K)
    CausalConv1d          (batch, cdiv(dim, BLOCK_D), max(cdiv(length, BLOCK_L), 1))
    SelectiveStateUpdate  (batch, 1, cdiv(dim, BLOCK_R))
    CausalConv1dUpdate    (batch, cdiv(dim, BLOCK_D), 1)
    RmsNormGated          (rows, dim / GROUP, 1)      rows: the product of x's leading dims
    SsdStateUpdate        (batch, heads, cdiv(head_dim, BLOCK_R))
    SsdChunkCumsum        (batch, K, cdiv(heads, BLOCK_H))
    SsdChunkState         (batch * K, heads, cdiv(head_dim, BLOCK_P) * cdiv(state, BLOCK_N))
    SsdStatePassing       (batch, heads, cdiv(head_dim * state, BLOCK))
    SsdBmm                (batch * K, groups, cdiv(Q, BLOCK_M) * cdiv(Q, BLOCK_S))
    SsdChunkScan          (batch * K, heads, cdiv(Q, BLOCK_M) * cdiv(head_dim, BLOCK_P))
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmcc.kernels.triton import scan_tiles
from ssmcc.kernels.triton.causal_conv1d import (
    _causal_conv1d_final_state_kernel,
    _causal_conv1d_kernel,
    _causal_conv1d_update_kernel,
)
from ssmcc.kernels.triton.rmsnorm_gated import _rmsnorm_gated_kernel
from ssmcc.kernels.triton.selective_scan import (
    _selective_scan_chunk_scan_kernel,
    _selective_scan_chunk_state_kernel,
    _selective_scan_pass_states_kernel,
)
from ssmcc.kernels.triton.ssd_scan import (
    _ssd_bmm_kernel,
    _ssd_chunk_cumsum_kernel,
    _ssd_chunk_scan_kernel,
    _ssd_chunk_state_kernel,
    _ssd_state_passing_kernel,
)
from ssmcc.kernels.triton.state_update import _state_update_kernel


@triton.jit
def trt_selective_scan_chunk_state_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, bias_ptr,
    dim, length, groups, state,
    ends_ptr, dtsum_ptr,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    SOFTPLUS: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    per_group = dim // groups
    _selective_scan_chunk_state_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, bias_ptr, ends_ptr, dtsum_ptr,
        dim, length, CHUNK, per_group, state,
        dim * length, length, 1, dim * length, length, 1, state, 1,
        groups * state * length, state * length, length, 1,
        chunks * state * dim, state * dim, 1, dim, chunks * dim, dim, 1,
        BLOCK_D, BLOCK_N, BLOCK_L, scan_tiles.ALONG, scan_tiles.ALONG, False, True, SOFTPLUS,
    )


@triton.jit
def trt_selective_scan_pass_states_kernel(
    ends_ptr, dtsum_ptr, A_ptr, h0_ptr,
    chunks, dim, state,
    starts_ptr,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
):
    _selective_scan_pass_states_kernel(
        ends_ptr, dtsum_ptr, A_ptr, h0_ptr, starts_ptr,
        dim, state, chunks,
        chunks * state * dim, state * dim, 1, dim, chunks * dim, dim, 1, state, 1,
        dim * state, state, 1, chunks * state * dim, state * dim, 1, dim,
        BLOCK_D, BLOCK_N, True,
    )


@triton.jit
def trt_selective_scan_chunk_scan_kernel(
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, starts_ptr,
    dim, length, groups, state,
    out_ptr, last_ptr,
    CHUNK: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    per_group = dim // groups
    _selective_scan_chunk_scan_kernel(
        u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, starts_ptr, out_ptr,
        last_ptr,
        dim, length, CHUNK, per_group, per_group, state,
        dim * length, length, 1, dim * length, length, 1, state, 1,
        groups * state * length, state * length, length, 1,
        groups * state * length, state * length, length, 1,
        dim * length, length, 1,
        chunks * state * dim, state * dim, 1, dim, dim * length, length, 1, dim * state, state, 1,
        BLOCK_D, BLOCK_N, BLOCK_L, scan_tiles.ALONG, scan_tiles.ALONG, False,
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
        x_ptr,  # no slot indices
        dim, nstate, per_group, per_group, -float("inf"), 0.0,
        dim * nstate, 0, nstate, 1, dim, 0, 1, dim, 0, 1, 0, nstate, 1,
        groups * nstate, nstate, 1, groups * nstate, nstate, 1, 0, 1, dim, 0, 1, 0, 1,
        dim, 0, 1, dim * nstate, 0, nstate, 1,
        BLOCK_R, BLOCK_N, True, HAS_Z, True, SOFTPLUS, False, False,
    )


@triton.jit
def trt_causal_conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr,
    dim,
    out_ptr, new_ptr,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, ACTIVATION: tl.constexpr,
):
    _causal_conv1d_update_kernel(
        x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, new_ptr, x_ptr,  # no slot indices
        dim,
        dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1, WIDTH, 1, dim, 1, dim * (WIDTH - 1), WIDTH - 1, 1,
        WIDTH, BLOCK_D, True, ACTIVATION, False,
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
        x_ptr,  # no slot indices
        head_dim, nstate, per_group, per_group, DT_MIN, DT_MAX,
        heads * head_dim * nstate, head_dim * nstate, nstate, 1,
        heads * head_dim, head_dim, 1, heads, 1, 0, 1, 0, 0,
        groups * nstate, nstate, 1, groups * nstate, nstate, 1, head_dim, 1,
        heads * head_dim, head_dim, 1, 1, 0,
        heads * head_dim, head_dim, 1, heads * head_dim * nstate, head_dim * nstate, nstate, 1,
        BLOCK_R, BLOCK_N, True, HAS_Z, True, SOFTPLUS, CLAMP_MAX, False,
    )


@triton.jit
def trt_ssd_chunk_cumsum_kernel(
    dt_ptr, A_ptr, bias_ptr,
    length, heads,
    dt_out_ptr, acs_ptr,
    CHUNK: tl.constexpr, BLOCK_H: tl.constexpr, SOFTPLUS: tl.constexpr,
    DT_MIN: tl.constexpr, DT_MAX: tl.constexpr, CLAMP_MAX: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    _ssd_chunk_cumsum_kernel(
        dt_ptr, A_ptr, bias_ptr, dt_out_ptr, acs_ptr,
        length, CHUNK, heads, DT_MIN, DT_MAX,
        length * heads, heads, 1, heads * chunks * CHUNK, chunks * CHUNK, CHUNK, 1,
        BLOCK_H, CHUNK, True, SOFTPLUS, CLAMP_MAX,
    )


@triton.jit
def trt_ssd_chunk_state_kernel(
    x_ptr, B_ptr, dt_ptr, acs_ptr,
    length, heads, head_dim, groups, nstate,
    states_ptr,
    CHUNK: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT: tl.constexpr, WIDEN: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    state = head_dim * nstate
    _ssd_chunk_state_kernel(
        x_ptr, B_ptr, dt_ptr, acs_ptr, states_ptr,
        length, CHUNK, head_dim, nstate, heads // groups, chunks,
        length * heads * head_dim, heads * head_dim, head_dim, 1,
        length * groups * nstate, groups * nstate, nstate, 1,
        heads * chunks * CHUNK, chunks * CHUNK, CHUNK, 1,
        chunks * heads * state, heads * state, state, nstate, 1,
        BLOCK_P, BLOCK_N, BLOCK_K, DOT, WIDEN, "ieee",
    )


@triton.jit
def trt_ssd_state_passing_kernel(
    states_ptr, acs_ptr, h0_ptr,
    chunks, heads, head_dim, nstate,
    starts_ptr, final_ptr,
    CHUNK: tl.constexpr, BLOCK: tl.constexpr,
):
    state = head_dim * nstate
    _ssd_state_passing_kernel(
        states_ptr, acs_ptr, h0_ptr, starts_ptr, final_ptr,
        state, chunks, CHUNK,
        chunks * heads * state, heads * state, state,
        heads * chunks * CHUNK, chunks * CHUNK, CHUNK, 1,
        heads * state, state, heads * state, state,
        BLOCK, True,
    )


@triton.jit
def trt_ssd_bmm_kernel(
    C_ptr, B_ptr,
    length, groups, nstate,
    cb_ptr,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT: tl.constexpr, WIDEN: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    row = groups * nstate
    _ssd_bmm_kernel(
        C_ptr, B_ptr, cb_ptr,
        length, CHUNK, nstate, chunks,
        length * row, row, nstate, 1, length * row, row, nstate, 1,
        chunks * groups * CHUNK * CHUNK, groups * CHUNK * CHUNK, CHUNK * CHUNK, CHUNK, 1,
        BLOCK_M, BLOCK_S, BLOCK_K, DOT, WIDEN, "ieee",
    )


@triton.jit
def trt_ssd_chunk_scan_kernel(
    x_ptr, z_ptr, C_ptr, D_ptr, dt_ptr, acs_ptr, starts_ptr, cb_ptr,
    length, heads, head_dim, groups, nstate,
    out_ptr,
    CHUNK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_Z: tl.constexpr, DOT: tl.constexpr, WIDEN: tl.constexpr,
):
    chunks = tl.cdiv(length, CHUNK)
    row = heads * head_dim
    state = head_dim * nstate
    _ssd_chunk_scan_kernel(
        x_ptr, z_ptr, C_ptr, D_ptr, dt_ptr, acs_ptr, starts_ptr, cb_ptr, out_ptr,
        length, CHUNK, head_dim, nstate, heads // groups, chunks,
        length * row, row, head_dim, 1, length * row, row, head_dim, 1,
        length * groups * nstate, groups * nstate, nstate, 1, head_dim, 1,
        heads * chunks * CHUNK, chunks * CHUNK, CHUNK, 1,
        chunks * heads * state, heads * state, state, nstate, 1,
        chunks * groups * CHUNK * CHUNK, groups * CHUNK * CHUNK, CHUNK * CHUNK, CHUNK, 1,
        length * row, row, head_dim, 1,
        BLOCK_M, BLOCK_P, BLOCK_K, True, HAS_Z, True, DOT, WIDEN, "ieee",
    )
