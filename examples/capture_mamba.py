"""Capture a Hugging Face Mamba with ssmcc and run it at lengths it was not traced at.

    python examples/capture_mamba.py

Builds a small MambaForCausalLM with random weights (nothing is downloaded), compiles it for the
torch target, and compares logits with the model's own eager forward at several shapes.
"""

import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmcc


def main() -> None:
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=1000, hidden_size=64, state_size=16, num_hidden_layers=2)
    model = MambaForCausalLM(config).eval()

    compiled = ssmcc.compile(model, target="torch")
    print(compiled.report.format())
    print()
    for batch, length in [(1, 1), (2, 37), (1, 500)]:
        ids = torch.randint(0, config.vocab_size, (batch, length))
        with torch.no_grad():
            expected = model(ids).logits
        diff = (compiled(ids) - expected).abs().max().item()
        print(f"batch {batch} length {length:4d}: max |logits - HF eager| = {diff:.2e}")


if __name__ == "__main__":
    main()
