"""``ssmcc inspect --memory``: the figures against a hand computation from the configs."""

from __future__ import annotations

import math

import pytest

from ssmcc.cli import main


def _plan(capsys, preset: str, context: int, batch: int) -> list[str]:
    assert (
        main(["inspect", preset, "--memory", "--context", str(context), "--batch", str(batch)]) == 0
    )
    out = capsys.readouterr().out
    return out[out.index("memory plan:") :].splitlines()


def _mb(value: int) -> str:
    return f"{value / 1e6:,.3f} MB"


@pytest.mark.parametrize("context,batch", [(2048, 2), (37, 1)])
def test_granite_hybrid_by_hand(capsys, context, batch):
    # GraniteMoeHybrid tiny: hidden 64, Mamba-2 expand 2 (intermediate 128), 8 heads of 16,
    # 2 groups, state 16, conv 4; attention 4 heads of 16 (64 / 4), 2 K/V heads; layers
    # mamba, attention, mamba, attention.
    conv = (128 + 2 * 2 * 16) * 3 * 4  # (intermediate + 2 groups x state) channels, k-1, float32
    ssm = 8 * 16 * 16 * 4  # heads x head_dim x state, float32
    kv = 2 * 2 * 16 * 4  # K and V, 2 heads of 16, float32
    ours = batch * (2 * (conv + ssm) + context * 2 * kv + 8)
    block = 16 * math.ceil((conv + ssm) / (16 * kv))
    vllm = batch * (2 * math.ceil(context / block) + 2) * block * kv
    lines = _plan(capsys, "granite-hybrid-tiny", context, batch)
    assert f"2 x {conv + ssm:,} B state per sequence" in lines[1]
    assert f"2 x {kv:,} B K/V per token" in lines[2]
    assert f"ssmcc:        {_mb(ours)}" in lines[4]
    assert f"attention block {block:,} tokens" in lines[5] and _mb(vllm) in lines[5]
    assert _mb(vllm - ours + batch * 8) + " of it padding" in lines[5]


def test_jamba_by_hand(capsys):
    # Jamba tiny: Mamba-1 layers 0, 1, 3 (intermediate 128, state 8, conv 4), attention at
    # layer 2 with 2 K/V heads of 16; no position counter (no rotary embeddings).
    state = 128 * 3 * 4 + 128 * 8 * 4
    kv = 2 * 2 * 16 * 4
    context, batch = 1000, 3
    block = 16 * math.ceil(state / (16 * kv))
    lines = _plan(capsys, "jamba-tiny", context, batch)
    assert f"3 x {state:,} B state per sequence" in lines[1]
    assert f"1 x {kv:,} B K/V per token" in lines[2]
    assert f"ssmcc:        {_mb(batch * (3 * state + context * kv))}" in lines[3]
    vllm = batch * (math.ceil(context / block) + 3) * block * kv
    assert f"attention block {block:,} tokens" in lines[4] and _mb(vllm) in lines[4]


def test_pure_ssm_model_has_no_paged_comparison(capsys):
    lines = _plan(capsys, "mamba-tiny", 4096, 1)
    assert "SSM layers:   2 x" in lines[1]
    assert not any("paged" in line for line in lines)
