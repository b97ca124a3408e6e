"""Long prompts in bounded memory, and a shared system prompt computed once.

    python examples/prefix_cache.py

Prefill runs a prompt in chunks (``chunk_size`` tokens, states carried from chunk to chunk), so
memory does not grow with the prompt. A ``PrefixCache`` keeps the state at every chunk boundary
of the prompts it has seen; a later prompt that starts the same way restarts from the longest
cached prefix and computes only the rest.
"""

import time

import torch
from transformers import MambaConfig, MambaForCausalLM

import ssmcc


def main() -> None:
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=1000, hidden_size=128, num_hidden_layers=4)
    model = MambaForCausalLM(config).eval()
    compiled = ssmcc.compile(model, target="torch", chunk_size=64)

    long = torch.randint(0, 1000, (1, 8192))
    started = time.perf_counter()
    last, state = compiled.prefill(long, last_only=True)  # (1, vocab): no (1, 8192, vocab) logits
    print(f"8192-token prompt in chunks of 64: {time.perf_counter() - started:.2f}s, {state}")

    cache = ssmcc.PrefixCache(max_bytes=256 << 20)
    system = torch.randint(0, 1000, (1, 1024))  # a system prompt every request starts with
    for turn in range(3):
        question = torch.randint(0, 1000, (1, 40))
        prompt = torch.cat([system, question], dim=1)
        started = time.perf_counter()
        tokens = compiled.generate(prompt, 8, prefix_cache=cache)
        seconds = time.perf_counter() - started
        print(f"turn {turn}: {seconds * 1e3:.0f} ms, new tokens {tokens[0, -8:].tolist()}")
        assert torch.equal(tokens, compiled.generate(prompt, 8))  # the cache changes no token
    print(cache)


if __name__ == "__main__":
    main()
