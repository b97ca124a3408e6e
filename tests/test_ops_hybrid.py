"""The ops of hybrid models' non-SSM layers — ``attention``, ``positions``, ``moe_experts`` —
against independent computations (PyTorch's SDPA, a per-token loop), their caches and counters
continued across calls, their errors, and their ONNX forms (standard ops) in onnxruntime."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ssmcc
from ssmcc.ops import attention_ref, moe_experts_ref, positions_ref
from ssmcc.ops.moe_experts import ACTIVATIONS, activate


def _qkv(batch, heads, kv_heads, length, dim, value_dim, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return (
        torch.randn(batch, heads, length, dim, generator=g, dtype=dtype),
        torch.randn(batch, kv_heads, length, dim, generator=g, dtype=dtype),
        torch.randn(batch, kv_heads, length, value_dim, generator=g, dtype=dtype),
    )


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (3, 1)])
@pytest.mark.parametrize("length", [1, 5, 33])
def test_attention_matches_sdpa(heads, kv_heads, length):
    q, k, v = _qkv(2, heads, kv_heads, length, 8, 8, seed=length)
    out, keys, values = attention_ref(q, k, v, 0.3)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    assert (out - expected).abs().max() < 1e-6  # float32 inside, float64 in and out
    assert torch.equal(keys, k) and torch.equal(values, v)


@pytest.mark.parametrize("split", [1, 9, 16])
def test_attention_in_pieces_equals_whole(split):
    """Every call given the caches of the previous one computes what one call over all does."""
    q, k, v = _qkv(2, 6, 3, 17, 5, 7, seed=split, dtype=torch.float32)
    whole, keys, values = torch.ops.ssmcc.attention(q, k, v, 0.5)
    first, pk, pv = torch.ops.ssmcc.attention(
        q[:, :, :split], k[:, :, :split], v[:, :, :split], 0.5
    )
    pieces = [first]
    for t in range(split, 17):
        out, pk, pv = torch.ops.ssmcc.attention(
            q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1], 0.5, pk, pv
        )
        pieces.append(out)
    assert (torch.cat(pieces, 2) - whole).abs().max() <= 1e-6
    assert torch.equal(pk, keys) and torch.equal(pv, values)


def test_attention_errors_name_the_argument():
    q, k, v = _qkv(1, 5, 2, 3, 4, 4, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="5 heads must be a multiple of the key's 2 heads"):
        torch.ops.ssmcc.attention(q, k, v, 1.0)
    q, k, v = _qkv(1, 4, 2, 3, 4, 4, dtype=torch.float32)
    with pytest.raises(RuntimeError, match="past_key and past_value are given together"):
        torch.ops.ssmcc.attention(q, k, v, 1.0, k, None)
    with pytest.raises(RuntimeError, match="past_value must have shape"):
        torch.ops.ssmcc.attention(q, k, v, 1.0, k, v[..., :2])


def test_positions_continue_the_count():
    ids = torch.zeros(3, 4, dtype=torch.long)
    first, count = positions_ref(ids)
    assert torch.equal(first, torch.arange(4).expand(3, 4)) and torch.equal(
        count, count.new_full((3, 1), 4)
    )
    then, count = torch.ops.ssmcc.positions(ids[:, :1], count)
    assert torch.equal(then, then.new_full((3, 1), 4)) and count.flatten().tolist() == [5, 5, 5]
    with pytest.raises(RuntimeError, match=r"past_count must have shape \(batch, 1\)"):
        torch.ops.ssmcc.positions(ids, count[:2])


def _moe_by_token(hidden, index, weights, up, down, activation, gated):
    rows = []
    for t in range(hidden.shape[0]):
        total = torch.zeros(hidden.shape[1], dtype=torch.float64)
        for e, w in zip(index[t].tolist(), weights[t].double(), strict=True):
            projected = up[e].double() @ hidden[t].double()
            if gated:
                gate, value = projected.chunk(2)
                active = activate(gate, activation) * value
            else:
                active = activate(projected, activation)
            total += w * (down[e].double() @ active)
        rows.append(total)
    return torch.stack(rows)


def _moe_inputs(tokens, experts, k, dim, width, gated, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, dim, generator=g)
    index = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    weights = torch.rand(tokens, k, generator=g)
    up = torch.randn(experts, 2 * width if gated else width, dim, generator=g) / dim**0.5
    down = torch.randn(experts, dim, width, generator=g) / width**0.5
    return hidden, index, weights, up, down


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [True, False])
def test_moe_experts_match_a_per_token_loop(activation, gated):
    hidden, index, weights, up, down = _moe_inputs(13, 5, 2, 8, 6, gated)
    out = moe_experts_ref(hidden, index, weights, up, down, activation, gated)
    expected = _moe_by_token(hidden, index, weights, up, down, activation, gated)
    assert (out.double() - expected).abs().max() < 1e-5


def test_moe_experts_errors_name_the_argument():
    hidden, index, weights, up, down = _moe_inputs(4, 3, 2, 8, 6, True)
    with pytest.raises(RuntimeError, match=r"up must have shape \(experts, 2\*width, hidden\)"):
        torch.ops.ssmcc.moe_experts(hidden, index, weights, up[:, :6], down, "silu", True)
    with pytest.raises(RuntimeError, match="activation must be one of"):
        torch.ops.ssmcc.moe_experts(hidden, index, weights, up, down, "tanh", True)
    with pytest.raises(RuntimeError, match="top_k_weights must have the shape of top_k_index"):
        torch.ops.ssmcc.moe_experts(hidden, index, weights[:, :1], up, down, "silu", True)


class _Experts(torch.nn.Module):
    def __init__(self, activation, gated):
        super().__init__()
        _, _, _, up, down = _moe_inputs(1, 5, 2, 8, 6, gated, seed=1)
        self.up, self.down = torch.nn.Parameter(up), torch.nn.Parameter(down)
        self.router = torch.nn.Linear(8, 5)
        self.activation, self.gated = activation, gated

    def forward(self, hidden):
        weights, index = self.router(hidden).softmax(-1).topk(2, dim=-1)
        return torch.ops.ssmcc.moe_experts(
            hidden, index, weights, self.up, self.down, self.activation, self.gated
        )


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [True, False])
def test_moe_experts_onnx_form_in_onnxruntime(activation, gated):
    """The standard-op form (per expert: the tokens that chose it, two products, a weighted
    scatter-add) equals the op, at a token count other than the example's."""
    module = _Experts(activation, gated).eval()
    compiled = ssmcc.compile(module, target="onnx", example_inputs=(torch.randn(7, 8),))
    hidden = torch.randn(19, 8)
    with torch.no_grad():
        expected = module(hidden)
    assert (compiled(hidden) - expected).abs().max() < 1e-5
