"""Chunked prefill and the prefix state cache, on the torch and ONNX targets."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError

from .conftest import FAMILIES, make_hf_model


@pytest.fixture(scope="module", params=FAMILIES)
def model(request):
    return make_hf_model(request.param, seed=3)


@pytest.fixture(scope="module")
def compiled_both(model):
    return {
        "torch": ssmcc.compile(model, target="torch"),
        "onnx": ssmcc.compile(model, target="onnx"),
    }


def _ids(model, batch, length, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("length,chunk", [(1000, 96), (1000, 1000), (7, 4), (7, 1), (5, 64)])
def test_chunked_logits_match_unchunked(model, compiled_both, target, length, chunk):
    compiled = compiled_both[target]
    ids = _ids(model, 2, length, seed=length + chunk)
    with torch.no_grad():
        expected = model(ids).logits
    logits, state = compiled.prefill(ids, chunk_size=chunk)
    assert logits.shape == expected.shape
    assert (logits - expected).abs().max() <= 1e-4
    whole_logits, whole_state = compiled.prefill(ids, chunk_size=length)
    for name in state:
        assert (state[name] - whole_state[name]).abs().max() <= 1e-4
    last, last_state = compiled.prefill(ids, chunk_size=chunk, last_only=True)
    assert last.shape == (2, model.config.vocab_size)
    assert (last - expected[:, -1]).abs().max() <= 1e-4
    for name in state:
        assert torch.equal(last_state[name], state[name])


def test_generate_runs_the_prompt_in_chunks_and_matches_hf(model, compiled_both):
    ids = _ids(model, 2, 37, seed=5)
    with torch.no_grad():
        expected = model.generate(
            ids, max_new_tokens=12, min_new_tokens=12, do_sample=False, pad_token_id=0
        )
    for compiled in compiled_both.values():
        assert torch.equal(compiled.generate(ids, 12, chunk_size=8), expected)


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_chunk_size_is_refused(model, compiled_both, bad):
    ids = _ids(model, 1, 4)
    with pytest.raises(InputError, match="chunk_size must be a positive integer"):
        compiled_both["torch"].prefill(ids, chunk_size=bad)
    with pytest.raises(InputError, match="chunk_size must be a positive integer"):
        compiled_both["onnx"].generate(ids, 2, chunk_size=bad)
    with pytest.raises(InputError, match="chunk_size must be a positive integer"):
        ssmcc.compile(model, target="torch", chunk_size=bad)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_prefix_cache_reuses_the_longest_aligned_prefix(model, compiled_both, target):
    compiled = compiled_both[target]
    cache = ssmcc.PrefixCache(max_bytes=64 << 20)
    first = _ids(model, 1, 50, seed=1)
    second = torch.cat([first[:, :40], _ids(model, 1, 25, seed=2)], dim=1)  # shares 40 tokens
    compiled.prefill(first, chunk_size=16, last_only=True, prefix_cache=cache)
    assert len(cache) == 3  # states after 16, 32, 48 tokens
    uncached, uncached_state = compiled.prefill(second, chunk_size=16, last_only=True)
    hits = cache.stats["hits"]
    cached, cached_state = compiled.prefill(
        second, chunk_size=16, last_only=True, prefix_cache=cache
    )
    assert cache.stats["hits"] == hits + 1  # restored after 32 tokens (48 is not a prefix)
    assert (cached - uncached).abs().max() <= 1e-5
    for name in cached_state:
        assert (cached_state[name] - uncached_state[name]).abs().max() <= 1e-5
    # a prompt that is exactly a cached prefix: logits from the cache, nothing computed
    again, _ = compiled.prefill(first[:, :48], chunk_size=16, last_only=True, prefix_cache=cache)
    with torch.no_grad():
        expected = model(first[:, :48]).logits[:, -1]
    assert (again - expected).abs().max() <= 1e-4


def test_prefix_cache_rows_models_and_tokens_never_mix(model, compiled_both):
    torch_model, onnx_model = compiled_both["torch"], compiled_both["onnx"]
    cache = ssmcc.PrefixCache(max_bytes=64 << 20)
    rows = torch.cat([_ids(model, 1, 24, seed=7), _ids(model, 1, 24, seed=8)])
    torch_model.prefill(rows, chunk_size=8, last_only=True, prefix_cache=cache)
    assert len(cache) == 6  # 2 rows x 3 boundaries
    # same length, one token different: no hit
    changed = rows.clone()
    changed[:, 3] = (changed[:, 3] + 1) % model.config.vocab_size
    hits = cache.stats["hits"]
    torch_model.prefill(changed[:, :9], chunk_size=8, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] == hits
    # another model never sees the torch model's entries
    onnx_model.prefill(rows[:, :9], chunk_size=8, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] == hits
    # rows swapped: each row finds its own prefix
    swapped = rows.flip(0)
    logits, _ = torch_model.prefill(swapped, chunk_size=8, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] > hits
    with torch.no_grad():
        assert (logits - model(swapped).logits[:, -1]).abs().max() <= 1e-4


def test_loads_of_one_artifact_share_cached_prefixes(model, compiled_both, tmp_path):
    compiled_both["onnx"].save(str(tmp_path / "a"))
    first, second = ssmcc.load(str(tmp_path / "a")), ssmcc.load(str(tmp_path / "a"))
    assert first.model_id == second.model_id == compiled_both["onnx"].model_id
    assert compiled_both["torch"].model_id != first.model_id
    cache = ssmcc.PrefixCache(max_bytes=64 << 20)
    ids = _ids(model, 1, 20, seed=9)
    first.prefill(ids, chunk_size=8, last_only=True, prefix_cache=cache)
    second.prefill(ids, chunk_size=8, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] == 1


def test_prefix_cache_evicts_least_recently_used_by_bytes(model, compiled_both):
    compiled = compiled_both["torch"]
    probe = ssmcc.PrefixCache(max_bytes=1 << 30)
    compiled.prefill(_ids(model, 1, 4), chunk_size=4, last_only=True, prefix_cache=probe)
    entry_bytes = probe.bytes
    cache = ssmcc.PrefixCache(max_bytes=2 * entry_bytes + entry_bytes // 2)  # room for two
    prompts = [_ids(model, 1, 4, seed=s) for s in (11, 12, 13)]
    for prompt in prompts[:2]:
        compiled.prefill(prompt, chunk_size=4, last_only=True, prefix_cache=cache)
    compiled.prefill(prompts[0], chunk_size=4, last_only=True, prefix_cache=cache)  # touch 0
    compiled.prefill(prompts[2], chunk_size=4, last_only=True, prefix_cache=cache)  # evicts 1
    assert len(cache) == 2 and cache.stats["evicted"] == 1 and cache.bytes <= cache.max_bytes
    hits = cache.stats["hits"]
    compiled.prefill(prompts[0], chunk_size=4, last_only=True, prefix_cache=cache)
    compiled.prefill(prompts[1], chunk_size=4, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] == hits + 1  # 0 was kept, 1 was evicted


def test_prefix_cache_errors(model, compiled_both):
    compiled = compiled_both["torch"]
    ids = _ids(model, 1, 8)
    with pytest.raises(InputError, match="max_bytes must be a positive integer"):
        ssmcc.PrefixCache(max_bytes=0)
    tiny = ssmcc.PrefixCache(max_bytes=1000)
    with pytest.raises(InputError, match=r"budget 1,000 bytes is smaller than one cached prefix"):
        compiled.generate(ids, 2, prefix_cache=tiny)
    cache = ssmcc.PrefixCache(max_bytes=64 << 20)
    with pytest.raises(InputError, match="needs last_only=True"):
        compiled.prefill(ids, prefix_cache=cache)
    _, state = compiled.prefill(ids)
    with pytest.raises(InputError, match="cannot be combined with a given state"):
        compiled.prefill(ids, state, last_only=True, prefix_cache=cache)
    with pytest.raises(InputError, match="must be an ssmcc.PrefixCache"):
        compiled.prefill(ids, last_only=True, prefix_cache={})


def test_generate_with_a_prefix_cache_gives_the_same_tokens(model, compiled_both):
    cache = ssmcc.PrefixCache(max_bytes=64 << 20)
    system = _ids(model, 2, 32, seed=21)
    for seed in (22, 23):
        ids = torch.cat([system, _ids(model, 2, 9, seed=seed)], dim=1)
        for compiled in compiled_both.values():
            plain = compiled.generate(ids, 6, chunk_size=16)
            assert torch.equal(compiled.generate(ids, 6, chunk_size=16, prefix_cache=cache), plain)
    assert cache.stats["hits"] >= 2  # the second turn restarted from the shared system prompt
