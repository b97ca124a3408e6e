"""Bad inputs get an InputError naming the problem, before torch.export or a kernel runs."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError

from .conftest import make_hf_model


@pytest.fixture(scope="module")
def model():
    return make_hf_model("mamba", num_hidden_layers=1)


@pytest.fixture(scope="module")
def compiled(model):
    return ssmcc.compile(model)


BAD_IDS = [
    (torch.rand(2, 5), "must hold integer token ids"),
    (torch.zeros(2, 5, dtype=torch.bool), "must hold integer token ids"),
    (torch.zeros(1, 0, dtype=torch.long), "empty sequence"),
    (torch.zeros(0, 4, dtype=torch.long), "batch size 0"),
    (torch.zeros(5, dtype=torch.long), r"rank 1 \(5,\) \(add a batch dim"),
    (torch.zeros(1, 2, 3, dtype=torch.long), "must have shape \\(batch, length\\), got rank 3"),
    (torch.full((1, 3), 101), "token id 101, outside the vocabulary \\[0, 101\\)"),
    (torch.full((1, 3), -1), "token id -1: token ids are >= 0"),
    ([[1, 2, 3]], "must be a torch.Tensor of token ids"),
]


@pytest.mark.parametrize("ids,message", BAD_IDS)
def test_capture_rejects_bad_example_ids(model, ids, message):
    with pytest.raises(InputError, match=message):
        ssmcc.capture(model, (ids,))


@pytest.mark.parametrize("ids,message", BAD_IDS)
def test_compiled_model_rejects_bad_ids(compiled, ids, message):
    with pytest.raises(InputError, match=message):
        compiled(ids)


def test_int32_ids_are_accepted(model, compiled):
    ids = torch.randint(0, 101, (2, 6), dtype=torch.int32)
    with torch.no_grad():
        expected = model(ids.long()).logits
    assert (compiled(ids) - expected).abs().max() <= 1e-4


def test_capture_rejects_non_module():
    with pytest.raises(
        InputError,
        match="must be a torch.nn.Module or a torch.export ExportedProgram, got function",
    ):
        ssmcc.capture(lambda x: x, (torch.zeros(1, 2),))


def test_hf_model_takes_exactly_one_example(model):
    ids = torch.zeros(1, 3, dtype=torch.long)
    with pytest.raises(InputError, match="one example tensor of token ids"):
        ssmcc.capture(model, (ids, ids))


class TwoLayerMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


def test_plain_module_captures_like_torch_export_and_says_no_ssm_found():
    model = TwoLayerMLP().eval()
    program, report = ssmcc.capture_with_report(model, (torch.randn(3, 5, 8),))
    assert report.op_counts == {} and report.ssm_layers == [] and report.routes == []
    assert any("no SSM layer found" in note for note in report.notes)
    x = torch.randn(4, 7, 8)  # other batch and length: the dims were captured dynamic
    torch.testing.assert_close(program.module()(x), model(x))
    compiled = ssmcc.compile(model, example_inputs=(torch.randn(3, 5, 8),))
    torch.testing.assert_close(compiled(x), model(x))


def test_plain_module_needs_example_inputs():
    with pytest.raises(InputError, match="pass example_inputs"):
        ssmcc.compile(TwoLayerMLP())
