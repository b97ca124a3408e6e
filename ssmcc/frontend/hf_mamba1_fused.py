"""Hugging Face's Mamba-1 mixers as one fused op between their projections, for ``torch.compile``.

``ssmcc.enable_routes(model)`` (not capture: capture routes the conv and the scan and lets
``fuse_scan_norm_mlp`` fuse them, so that the step program can be derived) replaces the whole-
sequence forward of ``MambaMixer`` and ``FalconMambaMixer`` by::

    zx = in_proj(hidden_states)                                           (b, l, 2d)
    y  = ssmcc.mamba_mixer(zx, conv, x_proj, dt_proj, A = -exp(A_log), D, dt_bias,
                           x at [0, d), z at [d, 2d), act, softplus, bcdt_rms_eps)[0]
    out = out_proj(y)                                                     (b, l, hidden)

which is the mixer's own chain (``ssmcc.ops.mamba_mixer`` states the math; FalconMamba's
weightless norms of dt, B and C are its ``bcdt_rms_eps``). In the graph Dynamo hands the backend
the layer is then two matmuls and one op: no transposed copies of the activation for the conv
and the scan, x_proj and dt_proj inside the op (mamba-130m at L=2048 spent a quarter of its time
on those copies and on dt_proj as a batched matmul).

A call with a cache, an attention mask or in training mode runs Hugging Face's forward (with the
op-level routes): generation's cached steps and padded batches are unchanged.
"""

from __future__ import annotations

import torch

# (module, mixer class) -> the mixer's attribute holding the weightless dt/B/C norms' eps, or None
FUSED_MIXERS = {
    ("transformers.models.mamba.modeling_mamba", "MambaMixer"): None,
    ("transformers.models.falcon_mamba.modeling_falcon_mamba", "FalconMambaMixer"): "rms_eps",
}


def fused_forward(original, eps_attribute: str | None):
    """A mixer ``forward`` that runs ``ssmcc.mamba_mixer`` on the whole-sequence path and
    ``original`` otherwise."""

    def forward(self, hidden_states, cache=None, attention_mask=None, **kwargs):
        if (
            cache is not None
            or kwargs.get("cache_params") is not None
            or attention_mask is not None
            or self.training
        ):
            return original(self, hidden_states, cache, attention_mask, **kwargs)
        d = self.intermediate_size
        zx = self.in_proj(hidden_states)
        y = torch.ops.ssmcc.mamba_mixer(
            zx,
            self.conv1d.weight.squeeze(1),
            self.conv1d.bias if self.use_conv_bias else None,
            self.x_proj.weight,
            self.dt_proj.weight,
            -torch.exp(self.A_log.float()),
            self.D.float(),
            self.dt_proj.bias.float() if self.dt_proj.bias is not None else None,
            0,
            d,
            self.activation,
            True,
            getattr(self, eps_attribute) if eps_attribute else None,
        )[0]
        return self.out_proj(y.to(hidden_states.dtype))

    forward.__wrapped__ = original
    return forward
