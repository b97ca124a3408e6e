"""Models whose ``hidden_act`` is not silu, end to end against Hugging Face: transformers' own Jamba
tester config (``hidden_act="gelu"``), a gelu Mamba and a Mamba-2 with the tanh GELU, on the
torch and ONNX targets: logits within 1e-4 of HF eager, HF's greedy tokens, and a prefill
continued by steps equal to one prefill. A name with no ssmcc form is refused at capture.

Hugging Face applies ``hidden_act`` to the mixers' conv (``causal_conv1d_fn(..., activation)``)
and gates the scan (Mamba-1) or the norm (Mamba-2) with silu whatever it is (transformers 5.24);
Jamba's MLPs and experts apply it too (``ACT2FN``; the experts through ``ssmcc.moe_experts``).

HF's initialisation (std 0.02) keeps every conv output so close to 0 that silu and gelu agree to
1e-5 there: the mixers' conv, in_proj, A, D and dt bias are redrawn (``randomize``) so that the
activation moves the logits by ~0.5, and ``test_the_activation_matters`` checks that it does.
"""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.errors import CaptureError

TOLERANCE = 1e-4


def jamba_tester_config(**overrides):
    """transformers' ``JambaModelTester`` config (tests/models/jamba/test_modeling_jamba.py)."""
    from transformers import JambaConfig

    keywords = dict(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=5,
        attn_layer_offset=1,
        attn_layer_period=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=37,
        hidden_act="gelu",
        max_position_embeddings=512,
        initializer_range=0.02,
        use_mamba_kernels=False,
        num_experts=2,
    )
    return JambaConfig(**(keywords | overrides))


def randomize(model, seed: int = 1):
    """The mixers' conv weight and bias, A_log, D and dt bias uniform in [-1, 1], in_proj N(0,
    0.3^2): conv outputs of order 1, where the activations differ."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        if name.endswith(
            ("A_log", ".D", "dt_proj.bias", "dt_bias", "conv1d.weight", "conv1d.bias")
        ):
            param.data.copy_(torch.rand(param.shape, generator=generator) * 2 - 1)
        elif name.endswith("in_proj.weight"):
            param.data.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model.eval()


def build(name: str):
    import transformers

    torch.manual_seed(0)
    if name == "jamba-gelu":
        model = transformers.JambaForCausalLM(jamba_tester_config()).eval()
        # HF's default experts path (grouped_mm) refuses a width of 37 floats on the CPU
        # ("strides should be multiple of 16 bytes"); "eager" is the same math, a loop
        model.set_experts_implementation("eager")
    elif name == "mamba-gelu":
        config = transformers.MambaConfig(
            vocab_size=64, hidden_size=16, state_size=8, num_hidden_layers=2, hidden_act="gelu"
        )
        model = transformers.MambaForCausalLM(config)
    else:  # mamba2-gelu-tanh
        config = transformers.Mamba2Config(
            vocab_size=64,
            hidden_size=16,
            state_size=8,
            num_hidden_layers=2,
            head_dim=8,
            num_heads=4,
            n_groups=2,
            chunk_size=8,
            hidden_act="gelu_pytorch_tanh",
        )
        model = transformers.Mamba2ForCausalLM(config)
    return randomize(model)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


# Mamba-1 with GELU runs by default; the others (~15 s of compiles each; Jamba's tester config is
# the acceptance case) with the slow tests, the ops' own tests covering every activation on every
# path by default.
FAMILIES = [
    pytest.param("jamba-gelu", marks=pytest.mark.slow),
    "mamba-gelu",
    pytest.param("mamba2-gelu-tanh", marks=pytest.mark.slow),
]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model = build(request.param)
    compiled = {target: ssmcc.compile(model, target=target) for target in ("torch", "onnx")}
    return request.param, model, compiled


def test_the_activation_matters(family):
    """The same weights with the mixers' conv activation set to silu give other logits: the
    comparisons below could fail."""
    _, model, compiled = family
    ids = torch.randint(
        0, model.config.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3)
    )
    mixers = [m for m in model.modules() if type(m).__name__.endswith("Mixer")]
    assert mixers and all(m.activation != "silu" for m in mixers)
    expected = _logits(model, ids)
    saved = [m.activation for m in mixers]
    try:
        for mixer in mixers:
            mixer.activation = "silu"
        as_silu = _logits(model, ids)
    finally:
        for mixer, activation in zip(mixers, saved, strict=True):
            mixer.activation = activation
    assert (as_silu - expected).abs().max() > 1000 * TOLERANCE
    assert (compiled["torch"](ids) - expected).abs().max() <= TOLERANCE


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.parametrize("batch,length", [(1, 1), (3, 7), (2, 37)])
def test_logits_match_hf(family, target, batch, length):
    _, model, compiled = family
    generator = torch.Generator().manual_seed(batch * 100 + length)
    ids = torch.randint(0, model.config.vocab_size, (batch, length), generator=generator)
    got = torch.as_tensor(compiled[target](ids))
    assert (got - _logits(model, ids)).abs().max() <= TOLERANCE


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_greedy_tokens_are_hf_generate(family, target):
    _, model, compiled = family
    prompt = torch.randint(
        0, model.config.vocab_size, (2, 5), generator=torch.Generator().manual_seed(5)
    )
    expected = model.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, do_sample=False
    )
    assert torch.equal(torch.as_tensor(compiled[target].generate(prompt, 8)), expected)


@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_prefill_then_steps_equals_prefill(family, target):
    _, model, compiled = family
    ids = torch.randint(
        0, model.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(20)
    )
    full, full_state = compiled[target].prefill(ids)
    logits, state = compiled[target].prefill(ids[:, :11])
    for t in range(11, 20):
        logits, state = compiled[target].step(ids[:, t], state)
    assert (torch.as_tensor(logits) - torch.as_tensor(full)[:, -1]).abs().max() <= TOLERANCE
    for name, tensor in full_state.items():
        got = torch.as_tensor(state[name]).float()
        assert (got - torch.as_tensor(tensor).float()).abs().max() <= TOLERANCE, name


@pytest.mark.parametrize(
    "layer,config",
    [
        ("model.layers.0.mamba (JambaMambaMixer)", "jamba"),
        ("backbone.layers.0.mixer (MambaMixer)", "mamba"),
    ],
)
def test_an_activation_with_no_form_is_refused_at_capture(layer, config):
    import transformers

    if config == "jamba":
        model = transformers.JambaForCausalLM(jamba_tester_config(hidden_act="mish"))
    else:
        model = transformers.MambaForCausalLM(
            transformers.MambaConfig(
                vocab_size=64, hidden_size=16, num_hidden_layers=1, hidden_act="mish"
            )
        )
    with pytest.raises(CaptureError) as caught:
        ssmcc.compile(model.eval(), target="torch")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{layer}: activation 'mish'")
    assert "silu, swish, gelu" in message and "relu2" in message
