"""The activations ssmcc's ops apply, defined once: a name -> its form -> the form's math.

An op that applies an activation (the conv of ``causal_conv1d`` / ``causal_conv1d_update`` and of
the fused mixers, the experts of ``moe_experts``) takes it by name. Hugging Face's mixers pass
their config's ``hidden_act`` (``mamba_hidden_act``, ``hidden_mamba_act``) to the conv, and
transformers' ``ACT2FN`` gives several names one function; each name here maps to one form::

    code  form        math                                           names
    0     identity    x                                              None, identity, linear
    1     silu        x * sigmoid(x)                                 silu, swish
    2     gelu        0.5 x (1 + erf(x / sqrt(2)))                   gelu, gelu_python
    3     gelu_tanh   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))  gelu_tanh, gelu_new,
                                                                     gelu_pytorch_tanh,
                                                                     gelu_python_tanh,
                                                                     gelu_fast, gelu_accurate
    4     relu        max(x, 0)                                      relu
    5     relu2       max(x, 0)^2                                    relu2

transformers' tanh forms are one function written four ways: ``gelu_new`` and ``gelu_accurate``
as above, ``gelu_pytorch_tanh`` torch's ``gelu(approximate="tanh")`` (the same formula in C++),
``gelu_fast`` as ``0.5 x (1 + tanh(0.7978845608 x (1 + 0.044715 x^2)))`` — the same polynomial
factored, and 0.7978845608 is sqrt(2/pi) to ten digits (the same float32). They differ by float
rounding only (a few 1e-7 in float32). The code is what kernels take (an int argument, an ONNX
attribute, a Triton constexpr); codes 0 and 1 are those of the identity / silu flag ssmcc's
kernels and ONNX nodes carried before the other forms, so artifacts written then read the same.
Any other name (``mish``, ``gelu_10``, ...) is refused with the list of supported names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

FORMS = ("identity", "silu", "gelu", "gelu_tanh", "relu", "relu2")  # index = code
NAMES: dict[str | None, str] = {
    None: "identity",
    "identity": "identity",
    "linear": "identity",
    "silu": "silu",
    "swish": "silu",
    "gelu": "gelu",
    "gelu_python": "gelu",
    "gelu_tanh": "gelu_tanh",
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu_python_tanh": "gelu_tanh",
    "gelu_fast": "gelu_tanh",
    "gelu_accurate": "gelu_tanh",
    "relu": "relu",
    "relu2": "relu2",
}
SUPPORTED = tuple(name for name in NAMES if name is not None)
GELU_TANH_SCALE = 0.7978845608028654  # sqrt(2 / pi)
GELU_TANH_CUBIC = 0.044715


def supported_list() -> str:
    """The names an op takes, for messages: ``None (identity), silu, swish, ...``."""
    return ", ".join(["None (identity)", *SUPPORTED])


def is_supported(name) -> bool:
    return isinstance(name, str | None) and name in NAMES


def form_of(op: str, name: str | None) -> str:
    """The form of ``name``; an unknown name fails naming the op and the supported names."""
    if not is_supported(name):  # kernels call this per step: no work on success
        torch._check(
            False,
            lambda: (
                f"ssmcc.{op}: activation {name!r} is not supported; use one of {supported_list()}"
            ),
        )
    return NAMES[name]


def activation_code(op: str, name: str | None) -> int:
    """The kernels' code of ``name`` (the table above), checked."""
    return FORMS.index(form_of(op, name))


def activate(x: Tensor, form: str) -> Tensor:
    """``form`` (one of ``FORMS``) applied to ``x``, in x's dtype."""
    if form == "silu":
        return F.silu(x)
    if form == "gelu":
        return F.gelu(x)
    if form == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if form == "relu":
        return F.relu(x)
    if form == "relu2":
        return F.relu(x).square()
    return x


def apply_activation(op: str, x: Tensor, name: str | None) -> Tensor:
    """The activation ``name`` of op ``op`` applied to ``x`` (checked)."""
    return activate(x, form_of(op, name))
