"""Triton kernel for ``ssmcc::rmsnorm_gated`` — Mamba-2's gated RMSNorm over groups of channels.

Math (``ssmcc.ops.rmsnorm_gated``), in float32, per row and group of ``group_size`` channels::

    norm(v)  = v / sqrt(mean(v^2 over the group) + eps)
    out      = weight * norm(x * silu(z))          norm_before_gate = False (Hugging Face)
    out      = weight * norm(x) * silu(z)          norm_before_gate = True (mamba_ssm, FalconH1)

One program per (row, group): the group is loaded once, reduced, scaled and stored.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2


@triton.jit
def _rmsnorm_gated_kernel(
    x_ptr, z_ptr, w_ptr, out_ptr,
    group_size, eps,
    s_xr, s_xc, s_zr, s_zc, s_or, s_oc,
    BLOCK: tl.constexpr, HAS_Z: tl.constexpr, NORM_BEFORE_GATE: tl.constexpr,
):
    row = tl.program_id(0)
    c = tl.program_id(1) * group_size + tl.arange(0, BLOCK)
    mask = tl.arange(0, BLOCK) < group_size
    x = tl.load(x_ptr + row * s_xr + c * s_xc, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + row * s_zr + c * s_zc, mask=mask, other=0.0).to(tl.float32)
        gate = z / (1.0 + tl.exp(-z))
        if not NORM_BEFORE_GATE:
            x = x * gate
    mean_square = tl.sum(x * x, axis=0) / group_size
    y = x / tl.sqrt(mean_square + eps) * tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
    if HAS_Z:
        if NORM_BEFORE_GATE:
            y = y * gate
    tl.store(out_ptr + row * s_or + c * s_oc, y, mask=mask)


@launcher("rmsnorm_gated")
def rmsnorm_gated_fwd(x, z, weight, group_size: int, eps: float = 1e-6,
                      norm_before_gate: bool = False, out=None, out_dtype=None) -> torch.Tensor:
    """``rmsnorm_gated`` on Triton. x, z (..., d) any float dtypes (widened to float32 in
    registers); weight (d,) contiguous -> out (..., d) in ``out_dtype`` (default x's; rounded once,
    on the store), or written into ``out`` (its dtype)."""
    dim = x.shape[-1]
    rows = x.reshape(-1, dim)
    gates = z.reshape(-1, dim) if z is not None else rows
    if out is None:
        out = torch.empty(x.shape, dtype=out_dtype or x.dtype, device=x.device)
    target = out.view(-1, dim)
    if rows.shape[0]:
        launch(_rmsnorm_gated_kernel, (rows.shape[0], dim // group_size))(
            rows, gates, weight.contiguous(), target, group_size, float(eps),
            *rows.stride(), *gates.stride(), *target.stride(),
            BLOCK=next_power_of_2(group_size), HAS_Z=z is not None,
            NORM_BEFORE_GATE=bool(norm_before_gate), num_warps=4 if group_size >= 1024 else 1,
        )
    return out
