"""Freezing the torch target's weights: weight-only expressions folded once, flat weight access."""

from __future__ import annotations

import torch
from torch import nn

import ssmcc
from ssmcc.lowering.torch import freeze
from ssmcc.lowering.torch.lower import lower_to_torch

from .conftest import make_hf_model


def _targets(module):
    return [str(n.target) for n in module.graph.nodes if n.op == "call_function"]


def test_step_program_reads_folded_decay_not_exp_of_a_log():
    model = make_hf_model("mamba", num_hidden_layers=3)
    compiled = ssmcc.compile(model, target="torch")
    ids = torch.randint(0, model.config.vocab_size, (2, 5))
    logits, state = compiled.prefill(ids)
    step = compiled.executable.module("step")
    assert "aten.exp.default" not in _targets(step)  # -exp(A_log) is a constant now
    assert "aten.neg.default" not in _targets(step)
    assert all("." not in n.target for n in step.graph.nodes if n.op == "get_attr")
    with torch.no_grad():
        expected = model(torch.cat([ids, ids[:, :1]], 1)).logits[:, -1]
    assert (compiled.step(ids[:, :1], state)[0] - expected).abs().max() <= 1e-4


class _WeightExpressions(nn.Module):
    """x @ (-exp(a)) + (x @ big.t())[:, :4] + x @ (big * 2)[:, :4] + x @ (big + 1): a small new
    tensor, a view of a weight, a small view of a large temporary, and a large new tensor (kept
    in the graph: folding it would hold the weight twice)."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter(torch.randn(4, 4))
        self.big = nn.Parameter(torch.randn(1100, 1100))

    def forward(self, x):
        small = x[:, :4] @ (-torch.exp(self.a))
        view = (x @ self.big.t())[:, :4]
        sliced = x @ (self.big * 2)[:, :4]
        large = (x @ (self.big + 1))[:, :4]
        return small + view + sliced + large


def test_fold_keeps_views_and_small_values_and_leaves_large_copies_in_the_graph():
    module = _WeightExpressions()
    x = torch.randn(3, 1100)
    program = torch.export.export(module, (x,))
    lowered = lower_to_torch(program)
    assert torch.allclose(lowered(x), module(x), atol=1e-3)
    folded = {name: t for name, t in lowered.named_buffers() if name.startswith("_folded_")}
    big_storage = module.big.untyped_storage().data_ptr()
    assert any(t.untyped_storage().data_ptr() == big_storage for t in folded.values())
    assert all(
        t.untyped_storage().data_ptr() == big_storage
        or t.untyped_storage().nbytes() <= freeze.MAX_NEW_BYTES
        for t in folded.values()
    )
    assert "aten.mul.Tensor" not in _targets(lowered)  # (big * 2)[:, :4] is a 17 KB constant
    big_plus_one = [  # big + 1 (4.8 MB) stays in the graph
        n
        for n in lowered.graph.nodes
        if str(n.target) == "aten.add.Tensor" and n.args[0].op == "get_attr"
    ]
    assert len(big_plus_one) == 1
    assert "aten.exp.default" not in _targets(lowered)


def test_folding_in_inference_mode_or_not_gives_values_usable_with_grad_enabled():
    module = _WeightExpressions()
    x = torch.randn(2, 1100)
    with torch.inference_mode():
        program = torch.export.export(module, (x,))
        lowered = lower_to_torch(program)
    assert torch.allclose(lowered(x), module(x), atol=1e-3)
