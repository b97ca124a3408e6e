"""``ssmcc::moe_experts`` — the experts of a mixture-of-experts block, given the router's choice.

Shapes (t = tokens, k = experts per token, E = experts, d = hidden, i = expert width)::

    moe_experts(hidden (t, d), top_k_index (t, k) int64, top_k_weights (t, k),
                up (E, u, d), down (E, d, i), activation, gated) -> out (t, d) dtype of hidden

with ``u = 2i`` when ``gated`` (the rows ``[gate; up]`` stacked) and ``u = i`` otherwise.

Weights stored small (``quantize=``): ``up_scale`` (E, u, G) / ``down_scale`` (E, d, G') given,
``up`` / ``down`` are int8, bfloat16 or float16 and each expert's matrix is dequantised per group
as ``ssmcc.quantized_linear``'s weight is (``up[e] * up_scale[e]`` per group of d / G inputs).

Math, for token ``t`` and its chosen experts ``e_j`` with weights ``w_j``::

    a_j   = act(G_j x_t) * (U_j x_t)      gated:      [G_j; U_j] = up[e_j]
    a_j   = act(up[e_j] x_t)              not gated
    out_t = sum_j w_j * down[e_j] a_j

in float32, rounded once to the hidden dtype. ``act`` is one of ``ACTIVATIONS`` (``relu2`` is
relu squared, NemotronH's). The router (a linear layer, softmax and top-k) stays ATen in the
program; this op takes its decisions, so it does not sort or group tokens in the graph — the
data-dependent grouping happens inside the op — and each token's output depends on that token
alone (it is position-wise: the step program calls it on one token).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank
from ssmcc.ops.activations import activate as activate_form
from ssmcc.ops.contracts import register_positionwise
from ssmcc.ops.definition import define
from ssmcc.ops.quantized_linear import STORAGE_DTYPES, dequantize_weight

OP = "moe_experts"
# The forms (``ssmcc.ops.activations``) the experts take; an activation's index here is its code
# in the kernels and the ONNX node (an order of its own, older than the shared codes).
ACTIVATIONS = ("silu", "gelu", "gelu_tanh", "relu", "relu2")


def activate(x: Tensor, activation: str) -> Tensor:
    """``activation`` (one of ``ACTIVATIONS``) applied to ``x``: ``ssmcc.ops.activations``."""
    return activate_form(x, activation)


def _check_scale(name: str, weight, scale) -> None:
    if scale is None:
        return
    expect(
        weight.dtype in STORAGE_DTYPES,
        OP,
        f"{name} with a scale must be stored as int8, bfloat16 or float16, got {weight.dtype}",
    )
    expect(
        scale.dim() == 3
        and tuple(scale.shape[:2]) == tuple(weight.shape[:2])
        and scale.dtype == torch.float32
        and weight.shape[2] % scale.shape[2] == 0,
        OP,
        f"{name}_scale must be float32 (experts, rows, groups) = ({weight.shape[0]}, "
        f"{weight.shape[1]}, G) with G dividing {weight.shape[2]}, got "
        f"{tuple(scale.shape)} {scale.dtype}",
    )


def expert_matrix(weights: Tensor, scale: Tensor | None, expert: int) -> Tensor:
    """Expert ``expert``'s matrix in float32 (dequantised when stored small)."""
    if scale is None:
        return weights[expert].float()
    return dequantize_weight(weights[expert], scale[expert])


def check_moe_experts_args(
    hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale=None, down_scale=None
):
    _check_scale("up", up, up_scale)
    _check_scale("down", down, down_scale)
    expect_rank(OP, "hidden", hidden, (2,), "(tokens, hidden)")
    for name, weight, scale, layout in (
        ("up", up, up_scale, "(experts, up_rows, hidden)"),
        ("down", down, down_scale, "(experts, hidden, width)"),
    ):
        if scale is None:
            expect_rank(OP, name, weight, (3,), layout)
        else:  # stored small: _check_scale checked its dtype
            expect(weight.dim() == 3, OP, f"{name} must have shape {layout}")
    expect(
        activation in ACTIVATIONS,
        OP,
        f"activation must be one of {ACTIVATIONS}, got {activation!r}",
    )
    tokens, dim = hidden.shape
    experts, width = down.shape[0], down.shape[2]
    expect(
        top_k_index.dim() == 2 and top_k_index.shape[0] == tokens,
        OP,
        f"top_k_index must have shape (tokens, k) = ({tokens}, k), got {tuple(top_k_index.shape)}",
    )
    expect(
        not top_k_index.dtype.is_floating_point,
        OP,
        f"top_k_index must be an integer tensor, got {top_k_index.dtype}",
    )
    expect(
        tuple(top_k_weights.shape) == tuple(top_k_index.shape),
        OP,
        f"top_k_weights must have the shape of top_k_index {tuple(top_k_index.shape)}, got "
        f"{tuple(top_k_weights.shape)}",
    )
    rows = 2 * width if gated else width
    expect(
        tuple(up.shape) == (experts, rows, dim),
        OP,
        f"up must have shape (experts, {'2*width' if gated else 'width'}, hidden) = "
        f"({experts}, {rows}, {dim}), got {tuple(up.shape)}",
    )
    expect(
        tuple(down.shape) == (experts, dim, width),
        OP,
        f"down must have shape (experts, hidden, width) = ({experts}, {dim}, {width}), got "
        f"{tuple(down.shape)}",
    )


def moe_experts_ref(
    hidden: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    up: Tensor,
    down: Tensor,
    activation: str = "silu",
    gated: bool = True,
    up_scale: Tensor | None = None,
    down_scale: Tensor | None = None,
) -> Tensor:
    """Reference: per expert, the tokens that chose it, two products, a weighted scatter-add."""
    check_moe_experts_args(
        hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale, down_scale
    )
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    x = hidden.float()
    for expert in torch.unique(top_k_index).tolist():
        if not 0 <= expert < up.shape[0]:
            continue  # an index outside the experts (expert parallelism's sentinel) adds nothing
        tokens, slot = torch.where(top_k_index == expert)
        projected = x[tokens] @ expert_matrix(up, up_scale, expert).T
        if gated:
            gate, value = projected.chunk(2, dim=-1)
            active = activate(gate, activation) * value
        else:
            active = activate(projected, activation)
        weight = top_k_weights[tokens, slot].float()[:, None]
        out.index_add_(0, tokens, (active @ expert_matrix(down, down_scale, expert).T) * weight)
    return out.to(hidden.dtype)


@torch.library.custom_op("ssmcc::moe_experts", mutates_args=())
def moe_experts(
    hidden: Tensor,
    top_k_index: Tensor,
    top_k_weights: Tensor,
    up: Tensor,
    down: Tensor,
    activation: str = "silu",
    gated: bool = True,
    up_scale: Tensor | None = None,
    down_scale: Tensor | None = None,
) -> Tensor:
    """The chosen experts' outputs, weighted and summed per token."""
    return moe_experts_ref(
        hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale, down_scale
    )


@moe_experts.register_fake
def _moe_experts_fake(
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
    check_moe_experts_args(
        hidden, top_k_index, top_k_weights, up, down, activation, gated, up_scale, down_scale
    )
    return hidden.new_empty(hidden.shape)


register_positionwise(moe_experts)

MOE_EXPERTS = define(moe_experts, moe_experts_ref)
