"""The C++ experts kernel (kernels/cpu/moe_experts.h) as the torch target's CPU implementation of
``ssmcc::moe_experts`` (kernels/cpu/moe_binding.py): against a float64 per-token loop of the op's
math and against the op's reference, for float32 and stored experts; the reference itself for
many tokens; errors named; and the torch target's hybrid step running it."""

from __future__ import annotations

import pytest
import torch

import ssmcc
from ssmcc.kernels.cpu import native, registration
from ssmcc.kernels.cpu.linear_binding import SMALL_KERNEL_MAX_ROWS
from ssmcc.kernels.cpu.moe_binding import moe_experts_cpu
from ssmcc.ops.moe_experts import ACTIVATIONS, moe_experts_ref
from ssmcc.presets import build_preset
from tests.test_moe_experts_node import TOLERANCE, _oracle, stored
from tests.test_ops_hybrid import _moe_inputs as _inputs

pytestmark = pytest.mark.skipif(not native.available(), reason="the C++ kernels do not build here")


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [True, False])
def test_float_experts_match_the_per_token_loop(activation, gated):
    hidden, index, weights, up, down = _inputs(3, 5, 2, 40, 24, gated, seed=1)
    out = moe_experts_cpu(hidden, index, weights, up, down, activation, gated)
    expected = _oracle(hidden, index, weights, up, down, activation, gated)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


@pytest.mark.parametrize("tokens", [0, 1, 2, SMALL_KERNEL_MAX_ROWS, SMALL_KERNEL_MAX_ROWS + 1, 40])
@pytest.mark.parametrize("k", [1, 4])
def test_any_token_count_and_top_k(tokens, k):
    """Up to SMALL_KERNEL_MAX_ROWS tokens the kernel runs, beyond it the reference: both right."""
    hidden, index, weights, up, down = _inputs(max(tokens, 1), 6, k, 33, 17, True, seed=tokens + k)
    hidden, index, weights = hidden[:tokens], index[:tokens], weights[:tokens]
    out = moe_experts_cpu(hidden, index, weights, up, down, "silu", True)
    assert out.shape == hidden.shape and out.dtype == hidden.dtype
    expected = _oracle(hidden, index, weights, up, down, "silu", True)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)


def test_indices_outside_the_experts_add_nothing():
    hidden, index, weights, up, down = _inputs(4, 4, 2, 16, 8, True, seed=3)
    index[0, 0], index[2, 1] = -1, 4  # expert parallelism's sentinels
    out = moe_experts_cpu(hidden, index, weights, up, down, "silu", True)
    torch.testing.assert_close(
        out.double(), _oracle(hidden, index, weights, up, down, "silu", True), **TOLERANCE
    )


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
def test_stored_experts_match_the_loop_on_the_dequantised_weights(scheme):
    hidden, index, weights, up, down = _inputs(3, 4, 2, 64, 32, True, seed=7)

    (up_q, up_s, dense_up), (down_q, down_s, dense_down) = stored(up, scheme), stored(down, scheme)
    out = moe_experts_cpu(hidden, index, weights, up_q, down_q, "silu", True, up_s, down_s)
    expected = _oracle(hidden, index, weights, dense_up, dense_down, "silu", True)
    torch.testing.assert_close(out.double(), expected, **TOLERANCE)
    reference = moe_experts_ref(hidden, index, weights, up_q, down_q, "silu", True, up_s, down_s)
    torch.testing.assert_close(out, reference, rtol=1e-5, atol=1e-5)


def test_errors_name_the_argument():
    hidden, index, weights, up, down = _inputs(2, 3, 2, 8, 6, True, seed=0)
    with pytest.raises(RuntimeError, match=r"up must have shape \(experts, 2\*width, hidden\)"):
        moe_experts_cpu(hidden, index, weights, up[:, :10], down, "silu", True)
    with pytest.raises(RuntimeError, match="activation must be one of"):
        moe_experts_cpu(hidden, index, weights, up, down, "tanh", True)


def test_eager_op_calls_reach_the_kernel():
    hidden, index, weights, up, down = _inputs(1, 4, 2, 16, 8, True, seed=5)
    before = registration.CALLS["moe_experts", "cpp"]
    out = torch.ops.ssmcc.moe_experts(hidden, index, weights, up, down, "silu", True)
    assert registration.CALLS["moe_experts", "cpp"] == before + 1
    torch.testing.assert_close(out, moe_experts_ref(hidden, index, weights, up, down), **TOLERANCE)


@pytest.mark.slow
def test_torch_target_hybrid_decode_runs_the_kernel_and_matches_the_reference_kernels():
    """granite-hybrid-tiny on the torch target: prefill + steps with the C++ kernels (the experts
    kernel in every step) equal the same program on the ops' references within 1e-4."""
    model = build_preset("granite-hybrid-tiny", seed=0).eval()
    fast = ssmcc.compile(model, target="torch")
    reference = ssmcc.compile(model, target="torch", kernels="reference")
    ids = torch.randint(
        0, model.config.vocab_size, (3, 9), generator=torch.Generator().manual_seed(0)
    )
    (fast_logits, fast_state), (ref_logits, ref_state) = fast.prefill(ids), reference.prefill(ids)
    torch.testing.assert_close(fast_logits, ref_logits, rtol=1e-4, atol=1e-4)
    token = ids[:, -1]
    for step in range(4):
        if step == 3:  # the replay (which a hybrid's attention refuses) has had its tries
            with native.recording_calls() as calls:
                fast.step(token, fast_state)
            moe_calls = sum(name == "ssmcc_moe_experts" for name, _ in calls)
            assert moe_calls == model.config.num_hidden_layers  # each layer has its MoE
        (fast_logits, fast_state), (ref_logits, ref_state) = (
            fast.step(token, fast_state),
            reference.step(token, ref_state),
        )
        torch.testing.assert_close(fast_logits, ref_logits, rtol=1e-4, atol=1e-4)
        token = ref_logits.argmax(-1)
