"""Streaming decode: prefill -> state -> step, on the torch and ONNX targets."""

from __future__ import annotations

import onnx
import pytest
import torch

import ssmcc
from ssmcc.errors import InputError

from .conftest import make_hf_model

TOLERANCE = 1e-4


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(("mamba", "torch"), id="mamba-torch"),
        pytest.param(("mamba", "onnx"), id="mamba-onnx"),
        pytest.param(("falcon_mamba", "torch"), id="falcon_mamba-torch", marks=pytest.mark.slow),
        pytest.param(("falcon_mamba", "onnx"), id="falcon_mamba-onnx", marks=pytest.mark.slow),
    ],
)
def model_and_compiled(request):
    family, target = request.param
    model = make_hf_model(family)
    return model, ssmcc.compile(model, target=target)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_generation_matches_hf_generate(model_and_compiled, batch):
    model, compiled = model_and_compiled
    prompt = torch.randint(
        0, model.config.vocab_size, (batch, 9), generator=torch.Generator().manual_seed(batch)
    )
    with torch.no_grad():
        expected = model.generate(
            prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0
        )
    got = compiled.generate(prompt, 64)
    assert got.shape == (batch, 9 + 64)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("split", ["first", "last"])
def test_prefill_then_steps_equals_full_prefill(model_and_compiled, split):
    model, compiled = model_and_compiled
    ids = torch.randint(0, model.config.vocab_size, (2, 23))
    full, full_state = compiled.prefill(ids)
    k = 1 if split == "first" else ids.shape[1] - 1
    logits, state = compiled.prefill(ids[:, :k])
    assert (logits - full[:, :k]).abs().max() <= TOLERANCE
    for t in range(k, ids.shape[1]):
        logits, state = compiled.step(ids[:, t], state)
        assert logits.shape == (2, model.config.vocab_size)
        assert (logits - full[:, t]).abs().max() <= TOLERANCE
    for name in full_state:
        assert (state[name] - full_state[name]).abs().max() <= TOLERANCE


def test_prefill_matches_hf_forward(model_and_compiled):
    model, compiled = model_and_compiled
    ids = torch.randint(0, model.config.vocab_size, (3, 17))
    with torch.no_grad():
        expected = model(ids).logits
    logits, state = compiled.prefill(ids)
    assert (logits - expected).abs().max() <= TOLERANCE
    layers = model.config.num_hidden_layers
    assert list(state) == [
        f"layers.{i}.{kind}" for i in range(layers) for kind in ("conv_state", "ssm_state")
    ]
    assert all(t.dtype == torch.float32 and t.shape[0] == 3 for t in state.values())


def test_state_specs_name_layers_and_shapes(model_and_compiled):
    model, compiled = model_and_compiled
    d, n, k = 2 * model.config.hidden_size, model.config.state_size, model.config.conv_kernel
    specs = {s.name: s for s in compiled.state_specs}
    assert specs["layers.2.conv_state"].shape == (d, k - 1)
    assert specs["layers.2.ssm_state"].shape == (d, n)
    assert {s.dtype for s in specs.values()} == {"float32"}
    assert {s.grows for s in specs.values()} == {()}


def test_bad_states_are_named(model_and_compiled):
    model, compiled = model_and_compiled
    _, state = compiled.prefill(torch.zeros(2, 3, dtype=torch.long))
    token = torch.zeros(2, dtype=torch.long)
    bad = dict(state)
    bad["layers.1.ssm_state"] = state["layers.1.ssm_state"][:, :, :-1]
    with pytest.raises(InputError, match=r"state tensor layers\.1\.ssm_state has shape"):
        compiled.step(token, bad)
    bad = dict(state)
    bad["layers.0.conv_state"] = state["layers.0.conv_state"].double()
    with pytest.raises(InputError, match=r"layers\.0\.conv_state has dtype torch.float64"):
        compiled.step(token, bad)
    with pytest.raises(InputError, match=r"layers\.0\.conv_state has batch \(2,.*expected \(3,"):
        compiled.step(torch.zeros(3, dtype=torch.long), state)
    bad = dict(state)
    del bad["layers.2.ssm_state"]
    with pytest.raises(InputError, match=r"missing \['layers\.2\.ssm_state'\]"):
        compiled.step(token, bad)
    with pytest.raises(InputError, match="step takes one token per row"):
        compiled.step(torch.zeros(2, 2, dtype=torch.long), state)
    with pytest.raises(InputError, match="max_new_tokens must be an integer >= 1, got 0"):
        compiled.generate(torch.zeros(1, 3, dtype=torch.long), 0)


