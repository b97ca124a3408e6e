"""``ssmcc::ssd_scan`` — the Mamba-2 (SSD) scan over a whole sequence, in head layout.

Shapes (b = batch, l = length, h = heads, p = head dim, g = groups, n = state size)::

    x, z             (b, l, h, p)
    dt               (b, l, h)
    A                (h,)              one real (negative) scalar per head
    B, C             (b, l, g, n)      one shape; head i reads group i // (h / g)
    D                (h,) or (h, p)
    dt_bias          (h,)
    initial_state    (b, h, p, n)
    -> out           (b, l, h, p)      dtype of x
    -> final_state   (b, h, p, n)      float32

Math, for every batch row and head i (all accumulation in float32)::

    dt_t      = clamp(softplus(dt_t + dt_bias), dt_min, dt_max)   (softplus, bias when requested)
    h_t[p,n]  = exp(dt_t * A) * h_{t-1}[p,n] + dt_t * x_t[p] * B_t[n]
    y_t[p]    = sum_n C_t[n] * h_t[p,n] + D[p] * x_t[p]
    out_t[p]  = y_t[p] * silu(z_t[p])                              (gate only when z is given)

with ``h_{-1} = initial_state`` (zeros when absent) and ``final_state = h_{l-1}``. The result does
not depend on any chunking: a kernel may evaluate the recurrence in chunks (SSD's block
decomposition), the op's meaning is the recurrence.

``dt_min``/``dt_max`` default to 0 and ``None`` (no upper limit), which after softplus clamp
nothing. Hugging Face's prefill path clamps dt to the model's ``time_step_limit`` and its decode
path does not: ssmcc clamps in both (its step is this recurrence at length 1), so the two agree
with each other and with HF's prefill, and differ from HF's decode only for a model whose
``time_step_limit`` binds.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank, expect_same_shape, expect_vector
from ssmcc.ops.contracts import register_state_contract, single_state
from ssmcc.ops.definition import define
from ssmcc.ops.ssd_math import discretized_dt, heads_of_groups
from ssmcc.ops.ssd_state_update import ssd_state_update

OP = "ssd_scan"


def check_ssd_scan_args(x, dt, A, B, C, D, z, dt_bias, initial_state) -> None:
    expect_rank(OP, "x", x, (4,), "(batch, length, heads, head_dim)")
    batch, length, heads, head_dim = x.shape
    expect_same_shape(OP, "dt", dt, (batch, length, heads), "(batch, length, heads)")
    expect_vector(OP, "A", A, heads, "heads")
    for name, t in (("B", B), ("C", C)):
        expect_rank(OP, name, t, (4,), "(batch, length, groups, state)")
        expect(
            t.shape[0] == batch and t.shape[1] == length,
            OP,
            f"{name} has batch/length {tuple(t.shape[:2])}, expected {(batch, length)} (from x)",
        )
        expect(
            heads % t.shape[2] == 0,
            OP,
            f"{name} has {t.shape[2]} groups, which does not divide heads={heads}",
        )
    expect(
        all(a == b for a, b in zip(B.shape, C.shape, strict=True)),
        OP,
        f"B {tuple(B.shape)} and C {tuple(C.shape)} must have one shape (one group count)",
    )
    state = B.shape[3]
    if D is not None:
        expect_rank(OP, "D", D, (1, 2), "(heads,) or (heads, head_dim)")
        want = (heads,) if D.dim() == 1 else (heads, head_dim)
        expect_same_shape(OP, "D", D, want, "(heads,) or (heads, head_dim)")
    expect_vector(OP, "dt_bias", dt_bias, heads, "heads")
    expect_same_shape(OP, "z", z, tuple(x.shape), "(batch, length, heads, head_dim)")
    expect_same_shape(
        OP,
        "initial_state",
        initial_state,
        (batch, heads, head_dim, state),
        "(batch, heads, head_dim, state)",
    )


def ssd_scan_ref(
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
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: the recurrence above, one position at a time, in float32."""
    check_ssd_scan_args(x, dt, A, B, C, D, z, dt_bias, initial_state)
    batch, length, heads, head_dim = x.shape
    x32 = x.float()
    step = discretized_dt(dt, dt_bias, dt_softplus, dt_min, dt_max)  # (b, l, h)
    decay = torch.exp(step * A.float())  # (b, l, h)
    B_heads = heads_of_groups(B.float(), heads, axis=2)  # (b, l, h, n)
    C_heads = heads_of_groups(C.float(), heads, axis=2)
    if initial_state is None:
        h = x32.new_zeros(batch, heads, head_dim, B.shape[3])
    else:
        h = initial_state.float().clone()
    outputs = []
    for t in range(length):
        drive = (step[:, t, :, None] * x32[:, t])[..., None] * B_heads[:, t, :, None, :]
        h = decay[:, t, :, None, None] * h + drive
        outputs.append((h * C_heads[:, t, :, None, :]).sum(-1))
    y = torch.stack(outputs, dim=1) if outputs else x32.new_zeros(x.shape)
    if D is not None:
        y = y + (D.float()[:, None] if D.dim() == 1 else D.float()) * x32
    if z is not None:
        y = y * F.silu(z.float())
    return y.to(x.dtype), h


@torch.library.custom_op("ssmcc::ssd_scan", mutates_args=())
def ssd_scan(
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
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Mamba-2 SSD scan; returns ``(out, final_state)``. See the module docstring."""
    return ssd_scan_ref(x, dt, A, B, C, D, z, dt_bias, dt_softplus, dt_min, dt_max, initial_state)


@ssd_scan.register_fake
def _ssd_scan_fake(
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
    initial_state=None,
):
    check_ssd_scan_args(x, dt, A, B, C, D, z, dt_bias, initial_state)
    batch, _, heads, head_dim = x.shape
    state = (batch, heads, head_dim, B.shape[3])
    return x.new_empty(x.shape), x.new_empty(state, dtype=torch.float32)


def _ssd_step(
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
    initial_state=None,
):
    """``ssd_scan`` over one position from ``state``: ``ssd_state_update``."""
    at0 = lambda t: None if t is None else t[:, 0]  # noqa: E731
    out, new_state = ssd_state_update(
        state, at0(x), at0(dt), A, at0(B), at0(C), D, at0(z), dt_bias, dt_softplus, dt_min, dt_max
    )
    return out.unsqueeze(1), new_state


register_state_contract(
    ssd_scan,
    single_state(
        kind="ssm_state",
        state_arg="initial_state",
        state_output=1,
        shape=lambda args: (args["x"].shape[2], args["x"].shape[3], args["B"].shape[3]),
        dtype=lambda args: torch.float32,
        step=_ssd_step,
        step_op="ssd_state_update",
    ),
)

SSD_SCAN = define(ssd_scan, ssd_scan_ref)
