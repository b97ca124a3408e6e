"""``ssmcc::quantized_linear`` and ``ssmcc::quantized_embedding`` — linear layers and embeddings
whose weights are stored small (int8 with scales, or bfloat16 / float16) and widened on use.

Shapes (n outputs / vocabulary rows, k inputs / hidden, G scale groups per row, g = k / G)::

    quantized_linear(x (..., k), weight (n, k), scale (n, G) float32, bias (n,)?) -> (..., n)
    quantized_embedding(ids (...) int64, weight (n, k), scale (n, G) float32) -> (..., k) float32

``weight`` is int8, bfloat16 or float16. Math (float32 inside, the linear's output in x's dtype)::

    W[r, c] = weight[r, c] * scale[r, c // g]             dequantise: each row in G groups
    quantized_linear    = x W^T + bias
    quantized_embedding = W[ids]

int8 weights come from ``quantize_weight``: symmetric, per row (G = 1: one scale per output
channel) or per group of g inputs, ``scale = max|w| / 127`` over the group and
``weight = round(w / scale)`` in [-127, 127], so ``|W - w| <= scale / 2`` elementwise. bfloat16 /
float16 weights are the rounded values with ``scale`` all ones (G = 1): one op for every storage.

Tied weights (an LM head reading the embedding matrix) quantise once: the embedding's rows are the
head's output channels, so one (weight, scale) pair serves both ops. Both ops are position-wise:
the step program calls them on one token.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from ssmcc.ops._shapes import expect
from ssmcc.ops.contracts import register_positionwise
from ssmcc.ops.definition import define

OP = "quantized_linear"
EMBEDDING_OP = "quantized_embedding"
STORAGE_DTYPES = (torch.int8, torch.bfloat16, torch.float16)
INT8_MAX = 127
QUANTIZE_BLOCK = 1 << 22  # int8 quantisation: elements per block of rows (16 MB of float32)

# quantize= scheme -> (storage dtype, inputs per scale group; None: one group per row)
SCHEMES: dict[str, tuple[torch.dtype, int | None]] = {
    "int8": (torch.int8, None),
    "int8-g32": (torch.int8, 32),
    "int8-g64": (torch.int8, 64),
    "int8-g128": (torch.int8, 128),
    "bf16": (torch.bfloat16, None),
    "fp16": (torch.float16, None),
}


def scheme_applies(scheme: str, in_features: int) -> bool:
    """Whether ``scheme`` can store a weight with ``in_features`` columns (a group size must
    divide them)."""
    group = SCHEMES[scheme][1]
    return group is None or in_features % group == 0


def quantize_weight(weight: Tensor, scheme: str) -> tuple[Tensor, Tensor]:
    """``(stored, scale)`` for a float weight (n, k): the ``SCHEMES[scheme]`` storage. int8 rows
    are quantised ``QUANTIZE_BLOCK`` elements at a time (each row on its own, so the result is
    the same), which bounds the float temporaries (a 2.8b model's embedding is 515 MB)."""
    dtype, group = SCHEMES[scheme]
    rows, cols = weight.shape
    if dtype != torch.int8:
        return weight.detach().float().to(dtype).contiguous(), torch.ones(rows, 1)
    groups = 1 if group is None else cols // group
    stored = torch.empty(rows, cols, dtype=torch.int8)
    scale = torch.empty(rows, groups)
    step = max(1, QUANTIZE_BLOCK // max(cols, 1))
    for start in range(0, rows, step):
        grouped = weight[start : start + step].detach().float().reshape(-1, groups, cols // groups)
        amax = grouped.abs().amax(dim=-1)
        block_scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))
        rounded = torch.round(grouped / block_scale[..., None]).clamp_(-INT8_MAX, INT8_MAX)
        stored[start : start + step] = rounded.reshape(-1, cols)
        scale[start : start + step] = block_scale
    return stored, scale


def dequantize_weight(weight: Tensor, scale: Tensor) -> Tensor:
    """``W = weight * scale`` per group, float32 (n, k)."""
    rows, cols = weight.shape
    grouped = weight.float().reshape(rows, scale.shape[1], -1) * scale.float()[..., None]
    return grouped.reshape(rows, cols)


def check_quantized_weight(op: str, weight, scale) -> None:
    expect(weight.dim() == 2, op, f"weight must be (n, k), got shape {tuple(weight.shape)}")
    expect(
        weight.dtype in STORAGE_DTYPES,
        op,
        f"weight must be stored as int8, bfloat16 or float16, got {weight.dtype}",
    )
    expect(
        scale.dim() == 2 and scale.shape[0] == weight.shape[0],
        op,
        f"scale must be (n, groups) with n = {weight.shape[0]}, got {tuple(scale.shape)}",
    )
    expect(scale.dtype == torch.float32, op, f"scale must be float32, got {scale.dtype}")
    expect(
        weight.shape[1] % scale.shape[1] == 0,
        op,
        f"the scale's {scale.shape[1]} groups must divide the weight's {weight.shape[1]} columns",
    )


def check_quantized_linear_args(x, weight, scale, bias) -> None:
    check_quantized_weight(OP, weight, scale)
    expect(
        x.dim() >= 1 and x.shape[-1] == weight.shape[1],
        OP,
        f"x must be (..., {weight.shape[1]}) for a weight of shape {tuple(weight.shape)}, got "
        f"{tuple(x.shape)}",
    )
    if bias is not None:
        expect(
            tuple(bias.shape) == (weight.shape[0],),
            OP,
            f"bias must be ({weight.shape[0]},), got {tuple(bias.shape)}",
        )


def quantized_linear_ref(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None):
    """Reference: dequantise, then ``x W^T + b`` in float32."""
    check_quantized_linear_args(x, weight, scale, bias)
    bias = None if bias is None else bias.float()
    return F.linear(x.float(), dequantize_weight(weight, scale), bias).to(x.dtype)


def quantized_embedding_ref(ids: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """Reference: the dequantised rows ``ids`` selects."""
    check_quantized_weight(EMBEDDING_OP, weight, scale)
    rows, cols = weight.shape
    picked = weight[ids].float().reshape(*ids.shape, scale.shape[1], -1)
    return (picked * scale[ids][..., None]).reshape(*ids.shape, cols)


@torch.library.custom_op("ssmcc::quantized_linear", mutates_args=())
def quantized_linear(
    x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None = None
) -> Tensor:
    """``x W^T + bias`` with ``W`` stored small (see the module docstring)."""
    return quantized_linear_ref(x, weight, scale, bias)


@quantized_linear.register_fake
def _quantized_linear_fake(x, weight, scale, bias=None):
    check_quantized_linear_args(x, weight, scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.custom_op("ssmcc::quantized_embedding", mutates_args=())
def quantized_embedding(ids: Tensor, weight: Tensor, scale: Tensor) -> Tensor:
    """The rows ``ids`` of ``W`` stored small, float32."""
    return quantized_embedding_ref(ids, weight, scale)


@quantized_embedding.register_fake
def _quantized_embedding_fake(ids, weight, scale):
    check_quantized_weight(EMBEDDING_OP, weight, scale)
    return ids.new_empty((*ids.shape, weight.shape[1]), dtype=torch.float32)


register_positionwise(quantized_linear)
register_positionwise(quantized_embedding)

QUANTIZED_LINEAR = define(quantized_linear, quantized_linear_ref)
QUANTIZED_EMBEDDING = define(quantized_embedding, quantized_embedding_ref)
