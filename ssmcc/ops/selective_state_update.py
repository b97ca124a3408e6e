"""``ssmcc::selective_state_update`` — one recurrent step of the Mamba-1 selective scan.

Shapes (b = batch, d = channels, n = state size, g = groups)::

    state            (b, d, n)
    x, dt, z         (b, d)
    A                (d, n)
    B, C             (b, n)  shared by all channels, or (b, g, n)  grouped
    D, dt_bias       (d,)
    -> out           (b, d)      dtype of x
    -> new_state     (b, d, n)   float32

Math (float32)::

    dt'        = softplus(dt + dt_bias)            (softplus and bias only when requested)
    new[c,i]   = exp(dt'[c] * A[c,i]) * state[c,i] + dt'[c] * B[i] * x[c]
    y[c]       = sum_i C[i] * new[c,i] + D[c] * x[c]
    out[c]     = y[c] * silu(z[c])                 (gate only when z is given)

It is ``selective_scan`` at length 1 with ``initial_state = state``: the decode-time form.
Functional: the input state is not modified; the new state is returned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import (
    expand_groups,
    expect_groups,
    expect_rank,
    expect_same_shape,
    expect_vector,
)
from ssmcc.ops.definition import define

OP = "selective_state_update"


def check_selective_state_update_args(state, x, dt, A, B, C, D, z, dt_bias) -> None:
    expect_rank(OP, "state", state, (3,), "(batch, dim, state)")
    batch, dim, n = state.shape
    expect_same_shape(OP, "x", x, (batch, dim), "(batch, dim)")
    expect_same_shape(OP, "dt", dt, (batch, dim), "(batch, dim)")
    expect_same_shape(OP, "A", A, (dim, n), "(dim, state)")
    expect_groups(OP, "B", B, batch, dim, n, grouped_rank=3)
    expect_groups(OP, "C", C, batch, dim, n, grouped_rank=3)
    expect_vector(OP, "D", D, dim)
    expect_vector(OP, "dt_bias", dt_bias, dim)
    expect_same_shape(OP, "z", z, (batch, dim), "(batch, dim)")


def selective_state_update_ref(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """Reference: the single step above, in float32."""
    check_selective_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    dim = state.shape[1]
    x32, dt32 = x.float(), dt.float()
    if dt_bias is not None:
        dt32 = dt32 + dt_bias.float()
    if dt_softplus:
        dt32 = F.softplus(dt32)
    B_per_channel = expand_groups(B.float(), dim, grouped_rank=3)  # (b, d or 1, n)
    C_per_channel = expand_groups(C.float(), dim, grouped_rank=3)
    decay = torch.exp(dt32[:, :, None] * A.float())
    new_state = decay * state.float() + (dt32 * x32)[:, :, None] * B_per_channel
    y = (new_state * C_per_channel).sum(-1)
    if D is not None:
        y = y + D.float() * x32
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype), new_state


@torch.library.custom_op("ssmcc::selective_state_update", mutates_args=())
def selective_state_update(
    state: Tensor,
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    D: Tensor | None = None,
    z: Tensor | None = None,
    dt_bias: Tensor | None = None,
    dt_softplus: bool = False,
) -> tuple[Tensor, Tensor]:
    """One selective-scan step; returns ``(out, new_state)``. See the module docstring."""
    return selective_state_update_ref(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus)


@selective_state_update.register_fake
def _selective_state_update_fake(
    state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False
):
    check_selective_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    return x.new_empty(x.shape), state.new_empty(state.shape, dtype=torch.float32)

SELECTIVE_STATE_UPDATE = define(selective_state_update, selective_state_update_ref)
