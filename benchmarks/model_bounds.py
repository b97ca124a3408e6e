"""What a model must at least do per token, and the speed bounds that follow on this machine.

- prefill: matmul FLOPs per token = 2 x (weights of every nn.Linear, the LM head included, and
  of the k experts a token runs through in each mixture-of-experts layer); the scan, conv,
  attention scores and norms are not counted. Bound (tokens/s) = measured matmul FLOP/s / FLOPs
  per token.
- decode: bytes of weights read per token = every distinct parameter once (an untied input
  embedding counts one row, an MoE layer k of its E experts). Bound (s/token) = bytes / measured
  read bandwidth.
"""

from __future__ import annotations

from torch import nn


def expert_layers(model: nn.Module) -> list[tuple[nn.Parameter, nn.Parameter, int]]:
    """(up, down, k) of every experts module: 3D weights (E, u, d) and (E, d, i), as
    transformers' ``use_experts_implementation`` classes hold them; k experts per token."""
    config = getattr(model, "config", None)
    k = getattr(config, "num_experts_per_tok", None)
    found = []
    for module in model.modules():
        down = getattr(module, "down_proj", None)
        up = getattr(module, "gate_up_proj", getattr(module, "up_proj", None))
        if isinstance(down, nn.Parameter) and down.dim() == 3 and isinstance(up, nn.Parameter):
            found.append((up, down, int(k or 1)))
    return found


def matmul_flops_per_token(model: nn.Module) -> int:
    linears = sum(2 * m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    experts = sum(2 * k * (up[0].numel() + down[0].numel()) for up, down, k in expert_layers(model))
    return linears + experts


def weight_bytes_per_token(model: nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    embedding = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    tied = embedding is not None and output is not None and embedding.weight is output.weight
    active = {id(w): k / w.shape[0] for up, down, k in expert_layers(model) for w in (up, down)}
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if id(param) in active:
            total += int(param.numel() * active[id(param)]) * param.element_size()
        elif embedding is not None and param is embedding.weight and not tied:
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
