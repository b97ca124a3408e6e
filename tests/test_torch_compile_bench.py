"""``python -m benchmarks.torch_compile`` (suite torch-compile) on the tiny preset: each contender
in a fresh process, the table's fields present and positive. The ssmcc backend and inductor
contenders (tens of seconds of compiling even at this size) share the code path and are left to
``tests/test_dynamo_backend.py`` and the benchmark's own runs, to keep CI's time."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _run(tmp_path, contenders: str) -> dict:
    out = tmp_path / "tc.json"
    command = [sys.executable, "-m", "benchmarks.torch_compile", "--model", "mamba-tiny"]
    command += ["--lengths", "8,16", "--repeats", "1", "--contenders", contenders]
    command += ["--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("contenders", ["eager,ssmcc-target"])
def test_suite_reports_every_contender(tmp_path, contenders):
    report = _run(tmp_path, contenders)
    assert [row["contender"] for row in report["rows"]] == contenders.split(",")
    for row in report["rows"]:
        assert "error" not in row, row
        assert row["cold_s"] > 0 and row["first_16_s"] > 0
        assert row["tok_s_8"] > 0 and row["tok_s_16"] > 0
    if "inductor" in contenders:
        assert report["rows"][1]["cold_vs_inductor"] > 0
