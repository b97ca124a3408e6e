"""Every ssmcc op's Triton launcher, by op name: what the triton target's lowered program calls.

A launcher takes the op's arguments as the op does (``ssmcc.ops``) and returns its outputs; the
kernels are compiled for the tensors' CUDA device or run in Triton's interpreter on CPU tensors
(``runtime.py``). Importing this module imports Triton.
"""

from __future__ import annotations

from ssmcc.kernels.triton.attention import attention_fwd
from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_fwd, causal_conv1d_update_fwd
from ssmcc.kernels.triton.linear import quantized_embedding_fwd, quantized_linear_fwd
from ssmcc.kernels.triton.mixers import (
    mamba_mixer_fwd,
    mamba_mixer_step_fwd,
    ssd_mixer_fwd,
    ssd_mixer_step_fwd,
)
from ssmcc.kernels.triton.moe_experts import moe_experts_fwd
from ssmcc.kernels.triton.positions import positions_fwd
from ssmcc.kernels.triton.rmsnorm_gated import rmsnorm_gated_fwd
from ssmcc.kernels.triton.selective_scan import selective_scan_fwd
from ssmcc.kernels.triton.ssd_scan import ssd_scan_fwd
from ssmcc.kernels.triton.state_update import selective_state_update_fwd, ssd_state_update_fwd

TRITON_KERNELS = {
    "selective_scan": selective_scan_fwd,
    "selective_state_update": selective_state_update_fwd,
    "causal_conv1d": causal_conv1d_fwd,
    "causal_conv1d_update": causal_conv1d_update_fwd,
    "ssd_scan": ssd_scan_fwd,
    "ssd_state_update": ssd_state_update_fwd,
    "rmsnorm_gated": rmsnorm_gated_fwd,
    "ssd_mixer": ssd_mixer_fwd,
    "ssd_mixer_step": ssd_mixer_step_fwd,
    "mamba_mixer": mamba_mixer_fwd,
    "mamba_mixer_step": mamba_mixer_step_fwd,
    "attention": attention_fwd,
    "positions": positions_fwd,
    "moe_experts": moe_experts_fwd,
    "quantized_linear": quantized_linear_fwd,
    "quantized_embedding": quantized_embedding_fwd,
}
