"""Routing of Hugging Face mixture-of-experts layers to ``ssmcc.moe_experts``: Jamba's,
GraniteMoeHybrid's and NemotronH's experts.

Their experts classes are wrapped by transformers' ``use_experts_implementation``: ``forward(
hidden (t, d), top_k_index (t, k), top_k_weights (t, k))`` dispatches to an implementation that
either loops over the experts hit (data-dependent: torch.export fails on it) or groups tokens
with ``transformers::grouped_mm_fallback``, an op no runtime but PyTorch has. During capture the
class's ``forward`` becomes one ``ssmcc.moe_experts`` call on the layer's expert weights. The
router (linear, softmax, top-k) is captured as HF computes it.
"""

from __future__ import annotations

import torch

from ssmcc.errors import CaptureError
from ssmcc.frontend.route import Route, record_routed_call

# transformers' activation classes (ACT2FN) -> ssmcc.moe_experts activations
_ACTIVATIONS = {
    "SiLUActivation": "silu",
    "SiLU": "silu",
    "GELUActivation": "gelu",
    "GELU": "gelu",
    "PytorchGELUTanh": "gelu_tanh",
    "GELUTanh": "gelu_tanh",
    "NewGELUActivation": "gelu_tanh",
    "FastGELUActivation": "gelu_tanh",  # the same function factored (ssmcc.ops.activations)
    "AccurateGELUActivation": "gelu_tanh",
    "ReLU": "relu",
    "ReLUSquaredActivation": "relu2",
}


def _activation(experts) -> str:
    name = type(experts.act_fn).__name__
    if name not in _ACTIVATIONS:
        raise CaptureError(
            f"{type(experts).__name__}: activation {name} has no ssmcc.moe_experts form "
            f"(supported: {', '.join(sorted(_ACTIVATIONS))}); capture with route=False"
        )
    return _ACTIVATIONS[name]


def experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """An experts module's ``forward`` as one ``ssmcc.moe_experts`` call."""
    unsupported = [
        flag
        for flag, value in (
            ("expert biases", getattr(self, "has_bias", False)),
            ("a post-expert norm", getattr(self, "has_post_expert_norm", False)),
            ("interleaved gate/up rows", not getattr(self, "is_concatenated", True)),
        )
        if value
    ]
    if unsupported:
        raise CaptureError(
            f"{type(self).__name__} has {', '.join(unsupported)}, which ssmcc.moe_experts does "
            "not compute; capture with route=False"
        )
    gated = bool(getattr(self, "has_gate", True))
    up = self.gate_up_proj if gated else self.up_proj
    down = self.down_proj
    if getattr(self, "is_transposed", False):  # stored (E, in, out)
        up, down = up.transpose(1, 2), down.transpose(1, 2)
    record_routed_call("moe_experts")
    return torch.ops.ssmcc.moe_experts(
        hidden_states, top_k_index, top_k_weights, up, down, _activation(self), gated
    )


def _route(name: str, family: str, experts_class: str) -> Route:
    return Route(
        name=f"hf-{name}-experts",
        module=f"transformers.models.{family}.modeling_{family}",
        mixer_classes=(),
        replacements={f"{experts_class}.forward": experts_forward},
    )


ROUTES = (
    _route("jamba", "jamba", "JambaExperts"),
    _route("granite-moe-hybrid", "granitemoehybrid", "GraniteMoeHybridExperts"),
    _route("nemotron-h", "nemotron_h", "NemotronHExperts"),
)
