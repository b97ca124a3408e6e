"""Capture of Hugging Face Mamba / FalconMamba: dynamic dims, one op per layer, model untouched."""

from __future__ import annotations

import functools
import importlib

import pytest
import torch

import ssmcc
from ssmcc.errors import CaptureError
from ssmcc.frontend.routes import known_routes

from .conftest import FAMILIES, make_hf_model

TOLERANCE = 1e-4  # logits max |diff| against the HF model's eager forward (fp32)


def _eager_logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


def _module_globals():
    snapshot = {}
    for route in known_routes():
        module = importlib.import_module(route.module)
        for name in route.replacements:  # "f" or "Class.method"
            snapshot[(route.module, name)] = functools.reduce(getattr, name.split("."), module)
    return snapshot


@pytest.fixture(scope="module", params=FAMILIES)
def captured(request):
    model = make_hf_model(request.param)
    example = torch.randint(
        0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0)
    )
    program, report = ssmcc.capture_with_report(model, (example,))
    return model, program, report


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 2, 7, 64, 300])
def test_program_matches_eager_at_any_shape(captured, batch, length):
    model, program, _ = captured
    ids = torch.randint(
        0,
        model.config.vocab_size,
        (batch, length),
        generator=torch.Generator().manual_seed(batch * 1000 + length),
    )
    with torch.no_grad():
        got = program.module()(ids)
    expected = _eager_logits(model, ids)
    assert got.shape == expected.shape == (batch, length, model.config.vocab_size)
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_one_scan_and_one_conv_per_layer(captured):
    model, program, report = captured
    layers = model.config.num_hidden_layers
    assert report.op_counts == {"causal_conv1d": layers, "selective_scan": layers}
    assert len(report.ssm_layers) == layers
    assert report.dynamic_dims == {"input_ids": ["batch[1,inf]", "seq[1,inf]"]}
    assert not report.notes


def test_node_count_does_not_depend_on_example_length(hf_family):
    model = make_hf_model(hf_family)
    counts = []
    for length in (16, 256):
        ids = torch.randint(0, model.config.vocab_size, (2, length))
        counts.append(len(ssmcc.capture(model, (ids,)).graph.nodes))
    assert counts[0] == counts[1]
    assert counts[0] < 100 * model.config.num_hidden_layers  # not unrolled over the sequence


@pytest.mark.parametrize("example_shape", [(1, 1), (1, 5), (4, 1)])
def test_batch_or_length_one_examples_still_give_dynamic_programs(example_shape):
    model = make_hf_model("mamba", num_hidden_layers=1)
    program = ssmcc.capture(model, (torch.zeros(example_shape, dtype=torch.long),))
    ids = torch.randint(0, model.config.vocab_size, (3, 11))
    with torch.no_grad():
        assert (program.module()(ids) - _eager_logits(model, ids)).abs().max() <= TOLERANCE


def test_model_is_unchanged_after_capture(hf_family):
    model = make_hf_model(hf_family)
    model.train()
    model.backbone.layers[1].eval()  # a mixed train/eval state must come back exactly
    flags = [m.training for m in model.modules()]
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    before_state = {k: v.clone() for k, v in model.state_dict().items()}
    before_globals = _module_globals()
    model.eval()
    before_out = _eager_logits(model, ids)
    model.train()
    model.backbone.layers[1].eval()

    ssmcc.capture(model, (ids,))

    assert [m.training for m in model.modules()] == flags
    assert _module_globals() == before_globals
    for key, value in model.state_dict().items():
        assert torch.equal(value, before_state[key]), key
    model.eval()
    assert torch.equal(_eager_logits(model, ids), before_out)


def test_failed_capture_restores_everything():
    """Jamba's experts with hidden_act "linear" (identity: a form of the mixers' conv, not of
    ``ssmcc.moe_experts``): capture fails inside the export, after the routes were installed, and
    nothing is left patched."""
    import transformers

    config = transformers.JambaConfig(
        vocab_size=99,
        hidden_size=32,
        num_hidden_layers=2,
        attn_layer_offset=1,
        attn_layer_period=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=32,
        hidden_act="linear",
        num_experts=2,
    )
    model = transformers.JambaForCausalLM(config).eval()
    before_globals = _module_globals()
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    before_out = _eager_logits(model, ids)
    with pytest.raises(
        CaptureError,
        match=r"JambaForCausalLM.*JambaExperts: activation LinearActivation has no ssmcc.moe_",
    ):
        ssmcc.capture(model, (ids,))
    assert _module_globals() == before_globals
    assert torch.equal(_eager_logits(model, ids), before_out)
    assert not model.training


def test_an_unsupported_conv_activation_is_refused_before_export():
    """The mixers' activation is checked before anything is patched: one line naming the layer."""
    model = make_hf_model("mamba", hidden_act="mish", num_hidden_layers=1)
    before_globals = _module_globals()
    with pytest.raises(
        CaptureError, match=r"^backbone.layers.0.mixer \(MambaMixer\): activation 'mish'"
    ):
        ssmcc.capture(model, (torch.randint(0, model.config.vocab_size, (2, 9)),))
    assert _module_globals() == before_globals


def test_static_capture_is_fixed_shape():
    model = make_hf_model("mamba", num_hidden_layers=1)
    ids = torch.randint(0, model.config.vocab_size, (2, 8))
    program, report = ssmcc.capture_with_report(model, (ids,), dynamic=False)
    assert report.dynamic_dims == {"input_ids": ["2", "8"]}
    with torch.no_grad():
        assert (program.module()(ids) - _eager_logits(model, ids)).abs().max() <= TOLERANCE
