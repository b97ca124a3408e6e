"""The ssmcc op library: ``torch.library`` custom ops in the ``ssmcc`` namespace.

Each op has a schema, a pure-PyTorch reference (``*_ref``, the oracle), a fake implementation
(shape rules on symbolic sizes) and a docstring with shapes and math. Importing this package
registers the ops as ``torch.ops.ssmcc.<name>``. Backends register kernels against these ops; this
package imports no pass, lowering or kernel.
"""

from ssmcc.ops.attention import attention, attention_ref
from ssmcc.ops.causal_conv1d import (
    causal_conv1d,
    causal_conv1d_ref,
    causal_conv1d_update,
    causal_conv1d_update_ref,
)
from ssmcc.ops.mamba_mixer import (
    mamba_mixer,
    mamba_mixer_ref,
    mamba_mixer_step,
    mamba_mixer_step_ref,
)
from ssmcc.ops.moe_experts import moe_experts, moe_experts_ref
from ssmcc.ops.positions import positions, positions_ref
from ssmcc.ops.quantized_linear import (
    quantized_embedding,
    quantized_embedding_ref,
    quantized_linear,
    quantized_linear_ref,
)
from ssmcc.ops.rmsnorm_gated import rmsnorm_gated, rmsnorm_gated_ref
from ssmcc.ops.selective_scan import selective_scan, selective_scan_ref
from ssmcc.ops.selective_state_update import selective_state_update, selective_state_update_ref
from ssmcc.ops.ssd_mixer import ssd_mixer, ssd_mixer_ref, ssd_mixer_step, ssd_mixer_step_ref
from ssmcc.ops.ssd_scan import ssd_scan, ssd_scan_ref
from ssmcc.ops.ssd_state_update import ssd_state_update, ssd_state_update_ref

# The OpOverloads as they appear in captured graphs, by short name.
SSMCC_OPS = {
    "selective_scan": selective_scan._opoverload,
    "selective_state_update": selective_state_update._opoverload,
    "causal_conv1d": causal_conv1d._opoverload,
    "causal_conv1d_update": causal_conv1d_update._opoverload,
    "ssd_scan": ssd_scan._opoverload,
    "ssd_state_update": ssd_state_update._opoverload,
    "rmsnorm_gated": rmsnorm_gated._opoverload,
    "ssd_mixer": ssd_mixer._opoverload,
    "ssd_mixer_step": ssd_mixer_step._opoverload,
    "mamba_mixer": mamba_mixer._opoverload,
    "mamba_mixer_step": mamba_mixer_step._opoverload,
    "attention": attention._opoverload,
    "positions": positions._opoverload,
    "moe_experts": moe_experts._opoverload,
    "quantized_linear": quantized_linear._opoverload,
    "quantized_embedding": quantized_embedding._opoverload,
}
# Each op's pure-PyTorch reference: the oracle, and the fallback wherever no kernel runs.
SSMCC_REFERENCES = {
    "selective_scan": selective_scan_ref,
    "selective_state_update": selective_state_update_ref,
    "causal_conv1d": causal_conv1d_ref,
    "causal_conv1d_update": causal_conv1d_update_ref,
    "ssd_scan": ssd_scan_ref,
    "ssd_state_update": ssd_state_update_ref,
    "rmsnorm_gated": rmsnorm_gated_ref,
    "ssd_mixer": ssd_mixer_ref,
    "ssd_mixer_step": ssd_mixer_step_ref,
    "mamba_mixer": mamba_mixer_ref,
    "mamba_mixer_step": mamba_mixer_step_ref,
    "attention": attention_ref,
    "positions": positions_ref,
    "moe_experts": moe_experts_ref,
    "quantized_linear": quantized_linear_ref,
    "quantized_embedding": quantized_embedding_ref,
}


def is_ssmcc_op(target) -> bool:
    """True for an OpOverload in the ``ssmcc`` namespace."""
    return getattr(target, "namespace", None) == "ssmcc"


__all__ = [
    "attention",
    "attention_ref",
    "moe_experts",
    "moe_experts_ref",
    "positions",
    "positions_ref",
    "quantized_embedding",
    "quantized_embedding_ref",
    "quantized_linear",
    "quantized_linear_ref",
    "mamba_mixer",
    "mamba_mixer_ref",
    "mamba_mixer_step",
    "mamba_mixer_step_ref",
    "rmsnorm_gated",
    "rmsnorm_gated_ref",
    "ssd_mixer",
    "ssd_mixer_ref",
    "ssd_mixer_step",
    "ssd_mixer_step_ref",
    "ssd_scan",
    "ssd_scan_ref",
    "ssd_state_update",
    "ssd_state_update_ref",
    "SSMCC_OPS",
    "SSMCC_REFERENCES",
    "causal_conv1d",
    "causal_conv1d_ref",
    "causal_conv1d_update",
    "causal_conv1d_update_ref",
    "is_ssmcc_op",
    "selective_scan",
    "selective_scan_ref",
    "selective_state_update",
    "selective_state_update_ref",
]
