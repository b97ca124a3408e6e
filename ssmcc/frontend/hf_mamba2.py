"""Routing of Hugging Face Mamba-2 mixers to the ssmcc ops: Mamba2 and the Mamba-2 layers of the
hybrids (Bamba, NemotronH, Zamba2, GraniteMoeHybrid, FalconH1).

Their modelling files carry text-identical module-level ``causal_conv1d_fn`` and
``mamba2_chunk_scan`` (the whole-sequence path capture runs), and a gated RMSNorm class. During
capture ``causal_conv1d_fn`` becomes ``ssmcc.causal_conv1d``, ``mamba2_chunk_scan`` becomes
``ssmcc.ssd_scan`` (no padding to a multiple of the chunk size, so the length stays free), and
the gated norm's ``forward`` becomes ``ssmcc.rmsnorm_gated``; each keeps Hugging Face's
signature and semantics. Decode programs are derived from the state contracts, not from HF's
cache path (see ``ssmcc.ops.ssd_scan`` on the dt clamp, which HF's decode path skips).
"""

from __future__ import annotations

import math

import torch

from ssmcc.frontend.hf_mamba1 import causal_conv1d_fn
from ssmcc.frontend.route import Route, record_routed_call


def mamba2_chunk_scan(
    hidden_states,
    dt,
    A,
    B,
    C,
    chunk_size=None,
    D=None,
    dt_bias=None,
    initial_states=None,
    dt_softplus=False,
    dt_limit=(0.0, math.inf),
    return_final_states=False,
    z=None,
    **kwargs,
):
    """HF ``mamba2_chunk_scan(x (b,l,h,p), dt (b,l,h), A (h,), B/C (b,l,g,n), ...)``; the result
    does not depend on ``chunk_size``."""
    record_routed_call("ssd_scan")
    out, final_state = torch.ops.ssmcc.ssd_scan(
        hidden_states,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        dt_softplus,
        float(dt_limit[0]),
        None if math.isinf(dt_limit[1]) else float(dt_limit[1]),
        initial_states,
    )
    return (out, final_state) if return_final_states else out


def _group_size(norm, width: int) -> int:
    if hasattr(norm, "group_size"):  # Mamba2, Bamba, NemotronH, Zamba2, GraniteMoeHybrid
        return int(norm.group_size)
    return width // int(norm.n_groups)  # FalconH1


def rmsnorm_gated_forward(self, hidden_states, gate=None):
    """The gated norm modules' ``forward(hidden_states, gate=None)`` as ``ssmcc.rmsnorm_gated``."""
    record_routed_call("rmsnorm_gated")
    width = hidden_states.shape[-1]
    return torch.ops.ssmcc.rmsnorm_gated(
        hidden_states,
        gate,
        self.weight,
        _group_size(self, width),
        float(self.variance_epsilon),
        bool(getattr(self, "norm_before_gate", False)),
    )


def _route(name: str, family: str, mixer: str, norm: str) -> Route:
    return Route(
        name=f"hf-{name}",
        module=f"transformers.models.{family}.modeling_{family}",
        mixer_classes=(mixer,),
        replacements={
            "causal_conv1d_fn": causal_conv1d_fn,
            "mamba2_chunk_scan": mamba2_chunk_scan,
            f"{norm}.forward": rmsnorm_gated_forward,
        },
    )


ROUTES = (
    _route("mamba2", "mamba2", "Mamba2Mixer", "MambaRMSNormGated"),
    _route("bamba", "bamba", "BambaMixer", "BambaRMSNormGated"),
    _route("nemotron-h", "nemotron_h", "NemotronHMamba2Mixer", "NemotronHRMSNormGated"),
    _route("zamba2", "zamba2", "Zamba2MambaMixer", "Zamba2RMSNormGated"),
    _route(
        "granite-moe-hybrid",
        "granitemoehybrid",
        "GraniteMoeHybridMambaLayer",
        "GraniteMoeHybridRMSNormGated",
    ),
    _route("falcon-h1", "falcon_h1", "FalconH1Mixer", "FalconH1RMSNormGated"),
)
