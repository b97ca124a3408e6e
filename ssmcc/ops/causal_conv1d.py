"""``ssmcc::causal_conv1d`` and ``ssmcc::causal_conv1d_update`` — Mamba's depthwise causal conv.

Shapes (b = batch, d = channels, l = length, k = kernel width)::

    causal_conv1d(x (b, d, l), weight (d, k), bias (d,)?, initial_state (b, d, k-1)?, activation?)
        -> out (b, d, l) dtype of x,  final_state (b, d, k-1) float32
    causal_conv1d_update(x (b, d), conv_state (b, d, k-1), weight (d, k), bias (d,)?, activation?)
        -> out (b, d) dtype of x,     new_state (b, d, k-1) float32

Math: with ``xs`` the inputs preceded by the k-1 previous inputs (``initial_state``/``conv_state``,
zeros when absent), for every channel c::

    out_t[c] = act( sum_{j=0}^{k-1} weight[c, j] * xs[c, t + j] + bias[c] )

``act`` is an activation of ``ssmcc.ops.activations`` by name (None: identity; silu, gelu, the
tanh GELUs, relu, relu2 under Hugging Face's ``hidden_act`` names). The returned state is the
last k-1 entries of ``xs``: exactly what the next call needs to continue the sequence, so
prefill followed by updates equals one convolution over the concatenated input.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank, expect_same_shape, expect_vector
from ssmcc.ops.activations import activation_code, apply_activation
from ssmcc.ops.contracts import register_state_contract, single_state
from ssmcc.ops.definition import define


def _check_weight(op: str, weight: Tensor, dim) -> None:
    expect_rank(op, "weight", weight, (2,), "(dim, kernel_width)")
    expect(weight.shape[0] == dim, op, f"weight has {weight.shape[0]} rows, expected dim={dim}")
    expect(weight.shape[1] >= 1, op, f"weight has kernel width {weight.shape[1]}, expected >= 1")


def check_causal_conv1d_args(x, weight, bias, initial_state) -> None:
    op = "causal_conv1d"
    expect_rank(op, "x", x, (3,), "(batch, dim, length)")
    batch, dim, _ = x.shape
    _check_weight(op, weight, dim)
    expect_vector(op, "bias", bias, dim)
    state_shape = (batch, dim, weight.shape[1] - 1)
    expect_same_shape(
        op, "initial_state", initial_state, state_shape, "(batch, dim, kernel_width-1)"
    )


def check_causal_conv1d_update_args(x, conv_state, weight, bias) -> None:
    op = "causal_conv1d_update"
    expect_rank(op, "x", x, (2,), "(batch, dim)")
    batch, dim = x.shape
    _check_weight(op, weight, dim)
    expect_vector(op, "bias", bias, dim)
    state_shape = (batch, dim, weight.shape[1] - 1)
    expect_same_shape(op, "conv_state", conv_state, state_shape, "(batch, dim, kernel_width-1)")


def _convolve(xs: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """Valid depthwise convolution of ``xs`` (b, d, k-1+l) in float32 -> (b, d, l)."""
    bias32 = None if bias is None else bias.float()
    return F.conv1d(xs.float(), weight.float()[:, None, :], bias32, groups=weight.shape[0])


def causal_conv1d_ref(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    initial_state: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: pad with the previous inputs, convolve, take the last k-1 inputs as state."""
    check_causal_conv1d_args(x, weight, bias, initial_state)
    batch, dim, _ = x.shape
    width = weight.shape[1]
    if initial_state is None:
        previous = x.new_zeros(batch, dim, width - 1, dtype=torch.float32)
    else:
        previous = initial_state.float()
    xs = torch.cat([previous, x.float()], dim=-1)
    if x.shape[-1] == 0:  # no position to compute; the state passes through unchanged
        activation_code("causal_conv1d", activation)
        return x.new_empty(batch, dim, 0), previous.contiguous()
    out = apply_activation("causal_conv1d", _convolve(xs, weight, bias), activation)
    final_state = xs[:, :, xs.shape[-1] - (width - 1) :].contiguous()
    return out.to(x.dtype), final_state


def causal_conv1d_update_ref(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Reference: one new input per channel against the stored k-1 previous inputs."""
    check_causal_conv1d_update_args(x, conv_state, weight, bias)
    xs = torch.cat([conv_state.float(), x.float()[:, :, None]], dim=-1)
    out = apply_activation("causal_conv1d_update", _convolve(xs, weight, bias)[:, :, 0], activation)
    return out.to(x.dtype), xs[:, :, 1:].contiguous()


@torch.library.custom_op("ssmcc::causal_conv1d", mutates_args=())
def causal_conv1d(
    x: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    initial_state: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """Depthwise causal conv over a sequence; returns ``(out, final_state)``."""
    return causal_conv1d_ref(x, weight, bias, initial_state, activation)


@causal_conv1d.register_fake
def _causal_conv1d_fake(x, weight, bias=None, initial_state=None, activation=None):
    check_causal_conv1d_args(x, weight, bias, initial_state)
    activation_code("causal_conv1d", activation)
    batch, dim, _ = x.shape
    state_shape = (batch, dim, weight.shape[1] - 1)
    return x.new_empty(x.shape), x.new_empty(state_shape, dtype=torch.float32)


@torch.library.custom_op("ssmcc::causal_conv1d_update", mutates_args=())
def causal_conv1d_update(
    x: Tensor,
    conv_state: Tensor,
    weight: Tensor,
    bias: Tensor | None = None,
    activation: str | None = None,
) -> tuple[Tensor, Tensor]:
    """One step of the depthwise causal conv; returns ``(out, new_state)``."""
    return causal_conv1d_update_ref(x, conv_state, weight, bias, activation)


@causal_conv1d_update.register_fake
def _causal_conv1d_update_fake(x, conv_state, weight, bias=None, activation=None):
    check_causal_conv1d_update_args(x, conv_state, weight, bias)
    activation_code("causal_conv1d_update", activation)
    return x.new_empty(x.shape), conv_state.new_empty(conv_state.shape, dtype=torch.float32)


def _conv_step(state, x, weight, bias=None, initial_state=None, activation=None):
    """``causal_conv1d`` over one position from ``state``: ``causal_conv1d_update``."""
    out, new_state = causal_conv1d_update(x[:, :, 0], state, weight, bias, activation)
    return out.unsqueeze(-1), new_state


register_state_contract(
    causal_conv1d,
    single_state(
        kind="conv_state",
        state_arg="initial_state",
        state_output=1,
        shape=lambda args: (args["weight"].shape[0], args["weight"].shape[1] - 1),  # (d, k-1)
        dtype=lambda args: torch.float32,
        step=_conv_step,
        step_op="causal_conv1d_update",
    ),
)

CAUSAL_CONV1D = define(causal_conv1d, causal_conv1d_ref)
CAUSAL_CONV1D_UPDATE = define(causal_conv1d_update, causal_conv1d_update_ref)
