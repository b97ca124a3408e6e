"""Device functions for the operands of ``tl.dot`` on tensor cores.

``mma_operand(v, DOT, WIDEN)`` is ``v`` rounded to the products' dtype: ``DOT`` "bf16" or "fp16"
(to nearest, ties to even: the GPU's ``cvt.rn``), "fp32" unchanged. A 16-bit MMA multiplies such
operands exactly and sums in float32, so a product's only error is the operand's rounding: half an
ulp, at most 2^-8 ~ 3.9e-3 relative for bfloat16 and 2^-11 ~ 4.9e-4 for float16.

``WIDEN`` (bfloat16 in Triton's interpreter only, never compiled): the interpreter's ``tl.dot``
multiplies bfloat16 tiles as their raw 16-bit patterns (triton 3.9's ``create_dot`` widens only
fp8 operands) and its float32 -> bfloat16 cast truncates. There the operand is rounded to the
nearest bfloat16 on its float32 bits (add 0x7FFF plus the kept part's lowest bit, clear the low 16
bits; finite values) and stays float32: the same values, multiplied exactly, summed in float32.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma_operand(v, DOT: tl.constexpr, WIDEN: tl.constexpr):
    if WIDEN:
        bits = v.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        rounded = bits.to(tl.float32, bitcast=True)
    elif DOT == "bf16":
        rounded = v.to(tl.bfloat16)
    elif DOT == "fp16":
        rounded = v.to(tl.float16)
    else:
        rounded = v.to(tl.float32)
    return rounded
