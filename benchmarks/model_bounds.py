"""What a model must at least do per token, and the speed bounds that follow on this machine.

- prefill: matmul FLOPs per token = 2 x (weights of every nn.Linear, the LM head included); the
  scan, conv and norms are a few percent on top and are not counted. Bound (tokens/s) =
  measured matmul FLOP/s / FLOPs per token.
- decode: bytes of weights read per token = every distinct parameter once (an untied input
  embedding counts one row). Bound (s/token) = bytes / measured read bandwidth.
"""

from __future__ import annotations

from torch import nn


def matmul_flops_per_token(model: nn.Module) -> int:
    return sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))


def weight_bytes_per_token(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = embedding is not None and output is not None and embedding.weight is output.weight
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if embedding is not None and param is embedding.weight and not tied:
            total += param[0].numel() * param.element_size()  # one row looked up per token
        else:
            total += param.numel() * param.element_size()
    return total


def model_bounds(model: nn.Module, machine: dict) -> dict:
    flops = matmul_flops_per_token(model)
    weight_bytes = weight_bytes_per_token(model)
    gflops = machine["matmul_GFLOPs"]["median"]
    bandwidth = machine["read_bandwidth_GBps"]["median"]
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "matmul_flops_per_token": flops,
        "weight_bytes_per_token": weight_bytes,
        "prefill_bound_tok_s": gflops * 1e9 / flops,
        "decode_bound_ms_per_token": weight_bytes / (bandwidth * 1e9) * 1e3,
    }
