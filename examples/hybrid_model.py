"""Compile a hybrid model (Mamba-2, attention and mixture-of-experts layers) and stream from it.

    python examples/hybrid_model.py [OUT_DIR]

A GraniteMoeHybrid built from a small config (random weights): its Mamba-2 layers become ssmcc
SSM ops, its attention ``ssmcc.attention`` (the K/V cache is a state that grows by one position
per token), its rotary positions ``ssmcc.positions`` (a counter state) and its experts
``ssmcc.moe_experts``. The ONNX artifact runs in any onnxruntime; the state after a prompt holds
the SSM states, the K/V caches and the position counter, and decoding continues from it.
"""

import sys
import tempfile

import torch
from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

import ssmcc
from ssmcc.runtime.memory_plan import MemoryPlan


def main() -> None:
    out = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="ssmcc-example-") + "/h"
    torch.manual_seed(0)
    config = GraniteMoeHybridConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        shared_intermediate_size=64,
        position_embedding_type="rope",
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=2,
        mamba_d_state=16,
        mamba_chunk_size=16,
    )
    model = GraniteMoeHybridForCausalLM(config).eval()
    compiled = ssmcc.compile(model, target="onnx")
    print("ssmcc ops:", compiled.report.op_counts)
    compiled.save(out, overwrite=True)
    loaded = ssmcc.load(out)

    prompt = torch.tensor([[11, 22, 33, 44, 55]])
    logits, state = loaded.prefill(prompt)
    for name, tensor in state.items():
        print(f"  state {name}: {tuple(tensor.shape)} {tensor.dtype}")
    print("greedy:", loaded.generate(prompt, 12)[0, prompt.shape[1] :].tolist())

    # Memory of 8 sequences of 4096 tokens: unpadded here, and in vLLM's paged hybrid cache.
    for line in MemoryPlan.of(loaded.state_specs, context=4096, batch=8).lines():
        print(line)


if __name__ == "__main__":
    main()
