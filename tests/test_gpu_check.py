"""``benchmarks/gpu_check.py`` in its dry mode: the same checks on the CPU, tiny shapes, Triton's
interpreter (here with ``TRITON_INTERPRET=1`` from the start, as a user of the interpreter would
set it), so the script a lent GPU runs cannot rot."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _dry_run(script: str, tmp_path, **env) -> dict:
    """``benchmarks/<script> --dry`` in a fresh process; its JSON report."""
    out = tmp_path / "dry.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--dry", "--out", str(out)],
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
    report = _dry_run("gpu_check.py", tmp_path, TRITON_INTERPRET="1")
    ops = {row["op"] for row in report["rows"]}
    assert {"selective_scan", "ssd_scan", "mamba_mixer", "ssd_mixer_step"} <= ops
    assert all(row["triton_ms"] > 0 and row["torch_ms"] > 0 for row in report["rows"])


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
    interpreter, against HF, with every timing path taken."""
    report = _dry_run("gpu_models.py", tmp_path)
    assert [row["model"] for row in report["rows"]] == ["mamba-tiny", "mamba2-tiny"]
    for row in report["rows"]:
        assert row["greedy_equal"] == row["greedy_of"]
        # Dry-run timings are a few interpreted tokens on a loaded CPU: the per-token difference
        # can come out negative, so only their presence is checked.
        assert row["prefill_ms"] > 0 and isinstance(row["hf_decode_ms"], float)
        assert isinstance(row["decode_ms"], float) and isinstance(row["decode_speedup"], float)
