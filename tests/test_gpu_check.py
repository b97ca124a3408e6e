"""``benchmarks/gpu_check.py`` in its dry mode: the same checks on the CPU, tiny shapes, Triton's
interpreter (here with ``TRITON_INTERPRET=1`` from the start, as a user of the interpreter would
set it), so the script a lent GPU runs cannot rot. Its anchors come from source trees
(``tests/anchor_trees.py``): mamba_ssm's kernels run in the interpreter against the references,
fla's mapping runs through fla's PyTorch recurrence; without the trees every anchor says why it
was skipped and no gate against it is met. ``gpu_models.py --dry`` (slow): the tiny presets
against HF eager and HF under ``torch.compile`` (Dynamo's eager backend on the CPU)."""

from __future__ import annotations

import importlib.util
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.anchor_trees import anchor_tree

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _dry_run(script: str, tmp_path, *arguments, **env) -> dict:
    """``benchmarks/<script> --dry`` in a fresh process; its JSON report."""
    out = tmp_path / "dry.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--dry", "--out", str(out), *arguments],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "PYTHONWARNINGS": "ignore", **env},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    report = json.loads(out.read_text())
    assert report["dry"] and report["all_ok"]
    return report


def test_gpu_check_dry_run(tmp_path):
    # the anchors' code imports einops (the test extra); without it, the path without anchors
    with_anchors = importlib.util.find_spec("einops") is not None
    trees = {
        variable: anchor_tree(variable, tmp_path / variable.lower()) if with_anchors else None
        for variable in ("SSMCC_MAMBA_SSM_SRC", "SSMCC_FLA_SRC")
    }
    env = {"TRITON_INTERPRET": "1", "SSMCC_MAMBA_SSM_SRC": "", "SSMCC_FLA_SRC": ""}
    env.update({k: v for k, v in trees.items() if v})
    report = _dry_run("gpu_check.py", tmp_path, **env)
    rows = [row for row in report["rows"] if "skipped" not in row]
    ops = {row["op"] for row in rows}
    assert {"selective_scan", "ssd_scan", "mamba_mixer", "ssd_mixer_step"} <= ops
    assert {"mamba1-2.8b", "mamba2-2.7b"} <= {row["family"] for row in rows}  # optional rows
    assert all(row["triton_ms"] > 0 and row["torch_ms"] > 0 for row in rows)
    assert report["copy_GBps"] > 0 and all(row["of_copy"] > 0 for row in rows)
    contenders = [
        (row["op"], name, entry) for row in rows for name, entry in row["contenders"].items()
    ]
    assert {op for op, _, _ in contenders} == {
        "ssd_scan",
        "selective_state_update",
        "ssd_state_update",
        "rmsnorm_gated",
    }
    mamba = [e for _, name, e in contenders if name == "mamba_ssm"]
    fla = [e for _, name, e in contenders if name == "fla"]
    if trees["SSMCC_MAMBA_SSM_SRC"]:
        # mamba_ssm's Triton kernels, interpreted, agree with ssmcc's references
        assert all(e["status"] == "measured" and e["ok"] and e["ms"] > 0 for e in mamba), mamba
        gates = report["gates"]["mamba_ssm"]["ms"]
        assert gates["unmeasured"] == 0 and gates["met"] + gates["not_met"] == len(mamba)
    else:
        assert all(e["status"].startswith("skipped: SSMCC_MAMBA_SSM_SRC") for e in mamba)
    if trees["SSMCC_FLA_SRC"]:
        assert all(e["status"].startswith("skipped: no GPU") for e in fla)
        assert all(e["mapping"]["ok"] for e in fla), fla
    else:
        assert all(e["status"].startswith("skipped: SSMCC_FLA_SRC") for e in fla)
    # fla never ran a kernel here: no gate against it is met
    assert report["gates"]["fla"]["ms"] == {"met": 0, "not_met": 0, "unmeasured": len(fla)}


def test_gpu_check_says_it_needs_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_check.py")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2 and "--dry" in result.stderr


@pytest.mark.slow
def test_gpu_models_dry_run(tmp_path):
    """``benchmarks/gpu_models.py --dry``: the tiny presets through the triton target in the
    interpreter, against HF, with every timing path taken and both contenders measured."""
    report = _dry_run("gpu_models.py", tmp_path, "--budget", "100000")
    assert [row["model"] for row in report["rows"]] == ["mamba-tiny", "mamba2-tiny"]
    for row in report["rows"]:
        assert row["greedy_equal"] == row["greedy_of"]
        # Dry-run timings are a few interpreted tokens on a loaded CPU: the per-token difference
        # can come out negative, so only their presence is checked.
        assert row["prefill_ms"] > 0 and isinstance(row["decode_ms"], float)
        assert row["decode_path"].startswith("eager: the program runs on the CPU")
        eager, compiled = row["contenders"]["hf-eager"], row["contenders"]["hf-compiled"]
        assert eager["status"] == compiled["status"] == "measured", row["contenders"]
        assert compiled["how"] == "torch.compile(model.forward, backend='eager')"
        assert compiled["graphs"] >= 1 and compiled["compile_s"] > 0
        assert all(isinstance(e["decode_x"], float) for e in (eager, compiled))
    for counts in report["gates"].values():
        assert all(sum(c.values()) == 2 for c in counts.values())


def test_gpu_models_budget_skips_what_it_cannot_run(tmp_path):
    """A spent budget: every preset and contender says so, and no gate is counted as met."""
    from benchmarks.gpu_models import run_models

    result = run_models(True, str(tmp_path / "m.json"), budget_s=0.0)
    assert [row["error"] for row in result["rows"]] == ["skipped (time budget)"] * 2
    assert result["gates"] == {} and result["all_ok"] is True
