"""Routing of Hugging Face Mamba-1 mixers (Mamba, FalconMamba, and the Mamba layers of the hybrids
Jamba and Zamba) to the ssmcc ops.

transformers' Mamba-1 mixers call module-level functions at call time. Capture runs the
whole-sequence (no cache) path, which calls ``causal_conv1d_fn`` and ``mamba_selective_scan``;
during capture those globals are swapped for the functions below, which keep Hugging Face's
signatures and semantics and call one ssmcc op each, so the exported graph holds one
``causal_conv1d`` and one ``selective_scan`` node per layer instead of a Python loop unrolled over
the sequence. (Decode graphs are derived from the captured program by a pass, not by routing
Hugging Face's cache path.)
"""

from __future__ import annotations

import torch

from ssmcc.frontend.route import Route, record_routed_call


def causal_conv1d_fn(hidden_states, weight, bias=None, activation=None, **kwargs):
    """HF ``causal_conv1d_fn(x (b,d,l), weight (d,k), bias, activation)`` -> (b,d,l)."""
    record_routed_call("causal_conv1d")
    out, _ = torch.ops.ssmcc.causal_conv1d(hidden_states, weight, bias, None, activation)
    return out


def mamba_selective_scan(
    hidden_states,
    dt,
    A,
    B,
    C,
    D=None,
    z=None,
    delta_bias=None,
    delta_softplus=False,
    return_last_state=False,
    **kwargs,
):
    """HF ``mamba_selective_scan`` (mamba_ssm's ``selective_scan_fn`` signature)."""
    record_routed_call("selective_scan")
    out, last_state = torch.ops.ssmcc.selective_scan(
        hidden_states, dt, A, B, C, D, z, delta_bias, delta_softplus, None
    )
    return (out, last_state.to(hidden_states.dtype)) if return_last_state else out


_REPLACEMENTS = {
    "causal_conv1d_fn": causal_conv1d_fn,
    "mamba_selective_scan": mamba_selective_scan,
}

ROUTES = (
    Route(
        name="hf-mamba",
        module="transformers.models.mamba.modeling_mamba",
        mixer_classes=("MambaMixer",),
        replacements=_REPLACEMENTS,
    ),
    Route(
        name="hf-falcon-mamba",
        module="transformers.models.falcon_mamba.modeling_falcon_mamba",
        mixer_classes=("FalconMambaMixer",),
        replacements=_REPLACEMENTS,
    ),
    Route(
        name="hf-jamba",
        module="transformers.models.jamba.modeling_jamba",
        mixer_classes=("JambaMambaMixer",),
        replacements=_REPLACEMENTS,
    ),
    Route(
        name="hf-zamba",
        module="transformers.models.zamba.modeling_zamba",
        mixer_classes=("ZambaMambaMixer",),
        replacements=_REPLACEMENTS,
    ),
)
