"""The decode-time matrix-vector kernel (``gemv.h``) as ``linear(x, weight, bias)``.

``x`` (..., K) float32 with few rows (one token per sequence), ``weight`` (N, K) and ``bias``
(N,) float32: returns ``x W^T + b`` (..., N). Non-contiguous operands are copied first; the
weight of a lowered program is a contiguous attribute, so nothing is copied in decode.
"""

from __future__ import annotations

import functools
import math

import torch

from ssmcc.kernels.cpu.native import as_f32, call_kernel, pointer

# Up to this many rows of x the GEMV kernel (8 weight rows x 3 rows of x per tile) beats a GEMM:
# on AMD EPYC Zen 4, 2 threads, mamba2-130m's decode weights, 16 rows took 17.3 ms against oneDNN's
# 19.7 (equal at 32), and in ONNX Runtime (weights unpacked, as ssmcc's sessions run) 17.8 ms
# against MatMul's 24.6.
GEMV_MAX_ROWS = 16
# The products whose few-row kernels were measured only up to 8 rows: int8/16-bit weights
# (gemv_quantized.h: rows of x one by one or in fours) and a MoE layer's experts node.
SMALL_KERNEL_MAX_ROWS = 8


def linear_cpu(x, weight, bias=None):
    in_features = x.shape[-1]
    rows = math.prod(x.shape[:-1])  # from the shape: at in_features 0 the kernel writes the bias
    x, weight, bias = as_f32(x), as_f32(weight), as_f32(bias)
    y = torch.empty(*x.shape[:-1], weight.shape[0], dtype=torch.float32)
    call_kernel(
        "ssmcc_linear_f32",
        x.data_ptr(),
        weight.data_ptr(),
        pointer(bias),
        y.data_ptr(),
        rows,
        weight.shape[0],
        in_features,
        torch.get_num_threads(),
    )
    return y


@functools.cache
def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def dense_linear(x, weight, bias=None):
    """``x W^T + b`` for many rows: oneDNN (``mkldnn._linear_pointwise``, the primitive inductor's
    CPU freezing uses; MKL's sgemm takes a slow path on AMD processors), else ``F.linear``."""
    if onednn_available() and x.dtype == torch.float32:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return torch.nn.functional.linear(x, weight, bias)
