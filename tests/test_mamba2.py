"""Mamba-2 end to end: capture of Hugging Face ``Mamba2ForCausalLM`` at any length (one
causal_conv1d, ssd_scan and rmsnorm_gated per layer), logits against HF eager, streaming decode,
chunked prefill and greedy generation on the torch and ONNX targets.

Tolerance: logits within 1e-4 of HF eager (fp32). The test models have no eos token, so HF
``generate`` runs every requested step (its eos handling would otherwise cut the comparison).
"""

from __future__ import annotations

import pytest
import torch

import ssmcc

from .conftest import make_hf_model, odd_mamba2_sizes

TOLERANCE = 1e-4


def mamba2(**overrides):
    return make_hf_model("mamba2", eos_token_id=None, **overrides)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


def _hf_greedy(model, prompt, new_tokens):
    with torch.no_grad():
        return model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )


@pytest.fixture(
    scope="module",
    params=[16, pytest.param(256, marks=pytest.mark.slow)],
    ids=lambda c: f"ssd_chunk{c}",
)
def torch_model(request):
    model = mamba2(chunk_size=request.param)
    return model, ssmcc.compile(model, target="torch")


@pytest.fixture(scope="module")
def onnx_model():
    model = mamba2()
    return model, ssmcc.compile(model, target="onnx")


@pytest.fixture(scope="module")
def onnx_loaded(onnx_model, tmp_path_factory):
    """The ONNX artifact opened with the ssmcc ORT library and in stock onnxruntime."""
    folder = str(tmp_path_factory.mktemp("mamba2_onnx") / "art")
    onnx_model[1].save(folder)
    return {kernels: ssmcc.load(folder, kernels=kernels) for kernels in ("auto", "reference")}


def test_one_op_of_each_kind_per_layer(torch_model):
    """Unfused: a conv, a scan and a gated norm per layer; by default (fuse_scan_norm_mlp) the
    three and everything between them are one ssd_mixer."""
    model, compiled = torch_model
    layers = model.config.num_hidden_layers
    # each block's norm and norm_f
    assert compiled.report.op_counts == {"ssd_mixer": layers, "rmsnorm_gated": layers + 1}
    assert compiled.report.rule_hits["fuse_scan_norm_mlp.ssd_mixer"] == layers
    unfused = ssmcc.compile(model, target="torch", pipeline="unfused")
    assert unfused.report.op_counts == {
        "causal_conv1d": layers,
        "ssd_scan": layers,
        "rmsnorm_gated": layers,  # each mixer's gated norm (the plain norms stay ATen)
    }
    assert compiled.report.capture.dynamic_dims["input_ids"] == ["batch[1,inf]", "seq[1,inf]"]
    assert compiled.report.capture.routes == ["hf-mamba2"]


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 7, 37, 255, 256, 257, 1000])
def test_logits_match_hf_at_any_length(torch_model, batch, length):
    model, compiled = torch_model
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    assert (compiled(ids) - _logits(model, ids)).abs().max() <= TOLERANCE


@pytest.mark.parametrize(
    "heads,head_dim,groups,state",
    [(3, 19, 3, 7), (11, 5, 11, 7)]
    + [pytest.param(*sizes, marks=pytest.mark.slow) for sizes in [(3, 5, 1, 7), (11, 19, 1, 7)]],
)
def test_odd_shapes(heads, head_dim, groups, state):
    model = mamba2(**odd_mamba2_sizes(heads, head_dim, groups, state))
    compiled = ssmcc.compile(model, target="torch")
    ids = torch.randint(0, model.config.vocab_size, (2, 119))
    assert (compiled(ids) - _logits(model, ids)).abs().max() <= TOLERANCE
    logits, state_after = compiled.prefill(ids, chunk_size=17)
    assert (logits - _logits(model, ids)).abs().max() <= TOLERANCE
    token = torch.randint(0, model.config.vocab_size, (2,))
    step, _ = compiled.step(token, state_after)
    expected = _logits(model, torch.cat([ids, token[:, None]], 1))[:, -1]
    assert (step - expected).abs().max() <= TOLERANCE


def _greedy_matches_hf(model, compiled, batch):
    prompt = torch.randint(
        0, model.config.vocab_size, (batch, 9), generator=torch.Generator().manual_seed(batch)
    )
    assert torch.equal(compiled.generate(prompt, 64), _hf_greedy(model, prompt, 64))


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_matches_hf_generate(torch_model, batch):
    _greedy_matches_hf(*torch_model, batch)


@pytest.mark.parametrize("batch", [1, 3])
def test_onnx_greedy_generation_matches_hf_generate(onnx_model, batch):
    _greedy_matches_hf(*onnx_model, batch)


@pytest.mark.parametrize("split", [1, 20, 39])
def test_prefill_then_steps_equals_prefill(torch_model, split):
    model, compiled = torch_model
    ids = torch.randint(0, model.config.vocab_size, (2, 40))
    full, full_state = compiled.prefill(ids)
    _, state = compiled.prefill(ids[:, :split])
    for position in range(split, 40):
        logits, state = compiled.step(ids[:, position], state)
        assert (logits - full[:, position]).abs().max() <= TOLERANCE
    for name in full_state:
        assert (state[name] - full_state[name]).abs().max() <= TOLERANCE, name


