"""``ssmcc::ssd_state_update`` — one recurrent step of the Mamba-2 (SSD) scan, in head layout.

Shapes (b = batch, h = heads, p = head dim, g = groups, n = state size)::

    state            (b, h, p, n)
    x, z             (b, h, p)
    dt               (b, h)
    A                (h,)
    B, C             (b, g, n)         one shape; head i reads group i // (h / g)
    D                (h,) or (h, p)
    dt_bias          (h,)
    -> out           (b, h, p)         dtype of x
    -> new_state     (b, h, p, n)      float32

Math (float32)::

    dt'        = clamp(softplus(dt + dt_bias), dt_min, dt_max)   (softplus, bias when requested)
    new[p,n]   = exp(dt' * A) * state[p,n] + dt' * x[p] * B[n]
    y[p]       = sum_n C[n] * new[p,n] + D[p] * x[p]
    out[p]     = y[p] * silu(z[p])                                (gate only when z is given)

It is ``ssd_scan`` at length 1 with ``initial_state = state`` (clamped the same way: see
``ssd_scan``), the decode-time form; mamba_ssm's ``selective_state_update`` with per-head dt and
A. Functional: the input state is not modified; the new state is returned.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank, expect_same_shape, expect_vector
from ssmcc.ops.definition import define
from ssmcc.ops.ssd_math import discretized_dt, heads_of_groups

OP = "ssd_state_update"


def check_ssd_state_update_args(state, x, dt, A, B, C, D, z, dt_bias) -> None:
    expect_rank(OP, "state", state, (4,), "(batch, heads, head_dim, state)")
    batch, heads, head_dim, n = state.shape
    expect_same_shape(OP, "x", x, (batch, heads, head_dim), "(batch, heads, head_dim)")
    expect_same_shape(OP, "dt", dt, (batch, heads), "(batch, heads)")
    expect_vector(OP, "A", A, heads, "heads")
    for name, t in (("B", B), ("C", C)):
        expect_rank(OP, name, t, (3,), "(batch, groups, state)")
        expect(t.shape[0] == batch, OP, f"{name} has batch {t.shape[0]}, expected {batch}")
        expect(
            heads % t.shape[1] == 0,
            OP,
            f"{name} has {t.shape[1]} groups, which does not divide heads={heads}",
        )
        expect(t.shape[2] == n, OP, f"{name} has state size {t.shape[2]}, expected {n}")
    expect(B.shape[1] == C.shape[1], OP, f"B and C have {B.shape[1]} and {C.shape[1]} groups")
    if D is not None:
        expect_rank(OP, "D", D, (1, 2), "(heads,) or (heads, head_dim)")
        want = (heads,) if D.dim() == 1 else (heads, head_dim)
        expect_same_shape(OP, "D", D, want, "(heads,) or (heads, head_dim)")
    expect_vector(OP, "dt_bias", dt_bias, heads, "heads")
    expect_same_shape(OP, "z", z, (batch, heads, head_dim), "(batch, heads, head_dim)")


def ssd_state_update_ref(
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
    dt_min: float = 0.0,
    dt_max: float | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: the single step above, in float32."""
    check_ssd_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    heads = state.shape[1]
    x32 = x.float()
    step = discretized_dt(dt, dt_bias, dt_softplus, dt_min, dt_max)  # (b, h)
    decay = torch.exp(step * A.float())[:, :, None, None]
    B_heads = heads_of_groups(B.float(), heads, axis=1)[:, :, None, :]  # (b, h, 1, n)
    C_heads = heads_of_groups(C.float(), heads, axis=1)[:, :, None, :]
    new_state = decay * state.float() + (step[:, :, None] * x32)[..., None] * B_heads
    y = (new_state * C_heads).sum(-1)
    if D is not None:
        y = y + (D.float()[:, None] if D.dim() == 1 else D.float()) * x32
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype), new_state


@torch.library.custom_op("ssmcc::ssd_state_update", mutates_args=())
def ssd_state_update(
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
    dt_min: float = 0.0,
    dt_max: float | None = None,
) -> tuple[Tensor, Tensor]:
    """One SSD step; returns ``(out, new_state)``. See the module docstring."""
    return ssd_state_update_ref(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max)


@ssd_state_update.register_fake
def _ssd_state_update_fake(
    state,
    x,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    dt_bias=None,
    dt_softplus=False,
    dt_min=0.0,
    dt_max=None,
):
    check_ssd_state_update_args(state, x, dt, A, B, C, D, z, dt_bias)
    return x.new_empty(x.shape), state.new_empty(state.shape, dtype=torch.float32)

SSD_STATE_UPDATE = define(ssd_state_update, ssd_state_update_ref)
