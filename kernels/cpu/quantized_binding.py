"""The quantised-weight kernels (``gemv_quantized.h``) as ``quantized_linear(x, weight, scale,
bias)`` (math: ``ssmcc/ops/quantized_linear.py``).

With at most ``SMALL_KERNEL_MAX_ROWS`` rows of x (decode: one token per sequence) the product
reads the small weights and widens them in registers; with more rows (prefill) the weight is
widened to float32 once per call (``dequantize_cpu``, a pass over N x K that is ~1/(2 rows) of the
product's arithmetic) and multiplied by ``linear_binding.dense_linear`` (oneDNN where PyTorch has
it).
"""

from __future__ import annotations

import torch

from ssmcc.kernels.cpu.cpp_kernels import cpp_kernel
from ssmcc.kernels.cpu.linear_binding import SMALL_KERNEL_MAX_ROWS, dense_linear
from ssmcc.kernels.cpu.native import as_f32, call_kernel, pointer
from ssmcc.ops.quantized_linear import check_quantized_linear_args

STORAGE = {torch.int8: 0, torch.bfloat16: 1, torch.float16: 2}  # gemv_quantized.h's Storage
FLOAT32_STORAGE = -1  # mixer_weight.h's kFloat32Storage


def mixer_weight_args(weight, scale) -> tuple:
    """(weight, scale, storage code, groups) as ``mixer_weight.h`` reads a weight: one without a
    scale as float32 (``FLOAT32_STORAGE``), a stored one as it is (``STORAGE``; groups: the
    scale's last dim, for a matrix (N, G) or a stack of them (E, N, G))."""
    if scale is None:
        return as_f32(weight), None, FLOAT32_STORAGE, 1
    return weight.contiguous(), as_f32(scale), STORAGE[weight.dtype], scale.shape[-1]


def dequantize_cpu(weight, scale):
    """``weight * scale`` per group, float32 (N, K)."""
    rows, cols = weight.shape
    out = torch.empty(rows, cols, dtype=torch.float32)
    weight, scale = weight.contiguous(), as_f32(scale)
    call_kernel(
        "ssmcc_dequantize",
        weight.data_ptr(),
        STORAGE[weight.dtype],
        scale.data_ptr(),
        out.data_ptr(),
        rows,
        cols,
        scale.shape[1],
        torch.get_num_threads(),
    )
    return out


@cpp_kernel("quantized_linear", verified=True)
def _quantized_linear(x, weight, scale, bias=None):
    in_features = x.shape[-1]
    rows = x.numel() // in_features if in_features else 0
    if rows > SMALL_KERNEL_MAX_ROWS:
        y = dense_linear(as_f32(x), dequantize_cpu(weight, scale), as_f32(bias))
        return y.to(x.dtype)
    xf, scale, bias = as_f32(x), as_f32(scale), as_f32(bias)
    weight = weight.contiguous()
    y = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)
    call_kernel(
        "ssmcc_quantized_linear",
        xf.data_ptr(),
        weight.data_ptr(),
        STORAGE[weight.dtype],
        scale.data_ptr(),
        pointer(bias),
        y.data_ptr(),
        rows,
        weight.shape[0],
        in_features,
        scale.shape[1],
        torch.get_num_threads(),
    )
    return y.to(x.dtype)


@cpp_kernel("quantized_linear")
def quantized_linear_cpu(x, weight, scale, bias=None):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_quantized_linear_args(x, weight, scale, bias)
    return _quantized_linear(x, weight, scale, bias)


