"""Tiny configs of the hybrid families (attention, MLP and Mamba layers in one model), for the
presets and the tests: each has every kind of layer its family mixes, grouped K/V heads (where the
family has them), rotary embeddings (where it uses them) and several Mamba heads in two groups.

``HYBRIDS`` maps a preset name to (config class, model class, config keywords, description).
"""

from __future__ import annotations

_COMMON = dict(vocab_size=512, hidden_size=64, tie_word_embeddings=False)
_MAMBA2 = dict(mamba_n_heads=8, mamba_d_head=16, mamba_n_groups=2, mamba_d_state=16)

HYBRIDS: dict[str, tuple[str, str, dict, str]] = {
    "bamba-tiny": (
        "BambaConfig",
        "BambaForCausalLM",
        dict(
            _COMMON,
            **_MAMBA2,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            attn_layer_indices=[1, 3],
            mamba_chunk_size=16,
            mamba_expand=2,
        ),
        "Bamba: Mamba-2 and attention (4 heads, 2 K/V heads, RoPE) layers with MLPs, 4 layers",
    ),
    "jamba-tiny": (
        "JambaConfig",
        "JambaForCausalLM",
        dict(
            _COMMON,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_experts=4,
            num_experts_per_tok=2,
            expert_layer_period=2,
            expert_layer_offset=1,
            attn_layer_period=4,
            attn_layer_offset=2,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=8,
        ),
        "Jamba: Mamba-1 and attention (no positional embedding) layers, MoE (4 experts, top 2) "
        "every other layer, 4 layers",
    ),
    "granite-hybrid-tiny": (
        "GraniteMoeHybridConfig",
        "GraniteMoeHybridForCausalLM",
        dict(
            _COMMON,
            **_MAMBA2,
            intermediate_size=96,
            num_hidden_layers=4,
            num_attention_heads=4,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            shared_intermediate_size=64,
            position_embedding_type="rope",
            layer_types=["mamba", "attention", "mamba", "attention"],
            mamba_chunk_size=16,
            embedding_multiplier=2.0,
            logits_scaling=1.5,
            residual_multiplier=0.7,
            attention_multiplier=0.3,
        ),
        "GraniteMoeHybrid: Mamba-2 and attention (RoPE) layers, each with MoE (4 experts, top 2) "
        "and a shared expert, muP multipliers, 4 layers",
    ),
    "nemotron-h-tiny": (
        "NemotronHConfig",
        "NemotronHForCausalLM",
        dict(
            _COMMON,
            layers_block_type=["mamba", "attention", "moe", "mamba", "mlp"],
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            ssm_state_size=16,
            mamba_num_heads=8,
            mamba_head_dim=16,
            n_groups=2,
            chunk_size=16,
            expand=2,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            moe_intermediate_size=48,
            moe_shared_expert_intermediate_size=48,
            n_group=1,
            topk_group=1,
        ),
        "NemotronH: Mamba-2, attention (no positional embedding), MoE (4 relu2 experts, top 2, "
        "a shared expert) and MLP blocks, 5 blocks",
    ),
    "zamba-tiny": (
        "ZambaConfig",
        "ZambaForCausalLM",
        dict(
            _COMMON,
            intermediate_size=96,
            num_hidden_layers=4,
            attention_hidden_size=128,
            num_attention_heads=4,
            attention_head_dim=32,
            num_key_value_heads=4,
            n_mamba_heads=2,
            attn_layer_period=2,
            attn_layer_offset=1,
            mamba_d_state=8,
            mamba_d_conv=4,
            mamba_expand=2,
            mamba_dt_rank=8,
        ),
        "Zamba: Mamba-1 layers (2 scans each) and a shared attention block, 4 layers",
    ),
    "zamba2-tiny": (
        "Zamba2Config",
        "Zamba2ForCausalLM",
        dict(
            _COMMON,
            num_hidden_layers=4,
            layers_block_type=["mamba", "hybrid", "mamba", "hybrid"],
            mamba_d_state=16,
            mamba_ngroups=2,
            n_mamba_heads=8,
            chunk_size=16,
            intermediate_size=96,
            num_attention_heads=4,
            num_key_value_heads=4,
            num_mem_blocks=1,
            use_mem_rope=True,
        ),
        "Zamba2: Mamba-2 layers and a shared transformer block with RoPE, 4 layers",
    ),
    "falcon-h1-tiny": (
        "FalconH1Config",
        "FalconH1ForCausalLM",
        dict(
            _COMMON,
            **_MAMBA2,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            mamba_d_ssm=128,
            mamba_chunk_size=16,
            mamba_rms_norm=True,
        ),
        "FalconH1: attention (RoPE) and Mamba-2 in parallel in every layer, muP multipliers, "
        "3 layers",
    ),
}
