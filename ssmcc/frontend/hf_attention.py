"""Routing of Hugging Face attention layers to ``ssmcc.attention``, and their positions to
``ssmcc.positions``: the attention and rotary embeddings of the hybrid families.

The attention modules of Jamba, Bamba, NemotronH, Zamba, Zamba2, GraniteMoeHybrid and FalconH1
compute their projections and rotary embeddings, then call
``ALL_ATTENTION_FUNCTIONS.get_interface(config._attn_implementation, eager_attention_forward)``
with ``(module, query (b, h, l, d), key (b, g, l, d), value, attention_mask, scaling=...)`` and
expect ``(out (b, l, h, e), weights)``. During capture the modelling module's
``ALL_ATTENTION_FUNCTIONS`` is swapped for a table whose every entry is ``attention_forward``:
one ``ssmcc.attention`` node per layer, causal by construction (the mask HF builds goes unused
and the dead-code pass removes it), carrying its K/V cache through the op's state contract.

Rotary embeddings read ``position_ids``. Capture feeds them from ``ssmcc.positions`` (a position
counter with a state) instead of HF's ``arange(l)``, so the chunk and step programs continue the
numbering where the cache left off. Models without rotary embeddings ignore them.
"""

from __future__ import annotations

import torch

from ssmcc.errors import CaptureError
from ssmcc.frontend.route import Route, record_routed_call


def _layer_name(module) -> str:
    index = getattr(module, "layer_idx", None)
    return f"{type(module).__name__}" + (f" (layer {index})" if index is not None else "")


def attention_forward(
    module, query, key, value, attention_mask=None, scaling=None, dropout=0.0, **kwargs
):
    """HF's attention-function signature as one ``ssmcc.attention`` call (causal, no mask)."""
    if kwargs.get("sliding_window") is not None or getattr(module, "sliding_window", None):
        raise CaptureError(
            f"{_layer_name(module)} uses sliding-window attention, which ssmcc.attention does "
            "not compute yet; capture the model with route=False to keep HF's attention"
        )
    if getattr(module, "is_causal", True) is False:
        raise CaptureError(
            f"{_layer_name(module)} is not causal; ssmcc.attention computes causal attention only"
        )
    record_routed_call("attention")
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    out, _, _ = torch.ops.ssmcc.attention(query, key, value, scale)
    return out.transpose(1, 2), None


class AttentionFunctions:
    """Stands in for a modelling module's ``ALL_ATTENTION_FUNCTIONS`` during capture: every
    implementation name resolves to ``attention_forward``."""

    def get_interface(self, attn_implementation, default):
        return attention_forward

    def __getitem__(self, name):
        return attention_forward

    def __contains__(self, name):
        return True

    def get(self, name, default=None):
        return attention_forward


ATTENTION_FUNCTIONS = AttentionFunctions()


def _route(name: str, family: str, attention_class: str) -> Route:
    return Route(
        name=f"hf-{name}-attention",
        module=f"transformers.models.{family}.modeling_{family}",
        mixer_classes=(),
        replacements={"ALL_ATTENTION_FUNCTIONS": ATTENTION_FUNCTIONS},
        attention_classes=(attention_class,),
    )


ROUTES = (
    _route("jamba", "jamba", "JambaAttention"),
    _route("bamba", "bamba", "BambaAttention"),
    _route("nemotron-h", "nemotron_h", "NemotronHAttention"),
    _route("zamba", "zamba", "ZambaAttention"),
    _route("zamba2", "zamba2", "Zamba2Attention"),
    _route("granite-moe-hybrid", "granitemoehybrid", "GraniteMoeHybridAttention"),
    _route("falcon-h1", "falcon_h1", "FalconH1Attention"),
)
