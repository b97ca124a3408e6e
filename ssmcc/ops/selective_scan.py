"""``ssmcc::selective_scan`` — the Mamba-1 selective scan over a whole sequence.

Shapes (b = batch, d = channels, n = state size, l = length, g = groups)::

    u, delta, z      (b, d, l)
    A                (d, n)            real, usually negative
    B, C             (b, n, l)         shared by all channels, or
                     (b, g, n, l)      channel c uses group c // (d / g)
    D, delta_bias    (d,)
    initial_state    (b, d, n)
    -> out           (b, d, l)         dtype of u
    -> last_state    (b, d, n)         float32

Math, for every batch row, channel c and state index i (all accumulation in float32)::

    dt_t      = softplus(delta_t + delta_bias)     (softplus and bias only when requested)
    h_t[c,i]  = exp(dt_t[c] * A[c,i]) * h_{t-1}[c,i] + dt_t[c] * B_t[i] * u_t[c]
    y_t[c]    = sum_i C_t[i] * h_t[c,i] + D[c] * u_t[c]
    out_t[c]  = y_t[c] * silu(z_t[c])               (gate only when z is given)

The gate is silu whatever the model's ``hidden_act``: Hugging Face's Mamba-1 mixers apply
``hidden_act`` to the conv only (``causal_conv1d``'s ``activation``) and gate with silu.

with ``h_{-1} = initial_state`` (zeros when absent); ``last_state = h_{l-1}``.
This file holds the op schema, its reference implementation (the oracle every kernel is tested
against) and its fake implementation (shape rules with symbolic sizes). It imports no backend.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import (
    expand_groups,
    expect,
    expect_groups,
    expect_rank,
    expect_same_shape,
    expect_vector,
)
from ssmcc.ops.contracts import register_state_contract, single_state
from ssmcc.ops.definition import define
from ssmcc.ops.selective_state_update import selective_state_update

OP = "selective_scan"


def check_selective_scan_args(u, delta, A, B, C, D, z, delta_bias, initial_state) -> None:
    expect_rank(OP, "u", u, (3,), "(batch, dim, length)")
    batch, dim, length = u.shape
    expect_same_shape(OP, "delta", delta, (batch, dim, length), "(batch, dim, length)")
    expect_rank(OP, "A", A, (2,), "(dim, state)")
    expect(A.shape[0] == dim, OP, f"A has {A.shape[0]} rows, expected dim={dim} (from u)")
    state = A.shape[1]
    for name, t in (("B", B), ("C", C)):
        expect_groups(OP, name, t, batch, dim, state, grouped_rank=4)
        expect(t.shape[-1] == length, OP, f"{name} has length {t.shape[-1]}, expected {length}")
    expect_vector(OP, "D", D, dim)
    expect_vector(OP, "delta_bias", delta_bias, dim)
    expect_same_shape(OP, "z", z, (batch, dim, length), "(batch, dim, length)")
    expect_same_shape(
        OP, "initial_state", initial_state, (batch, dim, state), "(batch, dim, state)"
    )


def selective_scan_ref(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: the recurrence above, one time step at a time, in float32."""
    check_selective_scan_args(u, delta, A, B, C, D, z, delta_bias, initial_state)
    batch, dim, length = u.shape
    u32, dt, A32 = u.float(), delta.float(), A.float()
    if delta_bias is not None:
        dt = dt + delta_bias.float()[:, None]
    if delta_softplus:
        dt = F.softplus(dt)
    B_per_channel = expand_groups(B.float(), dim, grouped_rank=4)  # (b, d or 1, n, l)
    C_per_channel = expand_groups(C.float(), dim, grouped_rank=4)
    if initial_state is None:
        h = u32.new_zeros(batch, dim, A.shape[1])
    else:
        h = initial_state.float().clone()
    outputs = []
    for t in range(length):
        decay = torch.exp(dt[:, :, t, None] * A32)
        h = decay * h + (dt[:, :, t] * u32[:, :, t])[:, :, None] * B_per_channel[..., t]
        outputs.append((h * C_per_channel[..., t]).sum(-1))
    y = torch.stack(outputs, dim=-1) if outputs else u32.new_zeros(batch, dim, 0)
    if D is not None:
        y = y + D.float()[:, None] * u32
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(u.dtype), h


@torch.library.custom_op("ssmcc::selective_scan", mutates_args=())
def selective_scan(
    u: Tensor,
    delta: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    delta_bias: Tensor | None = None,
    delta_softplus: bool = False,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Mamba-1 selective scan; returns ``(out, last_state)``. See the module docstring."""
    return selective_scan_ref(u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state)


@selective_scan.register_fake
def _selective_scan_fake(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    check_selective_scan_args(u, delta, A, B, C, D, z, delta_bias, initial_state)
    batch, dim, _ = u.shape
    return u.new_empty(u.shape), u.new_empty((batch, dim, A.shape[1]), dtype=torch.float32)


def _scan_step(
    state,
    u,
    delta,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus=False,
    initial_state=None,
):
    """``selective_scan`` over one position from ``state``: ``selective_state_update``."""
    at0 = lambda t: None if t is None else t[..., 0]  # noqa: E731
    out, new_state = selective_state_update(
        state, at0(u), at0(delta), A, at0(B), at0(C), D, at0(z), delta_bias, delta_softplus
    )
    return out.unsqueeze(-1), new_state


register_state_contract(
    selective_scan,
    single_state(
        kind="ssm_state",
        state_arg="initial_state",
        state_output=1,
        shape=lambda args: tuple(args["A"].shape),  # (d, n)
        dtype=lambda args: torch.float32,
        step=_scan_step,
        step_op="selective_state_update",
    ),
)

SELECTIVE_SCAN = define(selective_scan, selective_scan_ref)
