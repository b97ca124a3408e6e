"""The experts kernel of a mixture-of-experts layer (``moe_experts.h``) with the signature of
``ssmcc.ops.moe_experts`` (math there).

With at most ``SMALL_KERNEL_MAX_ROWS`` tokens (a decode step: one per sequence) the kernel groups
the (token, slot) pairs by expert and reads only the chosen experts' weights, once each, float32
or stored small; with more tokens (prefill) the op's reference runs (per used expert, two GEMMs
over the tokens that chose it), which is the faster way to read a weight for many rows. The
checked entry point applies the op's shape rules first, the ``_verified`` form (the torch
lowering's) skips them; the C++ contract check runs either way.
"""

from __future__ import annotations

import torch

from ssmcc.kernels.cpu.cpp_kernels import cpp_kernel
from ssmcc.kernels.cpu.linear_binding import SMALL_KERNEL_MAX_ROWS
from ssmcc.kernels.cpu.native import as_f32, call_kernel, pointer
from ssmcc.kernels.cpu.quantized_binding import mixer_weight_args
from ssmcc.ops.moe_experts import ACTIVATIONS, check_moe_experts_args, moe_experts_ref


@cpp_kernel("moe_experts", verified=True)
def _moe_experts(
    hidden,
    top_k_index,
    top_k_weights,
    up,
    down,
    activation="silu",
    gated=True,
    up_scale=None,
    down_scale=None,
):
    tokens, dim = hidden.shape
    if tokens > SMALL_KERNEL_MAX_ROWS:
        return moe_experts_ref(
            hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale, down_scale
        )
    x, weights = as_f32(hidden), as_f32(top_k_weights)
    index = top_k_index.to(torch.int64).contiguous()
    up, up_scale, up_storage, up_groups = mixer_weight_args(up, up_scale)
    down, down_scale, down_storage, down_groups = mixer_weight_args(down, down_scale)
    out = torch.empty(tokens, dim, dtype=torch.float32)
    call_kernel(
        "ssmcc_moe_experts",
        x.data_ptr(),
        index.data_ptr(),
        weights.data_ptr(),
        up.data_ptr(),
        up_storage,
        pointer(up_scale),
        up_groups,
        down.data_ptr(),
        down_storage,
        pointer(down_scale),
        down_groups,
        out.data_ptr(),
        tokens,
        index.shape[1],
        down.shape[0],
        dim,
        down.shape[2],
        int(gated),
        ACTIVATIONS.index(activation),
        torch.get_num_threads(),
    )
    return out.to(hidden.dtype)


@cpp_kernel("moe_experts")
def moe_experts_cpu(
    hidden,
    top_k_index,
    top_k_weights,
    up,
    down,
    activation="silu",
    gated=True,
    up_scale=None,
    down_scale=None,
):
    """Checked entry point: the op's shape rules, then the kernel."""
    args = (hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale, down_scale)
    check_moe_experts_args(*args)
    return _moe_experts(*args)


