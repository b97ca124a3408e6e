"""Triton kernels for ``ssmcc::causal_conv1d`` and ``ssmcc::causal_conv1d_update`` — Mamba's
depthwise causal convolution.

Math (``ssmcc.ops.causal_conv1d``): with ``xs`` the k-1 previous inputs (the state, zeros when
absent) followed by the new ones, for each channel c::

    out_t[c]  = act( sum_{j<k} weight[c, j] xs[c, t + j] + bias[c] )   act: activations.py's
    state'    = the last k-1 entries of xs

Sequence form: a program computes ``block_d`` channels x ``block_l`` positions (grid (batch,
cdiv(d, BLOCK_D), cdiv(l, BLOCK_L))); tap j of output t reads position ``t + j - (k-1)`` of x,
or of the state where that is negative: only the programs of the first positions load the state
(its taps added after x's), so the others hold one tile of loads per tap. (64, 32) tiles at 4
warps: at 64 positions the taps' loads spill registers at sm_90. A second kernel writes the
final state. Step form: one program per (batch, channel block) reads the state and the
new input once and writes the output and the shifted state.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import activations, configs
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2
from ssmcc.kernels.triton.slots import check_pool
from ssmcc.ops.activations import activation_code


@triton.jit
def _causal_conv1d_kernel(
    x_ptr, w_ptr, bias_ptr, state_ptr, out_ptr,
    dim, length,
    s_xb, s_xd, s_xl, s_wd, s_wk, s_sb, s_sd, s_sk, s_ob, s_od, s_ol,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_BIAS: tl.constexpr, HAS_STATE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    t = tl.program_id(2) * BLOCK_L + tl.arange(0, BLOCK_L)
    mask_d = d < dim
    mask = mask_d[:, None] & (t[None, :] < length)
    acc = tl.zeros((BLOCK_D, BLOCK_L), dtype=tl.float32)
    x_rows = x_ptr + b * s_xb + d[:, None] * s_xd
    for j in tl.static_range(WIDTH):
        w = tl.load(w_ptr + d * s_wd + j * s_wk, mask=mask_d, other=0.0).to(tl.float32)
        src = t + (j - (WIDTH - 1))
        v = tl.load(x_rows + src[None, :] * s_xl, mask=mask & (src[None, :] >= 0), other=0.0)
        acc += w[:, None] * v.to(tl.float32)
    if HAS_STATE:
        if tl.program_id(2) == 0:  # only the first k-1 positions reach back into the state
            s_rows = state_ptr + b * s_sb + d[:, None] * s_sd
            for j in tl.static_range(WIDTH - 1):
                w_s = tl.load(w_ptr + d * s_wd + j * s_wk, mask=mask_d, other=0.0)
                back = t + (j - (WIDTH - 1))
                v_s = tl.load(s_rows + (back[None, :] + WIDTH - 1) * s_sk,
                              mask=mask & (back[None, :] < 0), other=0.0)
                acc += w_s.to(tl.float32)[:, None] * v_s.to(tl.float32)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=mask_d, other=0.0).to(tl.float32)[:, None]
    acc = activations.activate(acc, ACTIVATION)
    tl.store(out_ptr + b * s_ob + d[:, None] * s_od + t[None, :] * s_ol, acc, mask=mask)


@triton.jit
def _causal_conv1d_final_state_kernel(
    x_ptr, state_ptr, final_ptr,
    dim, length,
    s_xb, s_xd, s_xl, s_sb, s_sd, s_sk, s_fb, s_fd, s_fk,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_K: tl.constexpr, HAS_STATE: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    s = tl.arange(0, BLOCK_K)
    mask = (d < dim)[:, None] & (s[None, :] < WIDTH - 1)
    src = length + s - (WIDTH - 1)  # position in x of state entry s; < 0: the old state's
    v = tl.load(x_ptr + b * s_xb + d[:, None] * s_xd + src[None, :] * s_xl,
                mask=mask & (src[None, :] >= 0), other=0.0).to(tl.float32)
    if HAS_STATE:
        v += tl.load(
            state_ptr + b * s_sb + d[:, None] * s_sd + (src[None, :] + WIDTH - 1) * s_sk,
            mask=mask & (src[None, :] < 0), other=0.0,
        ).to(tl.float32)
    tl.store(final_ptr + b * s_fb + d[:, None] * s_fd + s[None, :] * s_fk, v, mask=mask)


@triton.jit
def _causal_conv1d_update_kernel(
    x_ptr, state_ptr, w_ptr, bias_ptr, out_ptr, new_ptr, slots_ptr,
    dim,
    s_xb, s_xd, s_sb, s_sd, s_sk, s_wd, s_wk, s_ob, s_od, s_nb, s_nd, s_nk,
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, SLOTS: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    in_dim = d < dim
    if SLOTS:  # the row's slot of the state pool, in every lane (in place: each lane reads its
        slot = tl.load(slots_ptr + b + d * 0)  # positions before it overwrites them)
        mask_d = in_dim & (slot >= 0)
        slot = tl.where(slot >= 0, slot, 0)
    else:
        slot = b + d * 0
        mask_d = in_dim
    x = tl.load(x_ptr + b * s_xb + d * s_xd, mask=mask_d, other=0.0).to(tl.float32)
    acc = tl.load(w_ptr + d * s_wd + (WIDTH - 1) * s_wk, mask=mask_d, other=0.0).to(tl.float32) * x
    for j in tl.static_range(WIDTH - 1):
        v = tl.load(state_ptr + slot * s_sb + d * s_sd + j * s_sk, mask=mask_d, other=0.0)
        v = v.to(tl.float32)
        acc += tl.load(w_ptr + d * s_wd + j * s_wk, mask=mask_d, other=0.0).to(tl.float32) * v
        if j > 0:
            tl.store(new_ptr + slot * s_nb + d * s_nd + (j - 1) * s_nk, v, mask=mask_d)
    if WIDTH > 1:
        tl.store(new_ptr + slot * s_nb + d * s_nd + (WIDTH - 2) * s_nk, x, mask=mask_d)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    acc = activations.activate(acc, ACTIVATION)
    tl.store(out_ptr + b * s_ob + d * s_od, tl.where(mask_d, acc, 0.0), mask=in_dim)


@launcher("causal_conv1d")
def causal_conv1d_fwd(x, weight, bias=None, initial_state=None, activation=None, out=None):
    """``causal_conv1d`` on Triton. x (b, d, l) any strides; weight (d, k); bias (d,);
    initial_state (b, d, k-1) -> (out (b, d, l) dtype of x, final_state (b, d, k-1) float32);
    ``out``: write the output there (any strides, its dtype)."""
    batch, dim, length = x.shape
    width = weight.shape[1]
    config = configs.pick(x.device, configs.CONV_GPU, configs.CONV_CPU)
    block_d = min(config.block_d, next_power_of_2(dim))
    block_l = configs.rows_block(length, config.chunk)
    if out is None:
        out = torch.empty((batch, dim, length), dtype=x.dtype, device=x.device)
    final = torch.empty((batch, dim, width - 1), dtype=torch.float32, device=x.device)
    if batch == 0:
        return out, final
    state = initial_state if initial_state is not None else final
    if length:
        grid = (batch, -(-dim // block_d), -(-length // block_l))
        launch(_causal_conv1d_kernel, grid)(
            x, weight, bias if bias is not None else weight, state, out, dim, length,
            *x.stride(), *weight.stride(), *state.stride(), *out.stride(),
            WIDTH=width, BLOCK_D=block_d, BLOCK_L=block_l, HAS_BIAS=bias is not None,
            HAS_STATE=initial_state is not None,
            ACTIVATION=activation_code("causal_conv1d", activation),
            num_warps=config.num_warps,
        )
    if width > 1:
        launch(_causal_conv1d_final_state_kernel, (batch, -(-dim // block_d)))(
            x, state, final, dim, length, *x.stride(), *state.stride(), *final.stride(),
            WIDTH=width, BLOCK_D=block_d, BLOCK_K=next_power_of_2(width - 1),
            HAS_STATE=initial_state is not None, num_warps=config.num_warps,
        )
    return out, final


@launcher("causal_conv1d_update")
def causal_conv1d_update_fwd(
    x, conv_state, weight, bias=None, activation=None, out=None, state_indices=None
):
    """``causal_conv1d_update`` on Triton. x (b, d); conv_state (b, d, k-1); weight (d, k);
    bias (d,) -> (out (b, d) dtype of x, new_state (b, d, k-1) float32). With ``state_indices``
    (b,): conv_state is a (slots, d, k-1) pool, row i reading and writing slot
    ``state_indices[i]`` in place (negative: a padding row, skipped, its out zeros); the pool is
    returned as the new state."""
    batch, dim = x.shape
    width = weight.shape[1]
    config = configs.pick(x.device, configs.CONV_GPU, configs.CONV_CPU)
    block_d = min(config.block_d, next_power_of_2(dim))
    if out is None:
        out = torch.empty((batch, dim), dtype=x.dtype, device=x.device)
    slots = None
    if state_indices is not None:
        slots = check_pool("causal_conv1d_update", batch, state_indices, conv_state)
        new = conv_state
    else:
        new = torch.empty((batch, dim, width - 1), dtype=torch.float32, device=x.device)
    if batch == 0:
        return out, new
    state_strides = conv_state.stride() if width > 1 else (0, 0, 0)
    new_strides = new.stride() if width > 1 else (0, 0, 0)
    launch(_causal_conv1d_update_kernel, (batch, -(-dim // block_d)))(
        x, conv_state, weight, bias if bias is not None else weight, out, new,
        slots if slots is not None else x, dim,
        *x.stride(), *state_strides, *weight.stride(), *out.stride(), *new_strides,
        WIDTH=width, BLOCK_D=block_d, HAS_BIAS=bias is not None,
        ACTIVATION=activation_code("causal_conv1d_update", activation), SLOTS=slots is not None,
        num_warps=config.num_warps,
    )
    return out, new
