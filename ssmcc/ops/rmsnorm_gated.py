"""``ssmcc::rmsnorm_gated`` — Mamba-2's gated RMSNorm over groups of the last axis.

Shapes: ``x`` (..., d), ``z`` (..., d) or absent, ``weight`` (d,); ``group_size`` divides d.
-> ``out`` (..., d) in the dtype of ``x``.

Math, in float32, for each group of ``group_size`` consecutive channels::

    norm(v)   = v / sqrt(mean(v^2 over the group) + eps)
    norm_before_gate = False (Hugging Face Mamba2/Bamba/NemotronH/Zamba2/GraniteMoeHybrid):
        out = weight * norm(x * silu(z))
    norm_before_gate = True (mamba_ssm's default, FalconH1's option):
        out = weight * norm(x) * silu(z)

without ``z`` both are ``weight * norm(x)``. Hugging Face computes the same in float32 and rounds
to the input dtype before (Mamba2) or after (FalconH1) the weight: identical in float32, within
one rounding in bf16/fp16.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank, expect_same_shape, expect_vector
from ssmcc.ops.contracts import register_positionwise
from ssmcc.ops.definition import define

OP = "rmsnorm_gated"


def check_rmsnorm_gated_args(x, z, weight, group_size) -> None:
    expect_rank(OP, "x", x, tuple(range(1, 9)), "(..., d)")
    dim = x.shape[-1]
    expect_same_shape(OP, "z", z, tuple(x.shape), "x's shape")
    expect_vector(OP, "weight", weight, dim)
    expect(
        group_size >= 1 and dim % group_size == 0,
        OP,
        f"group_size {group_size} does not divide d={dim}",
    )


def rmsnorm_gated_ref(
    x: Tensor,
    z: Tensor | None,
    weight: Tensor,
    group_size: int,
    eps: float = 1e-6,
    norm_before_gate: bool = False,
) -> Tensor:
    """Reference: the formulas above in float32."""
    check_rmsnorm_gated_args(x, z, weight, group_size)
    h = x.float()
    gate = None if z is None else F.silu(z.float())
    if gate is not None and not norm_before_gate:
        h = h * gate
    grouped = h.unflatten(-1, (h.shape[-1] // group_size, group_size))
    grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + eps)
    h = grouped.flatten(-2) * weight.float()
    if gate is not None and norm_before_gate:
        h = h * gate
    return h.to(x.dtype)


@torch.library.custom_op("ssmcc::rmsnorm_gated", mutates_args=())
def rmsnorm_gated(
    x: Tensor,
    z: Tensor | None,
    weight: Tensor,
    group_size: int,
    eps: float = 1e-6,
    norm_before_gate: bool = False,
) -> Tensor:
    """Gated RMSNorm; see the module docstring."""
    return rmsnorm_gated_ref(x, z, weight, group_size, eps, norm_before_gate)


@rmsnorm_gated.register_fake
def _rmsnorm_gated_fake(x, z, weight, group_size, eps=1e-6, norm_before_gate=False):
    check_rmsnorm_gated_args(x, z, weight, group_size)
    return x.new_empty(x.shape)


register_positionwise(rmsnorm_gated)  # each position normalised on its own channels

RMSNORM_GATED = define(rmsnorm_gated, rmsnorm_gated_ref)