def test_state_save_load_resumes_generation(model_and_compiled, tmp_path):
    model, compiled = model_and_compiled
    prompt = torch.randint(0, model.config.vocab_size, (2, 8))
    _, state = compiled.prefill(prompt)
    state.save(str(tmp_path / "state.pt"))
    restored = ssmcc.State.load(str(tmp_path / "state.pt"))
    token = torch.tensor([5, 7])
    a, _ = compiled.step(token, state)
    b, _ = compiled.step(token, restored)
    assert torch.equal(a, b)


def test_sampling_is_seeded_and_filters(model_and_compiled):
    model, compiled = model_and_compiled
    prompt = torch.randint(0, model.config.vocab_size, (2, 5))
    first = compiled.generate(prompt, 12, do_sample=True, temperature=1.3, top_p=0.9, seed=4)
    again = compiled.generate(prompt, 12, do_sample=True, temperature=1.3, top_p=0.9, seed=4)
    assert torch.equal(first, again)
    other = [
        compiled.generate(prompt, 12, do_sample=True, temperature=1.3, seed=s) for s in range(5, 9)
    ]
    assert any(not torch.equal(first, o) for o in other)
    greedy = compiled.generate(prompt, 12)
    assert torch.equal(compiled.generate(prompt, 12, do_sample=True, top_k=1, seed=1), greedy)


def test_eos_stops_and_stream_yields_each_token(model_and_compiled):
    model, compiled = model_and_compiled
    prompt = torch.randint(0, model.config.vocab_size, (1, 5))
    greedy = compiled.generate(prompt, 10)
    streamed = list(compiled.stream(prompt, 10))
    assert torch.equal(torch.stack(streamed, 1), greedy[:, 5:])
    eos = int(greedy[0, 7])  # the third generated token
    stopped = compiled.generate(prompt, 10, eos_token_id=eos)
    assert stopped.shape[1] <= 5 + 3 and int(stopped[0, -1]) == eos


def test_onnx_step_graph_io_and_no_loops():
    model = make_hf_model("mamba", num_hidden_layers=2)
    compiled = ssmcc.compile(model, target="onnx")
    proto = onnx.load(f"{compiled.executable.folder}/step.onnx", load_external_data=False)
    ops = {n.op_type for n in proto.graph.node}
    ops |= {n.op_type for f in proto.functions for n in f.node}
    assert not {"Scan", "Loop"} & ops
    names = [f"layers.{i}.{k}" for i in range(2) for k in ("conv_state", "ssm_state")]
    assert [i.name for i in proto.graph.input] == ["input_ids", *names]
    assert [o.name for o in proto.graph.output] == ["logits", *[f"{n}.next" for n in names]]
    custom = sorted(n.op_type for n in proto.graph.node if n.domain == "ssmcc")
    # one fused op per layer; the in/out projections and the head read their weights in place
    assert custom == ["Linear"] * 5 + ["MambaMixerStep"] * 2 + ["RmsNormGated"] * 3


def test_plain_modules_have_no_state():
    compiled = ssmcc.compile(torch.nn.Linear(4, 4), example_inputs=(torch.randn(2, 4),))
    with pytest.raises(ssmcc.SSMCCError, match="need a language model"):
        compiled.prefill(torch.zeros(1, 2, dtype=torch.long))
