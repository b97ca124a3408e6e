"""The trained test model (``tests/trained_models.py``) has learnt its text: on held-out bytes
its loss is far below that of a random model of the same config (ln 256 = 5.5 nats/byte)."""

from __future__ import annotations

import pytest
import torch

from .trained_models import held_out_ids, next_byte_loss, prompts, untrained_mamba


@pytest.mark.slow  # trains the model in a second worker of a clean run; test_quantize uses it
def test_trained_mamba_predicts_held_out_text_far_better_than_random(trained_mamba_model):
    assert not trained_mamba_model.training
    assert all(p.dtype == torch.float32 for p in trained_mamba_model.parameters())
    held_out = held_out_ids()[:384]

    trained_loss = next_byte_loss(trained_mamba_model, held_out)
    random_loss = next_byte_loss(untrained_mamba(), held_out)

    assert trained_loss < 3.0, trained_loss
    assert random_loss > 5.0, random_loss
    [prompt] = prompts(1, 64)
    assert prompt.shape == (1, 64) and prompt.dtype == torch.int64