@pytest.mark.parametrize("length,chunk", [(600, 96), (41, 7), (16, 16), (5, 64)])
def test_chunked_prefill_matches_unchunked(torch_model, length, chunk):
    """Prefill chunks need not be multiples of the SSD chunk (96 vs 256, 7 vs 16)."""
    model, compiled = torch_model
    ids = torch.randint(0, model.config.vocab_size, (2, length))
    chunked, chunked_state = compiled.prefill(ids, chunk_size=chunk)
    whole, whole_state = compiled.prefill(ids, chunk_size=length)
    assert (chunked - whole).abs().max() <= TOLERANCE
    assert (chunked - _logits(model, ids)).abs().max() <= TOLERANCE
    last, _ = compiled.prefill(ids, chunk_size=chunk, last_only=True)
    assert (last - whole[:, -1]).abs().max() <= TOLERANCE
    for name in whole_state:
        assert (chunked_state[name] - whole_state[name]).abs().max() <= TOLERANCE


def test_state_shapes_follow_the_heads():
    model = mamba2()
    compiled = ssmcc.compile(model, target="torch")
    config = model.config
    specs = {s.name: s for s in compiled.state_specs}
    conv_channels = config.num_heads * config.head_dim + 2 * config.n_groups * config.state_size
    assert specs["layers.0.ssm_state"].shape == (config.num_heads, config.head_dim, 5)
    assert specs["layers.0.conv_state"].shape == (conv_channels, config.conv_kernel - 1)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("length", [1, 7, 37, 300])
def test_onnx_runs_at_any_length_with_and_without_the_library(
    onnx_model, onnx_loaded, kernels, length
):
    """kernels="reference" opens stock onnxruntime sessions: the portable function bodies."""
    model, _ = onnx_model
    loaded = onnx_loaded[kernels]
    graph = "prefill"
    ids = torch.randint(0, model.config.vocab_size, (2, length))
    assert (loaded(ids) - _logits(model, ids)).abs().max() <= TOLERANCE
    expected = "ssmcc ORT library" if kernels == "auto" else "portable function bodies"
    assert loaded.executable.session(graph).ssmcc_kernels == expected
    logits, state = loaded.prefill(ids, chunk_size=16)
    token = torch.randint(0, model.config.vocab_size, (2,))
    step, _ = loaded.step(token, state)
    expected_step = _logits(model, torch.cat([ids, token[:, None]], 1))[:, -1]
    assert (step - expected_step).abs().max() <= TOLERANCE


# mamba_ssm's tolerances for its scan tests (FACTS.md), applied to the logits.
LOW_PRECISION_TOLERANCE = {
    torch.bfloat16: dict(rtol=3e-2, atol=5e-2),
    torch.float16: dict(rtol=3e-3, atol=5e-3),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_models_match_hf_in_that_dtype(dtype):
    """``dtype=`` captures a copy of the model in that dtype: the ssmcc ops compute in float32
    inside and return the model's dtype; the states stay float32, as their contracts say."""
    model = mamba2()
    compiled = ssmcc.compile(model, target="torch", dtype=dtype)
    assert next(model.parameters()).dtype == torch.float32  # the caller's model is unchanged
    low = mamba2().to(dtype)
    # seeded: an end-to-end comparison of two low-precision runs sits near the per-op tolerance
    ids = torch.randint(
        0, model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0)
    )
    got, hf = compiled(ids).float(), _logits(low, ids).float()
    torch.testing.assert_close(got, hf, **LOW_PRECISION_TOLERANCE[dtype])
    # and at least about as close to the float32 model as Hugging Face's own run in that dtype
    exact = _logits(model, ids).float()
    assert (got - exact).abs().max() <= 1.25 * (hf - exact).abs().max()
    assert {s.dtype for s in compiled.state_specs} == {"float32"}
    tokens = compiled.generate(ids, 8)
    assert tokens.shape == (2, 45)


@pytest.mark.slow
def test_the_onnx_target_names_a_low_precision_model():
    model = mamba2().to(torch.bfloat16)
    with pytest.raises(ssmcc.LoweringError, match="runs float32 programs; this one holds bfloat16"):
        ssmcc.compile(model, target="onnx")
    with pytest.raises(ssmcc.OptionError, match="dtype 'bfloat16' is not implemented by target"):
        ssmcc.compile(mamba2(), target="onnx", dtype=torch.bfloat16)
    compiled = ssmcc.compile(model, target="onnx", dtype="float32")
    ids = torch.randint(0, model.config.vocab_size, (1, 9))
    expected = _logits(model.float(), ids)
    assert (compiled(ids) - expected).abs().max() <= TOLERANCE


def test_capture_restores_the_patched_norm_class_also_on_failure():
    """Routing swaps module functions and the gated norm's forward for the capture only."""
    from transformers.models.mamba2 import modeling_mamba2 as hf

    originals = (hf.mamba2_chunk_scan, hf.causal_conv1d_fn, hf.MambaRMSNormGated.forward)
    model = mamba2(n_groups=4, num_hidden_layers=1)  # 4 groups of 6 heads: ssd_scan refuses
    with pytest.raises(ssmcc.CaptureError, match="B has 4 groups, which does not divide heads=6"):
        ssmcc.capture(model, (torch.zeros(2, 5, dtype=torch.long),))
    ssmcc.capture(mamba2(num_hidden_layers=1), (torch.zeros(2, 5, dtype=torch.long),))
    assert (hf.mamba2_chunk_scan, hf.causal_conv1d_fn, hf.MambaRMSNormGated.forward) == originals
