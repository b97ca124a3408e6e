"""``ssmcc::attention`` — causal multi-head attention (grouped K/V heads) carrying its K/V cache.

Shapes (b = batch, h = query heads, g = K/V heads with h % g == 0, l = new positions, p = cached
positions, d = head dim of queries and keys, e = head dim of values)::

    attention(query (b, h, l, d), key (b, g, l, d), value (b, g, l, e), scale,
              past_key (b, g, p, d)?, past_value (b, g, p, e)?)
        -> out (b, h, l, e) dtype of query,
           keys (b, g, p+l, d) dtype of key,  values (b, g, p+l, e) dtype of value

Math: ``K = concat(past_key, key)`` and ``V = concat(past_value, value)`` along positions (no past
= ``p = 0``). Query position ``i`` of the call is absolute position ``p + i``; it sees every key
up to and including its own. For query head ``q`` and its K/V head ``k = q // (h / g)``::

    s_ij   = scale * <query[q, i], K[k, j]>          for j <= p + i
    out[q, i] = sum_j softmax_j(s_i)[j] * V[k, j]

computed in float32 (the scores, the softmax and the weighted sum) and rounded once to the query's
dtype. ``keys``/``values`` are ``K``/``V``: the cache after this call, so a prompt in one call
equals the same prompt in pieces, each call given the caches of the previous one, and decoding is
the same op at ``l = 1``. Its state contract (two growing states, ``key`` and ``value``) is what
turns it into the prefill, chunk and step programs' K/V caches.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ssmcc.ops._shapes import expect, expect_rank
from ssmcc.ops.contracts import StateContract, StateSlot, register_state_contract
from ssmcc.ops.definition import define

OP = "attention"


def check_attention_args(query, key, value, past_key, past_value) -> None:
    expect_rank(OP, "query", query, (4,), "(batch, heads, length, head_dim)")
    expect_rank(OP, "key", key, (4,), "(batch, kv_heads, length, head_dim)")
    expect_rank(OP, "value", value, (4,), "(batch, kv_heads, length, value_dim)")
    batch, heads, length, head_dim = query.shape
    kv_heads = key.shape[1]
    expect(
        tuple(key.shape) == (batch, kv_heads, length, head_dim),
        OP,
        f"key must have shape (batch, kv_heads, length, head_dim) matching query "
        f"{tuple(query.shape)}, got {tuple(key.shape)}",
    )
    expect(kv_heads >= 1, OP, "key has no heads")
    expect(
        heads % kv_heads == 0,
        OP,
        f"the query's {heads} heads must be a multiple of the key's {kv_heads} heads",
    )
    expect(
        tuple(value.shape[:3]) == (batch, kv_heads, length),
        OP,
        f"value must have shape (batch, kv_heads, length, value_dim) = ({batch}, {kv_heads}, "
        f"{length}, *), got {tuple(value.shape)}",
    )
    expect(
        (past_key is None) == (past_value is None),
        OP,
        "past_key and past_value are given together or not at all",
    )
    if past_key is None:
        return
    expect_rank(OP, "past_key", past_key, (4,), "(batch, kv_heads, past, head_dim)")
    expect_rank(OP, "past_value", past_value, (4,), "(batch, kv_heads, past, value_dim)")
    past = past_key.shape[2]
    expect(
        tuple(past_key.shape) == (batch, kv_heads, past, head_dim),
        OP,
        f"past_key must have shape (batch, kv_heads, past, head_dim) = ({batch}, {kv_heads}, "
        f"past, {head_dim}), got {tuple(past_key.shape)}",
    )
    expect(
        tuple(past_value.shape) == (batch, kv_heads, past, value.shape[3]),
        OP,
        f"past_value must have shape (batch, kv_heads, past, value_dim) = ({batch}, {kv_heads}, "
        f"{past}, {value.shape[3]}), got {tuple(past_value.shape)}",
    )


def _caches(key, value, past_key, past_value) -> tuple[Tensor, Tensor]:
    if past_key is None:  # copies: an op's outputs never alias its inputs
        return key.clone(memory_format=torch.contiguous_format), value.clone(
            memory_format=torch.contiguous_format
        )
    keys = torch.cat([past_key.to(key.dtype), key], dim=2)
    return keys, torch.cat([past_value.to(value.dtype), value], dim=2)


def causal_mask(length: int, total: int, device=None) -> Tensor:
    """(length, total) booleans: query ``i`` (absolute ``total - length + i``) sees key ``j``."""
    past = total - length
    queries = torch.arange(length, device=device)[:, None] + past
    return torch.arange(total, device=device)[None, :] <= queries


def attention_ref(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scale: float,
    past_key: Tensor | None = None,
    past_value: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Reference: the scores of every query against every visible key, a float32 softmax."""
    check_attention_args(query, key, value, past_key, past_value)
    keys, values = _caches(key, value, past_key, past_value)
    batch, heads, length, _ = query.shape
    kv_heads, total = keys.shape[1], keys.shape[2]
    grouped = query.float().reshape(batch, kv_heads, heads // kv_heads * length, -1)
    scores = (grouped @ keys.float().transpose(-1, -2)) * scale  # (b, g, h/g * l, total)
    scores = scores.reshape(batch, heads, length, total)
    scores = scores.masked_fill(~causal_mask(length, total, query.device), float("-inf"))
    weights = scores.softmax(-1).reshape(batch, kv_heads, heads // kv_heads * length, total)
    out = (weights @ values.float()).reshape(batch, heads, length, -1)
    return out.to(query.dtype), keys, values


@torch.library.custom_op("ssmcc::attention", mutates_args=())
def attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    scale: float,
    past_key: Tensor | None = None,
    past_value: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Causal grouped-head attention over ``past + new`` positions; returns ``(out, keys,
    values)``, the caches after this call."""
    if query.shape[2] == 0:
        keys, values = _caches(key, value, past_key, past_value)
        return query.new_empty(*query.shape[:3], value.shape[3]), keys, values
    return attention_ref(query, key, value, scale, past_key, past_value)


@attention.register_fake
def _attention_fake(query, key, value, scale, past_key=None, past_value=None):
    check_attention_args(query, key, value, past_key, past_value)
    past = 0 if past_key is None else past_key.shape[2]
    total = past + key.shape[2]
    out = query.new_empty(*query.shape[:3], value.shape[3])
    keys = key.new_empty(key.shape[0], key.shape[1], total, key.shape[3])
    values = value.new_empty(value.shape[0], value.shape[1], total, value.shape[3])
    return out, keys, values


def _attention_step(states, query, key, value, scale, past_key=None, past_value=None):
    """One more position: the same op, given the caches."""
    return attention(query, key, value, scale, states[0], states[1])


def _cache_shape(tensor_arg: str):
    """A cache's shape without the batch dim, its growing positions axis at size 0."""
    return lambda args: (args[tensor_arg].shape[1], 0, args[tensor_arg].shape[3])


register_state_contract(
    attention,
    StateContract(
        slots=(
            StateSlot("key", "past_key", 1, _cache_shape("key"), lambda a: a["key"].dtype, (1,)),
            StateSlot(
                "value", "past_value", 2, _cache_shape("value"), lambda a: a["value"].dtype, (1,)
            ),
        ),
        step=_attention_step,
        step_op="attention",
    ),
)

ATTENTION = define(attention, attention_ref)
