"""The activations of ``ssmcc.ops.activations`` as a Triton device function, by code.

``activate(x, ACTIVATION)`` with ``ACTIVATION`` a compile-time constant (``FORMS`` index)::

    0 identity   x
    1 silu       x / (1 + exp(-x))
    2 gelu       0.5 x (1 + erf(x / sqrt(2)))
    3 gelu_tanh  0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)),  u = sqrt(2/pi) (x + 0.044715 x^3)
    4 relu       max(x, 0)
    5 relu2      max(x, 0)^2

Kernels call it as ``activations.activate`` (through the module, so the function is no kernel of
the calling module's), with the code as a constexpr: a specialisation holds one form's code only.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def activate(x, ACTIVATION: tl.constexpr):
    """``FORMS[ACTIVATION]`` applied to ``x`` (float32)."""
    y = x
    if ACTIVATION == 1:
        y = x / (1.0 + tl.exp(-x))
    elif ACTIVATION == 2:
        y = 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == 3:
        inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
        y = x / (1.0 + tl.exp(-2.0 * inner))
    elif ACTIVATION == 4:
        y = tl.maximum(x, 0.0)
    elif ACTIVATION == 5:
        y = tl.maximum(x, 0.0) * tl.maximum(x, 0.0)
    return y
