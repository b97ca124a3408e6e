"""State contracts: a new stateful op streams without any pass or runtime edit, and a program that
mixes positions outside the contracted ops is refused with the node and module named.

The op here is test-only: a running sum over time, ``y_t = y_{t-1} + x_t``, whose state is the
last sum. It is defined and given its contract in this file alone.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor, nn

import ssmcc
from ssmcc.errors import LoweringError, StreamingError
from ssmcc.ops.contracts import register_state_contract, single_state
from ssmcc.passes.position_mixing import position_mixing

from .conftest import make_hf_model

TOLERANCE = 1e-4


@torch.library.custom_op("ssmcc::test_running_sum", mutates_args=())
def running_sum(x: Tensor, initial_state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """x (b, d, l) -> (y (b, d, l), last (b, d)) with y_t = y_{t-1} + x_t, y_{-1} = initial."""
    start = x.new_zeros(x.shape[:2]) if initial_state is None else initial_state
    y = start[..., None] + x.cumsum(-1)
    return y, y[..., -1].clone()


@running_sum.register_fake
def _(x, initial_state=None):
    return x.new_empty(x.shape), x.new_empty(x.shape[:2])


def _running_sum_step(state, x, initial_state=None):
    y = state + x[..., 0]
    return y[..., None], y


register_state_contract(
    running_sum,
    single_state(
        kind="sum_state",
        state_arg="initial_state",
        state_output=1,
        shape=lambda args: (args["x"].shape[1],),
        dtype=lambda args: torch.float32,
        step=_running_sum_step,
        step_op="add",
    ),
)


class RunningSumMixer(nn.Module):
    """A mixer whose only sequence mixing is the running sum (a stand-in for an SSM layer)."""

    def __init__(self, hidden: int):
        super().__init__()
        self.in_proj = nn.Linear(hidden, hidden)
        self.out_proj = nn.Linear(hidden, hidden)

    def forward(self, hidden_states, **kwargs):
        x = self.in_proj(hidden_states).transpose(1, 2) * 0.1
        y, _ = torch.ops.ssmcc.test_running_sum(x)
        return self.out_proj(torch.tanh(y.transpose(1, 2)))


class CumsumMixer(RunningSumMixer):
    """The same computation written with aten's cumsum: nothing carries its state."""

    def forward(self, hidden_states, **kwargs):
        x = self.in_proj(hidden_states) * 0.1
        return self.out_proj(torch.tanh(x.cumsum(1)))


class CausalAttention(nn.Module):
    """Standard PyTorch attention: its export computes with symbolic sizes."""

    def __init__(self, hidden: int):
        super().__init__()
        self.attn = nn.MultiheadAttention(hidden, 2, batch_first=True)

    def forward(self, hidden_states, **kwargs):
        length = hidden_states.shape[1]
        mask = torch.ones(length, length, dtype=torch.bool).triu(1)
        out, _ = self.attn(
            hidden_states, hidden_states, hidden_states, attn_mask=mask, need_weights=False
        )
        return out


def _with_mixer(layer: int, mixer_class):
    model = make_hf_model("mamba", num_hidden_layers=3)
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model.backbone.layers[layer].mixer = mixer_class(model.config.hidden_size).eval()
    return model


def _logits(model, ids):
    with torch.no_grad():
        return model(ids, use_cache=False).logits


@pytest.mark.thorough
def test_an_op_with_a_contract_streams_without_pass_or_runtime_edits():
    model = _with_mixer(1, RunningSumMixer)
    compiled = ssmcc.compile(model, target="torch")
    assert compiled.report.op_counts["test_running_sum"] == 1
    assert [s.name for s in compiled.state_specs] == [
        "layers.0.conv_state",
        "layers.0.ssm_state",
        "layers.1.sum_state",
        "layers.2.conv_state",
        "layers.2.ssm_state",
    ]
    ids = torch.randint(0, model.config.vocab_size, (2, 11))
    logits, state = compiled.prefill(ids, chunk_size=4)
    assert (logits - _logits(model, ids)).abs().max() <= TOLERANCE
    assert state["layers.1.sum_state"].shape == (2, model.config.hidden_size)
    token = torch.randint(0, model.config.vocab_size, (2,))
    step_logits, _ = compiled.step(token, state)
    expected = _logits(model, torch.cat([ids, token[:, None]], 1))[:, -1]
    assert (step_logits - expected).abs().max() <= TOLERANCE
    generated = compiled.generate(ids, 4)
    greedy = ids
    for _ in range(4):  # the model's own greedy decoding, one full forward per token
        greedy = torch.cat([greedy, _logits(model, greedy)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(generated, greedy)


@pytest.mark.thorough
def test_a_target_without_an_emitter_names_the_op():
    model = _with_mixer(1, RunningSumMixer)
    with pytest.raises(LoweringError, match="backend 'onnx' has no emitter for op ssmcc.test_"):
        ssmcc.compile(model, target="onnx")


@pytest.mark.parametrize("target", ["torch", "onnx"])
@pytest.mark.thorough
def test_attention_compiles_and_refuses_to_stream(target):
    """nn.MultiheadAttention: symbolic-size arithmetic passes the verifier; the full-sequence
    call matches eager; prefill/step name the attention instead of computing a wrong step."""
    model = _with_mixer(1, CausalAttention)
    compiled = ssmcc.compile(model, target=target)
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    assert (compiled(ids) - _logits(model, ids)).abs().max() <= TOLERANCE
    assert compiled.report.streaming.startswith("no: ")
    with pytest.raises(StreamingError) as refused:
        compiled.generate(ids, 2)
    message = str(refused.value)
    assert "scaled_dot_product_attention" in message and "attends over the sequence" in message
    assert "backbone.layers.1.mixer" in message


def test_cumsum_over_time_is_named():
    model = _with_mixer(2, CumsumMixer)
    compiled = ssmcc.compile(model, target="torch")
    with pytest.raises(StreamingError, match=r"node cumsum \(aten::cumsum\) in .*layers\.2\.mixer"):
        compiled.prefill(torch.zeros(1, 3, dtype=torch.long))


def test_hugging_face_mamba_mixes_positions_only_in_its_ssm_ops(hf_family):
    model = make_hf_model(hf_family)
    program = ssmcc.compile(model).program
    assert position_mixing(program) == []
