"""The benchmark harness itself: one command gives a table and JSON; a failing or hanging
contender becomes an error row and the others still run."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_harness_survives_failing_and_hanging_contenders(tmp_path):
    command = [
        sys.executable,
        "-m",
        "benchmarks.run",
        "--small",
        "--suite",
        "prefill",
        "--contenders",
        "debug-hang,hf-eager,debug-fail,ssmcc-torch",
        "--lengths",
        "8,24",
        "--repeats",
        "2",
        "--timeout",
        "20",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "results.json").read_text())
    rows = {(r["suite"], r["contender"], r.get("length")): r for r in result["rows"]}

    assert rows[("prefill", "debug-hang", None)]["error"] == "timeout after 20s"
    assert "always fails" in rows[("prefill", "debug-fail", None)]["error"]
    for contender in ("hf-eager", "ssmcc-torch"):
        for length in (8, 24):
            tps = rows[("prefill", contender, length)]["tokens_per_s"]
            assert tps["min"] <= tps["median"] <= tps["max"] and tps["n"] == 2
    assert rows[("prefill", "hf-eager", 8)]["vs_baseline"] == 1.0
    assert 0 < rows[("prefill", "ssmcc-torch", 24)]["of_bound"] < 1
    for bound in ("read_bandwidth_GBps", "matmul_GFLOPs"):
        figure = result["machine"][bound]
        assert 0 < figure["min"] <= figure["median"] <= figure["max"]
    assert result["bounds"]["prefill_bound_tok_s"] > 0
    assert "== prefill ==" in done.stdout and "timeout after 20s" in done.stdout
    assert (tmp_path / "prefill_tokens_per_s.png").stat().st_size > 1000


def test_reroll_benchmark_measures_one_model():
    """The re-roll benchmark's row for a tiny hand-written stack: counts from the real passes."""
    from benchmarks.handwritten_mamba import build
    from benchmarks.reroll import format_rows, measure

    row = measure("loop", build("loop", layers=1, d_model=8, d_state=4), 64, 8, repeats=1)
    assert row["scans"] == 1 and row["nodes_exported"] > row["nodes_after"]
    assert all(row[key] > 0 for key in ("exported_ms", "ssmcc_torch_ms", "eager_ms"))
    table = format_rows([row])
    assert table.splitlines()[2].startswith("loop") and "x" in table


def _worker_rows(contender: str, suite: str, env: dict) -> list[dict]:
    spec = {
        "suite": suite,
        "contender": contender,
        "model": "mamba-tiny",
        "lengths": [16],
        "batch": 1,
        "repeats": 2,
        "threads": 2,
        "prompt_length": 4,
        "new_tokens": 8,
        "export_length": 16,
        "long_repeats": 1,
        "prefix_prompt_length": 32,
        "prefix_cached_length": 16,
        "seed": 0,
    }
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.worker", json.dumps(spec)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("BENCH_ROW ")]
    return [json.loads(line.removeprefix("BENCH_ROW ")) for line in lines]


@pytest.mark.slow
def test_llama_cpp_contender_says_where_to_find_it():

    env = {k: v for k, v in os.environ.items() if k != "SSMCC_LLAMA_CPP"}
    (row,) = _worker_rows("llama-cpp", "prefill", env)
    assert "set SSMCC_LLAMA_CPP to a llama.cpp tree" in row["note"]
    (row,) = _worker_rows("llama-cpp", "memory", env)
    assert "timed by llama-bench" in row["note"]


def test_llama_bench_rates_become_seconds_per_token():
    """llama-bench reports tokens/s per sample: 50 tok/s of decode is 20 ms per token whatever
    the number of generated tokens; a 2048-token prompt at 512 tok/s took 4 s."""
    from benchmarks.llama_cpp import seconds_per_run

    assert seconds_per_run({"samples_ts": [50.0, 40.0]}, 1) == [0.02, 0.025]
    assert seconds_per_run({"samples_ts": [512.0]}, 2048) == [4.0]


@pytest.mark.skipif(
    "SSMCC_LLAMA_CPP" not in __import__("os").environ,
    reason="llama.cpp not built here (SSMCC_LLAMA_CPP unset; benchmarks/README.md)",
)
def test_llama_cpp_contender_measures_prefill_and_decode():

    (prefill,) = _worker_rows("llama-cpp", "prefill", dict(os.environ))
    assert prefill["tokens_per_s"]["median"] > 0 and "last position" in prefill["remark"]
    (decode,) = _worker_rows("llama-cpp", "decode", dict(os.environ))
    assert 0 < decode["ms_per_token"]["median"] < 1000  # a tiny model: well under a second


@pytest.mark.slow
def test_interleaved_decode_reports_every_contender_per_round(tmp_path):
    """Without llama.cpp (SSMCC_LLAMA_CPP unset) the ssmcc contenders still run, each round."""

    env = {k: v for k, v in os.environ.items() if k != "SSMCC_LLAMA_CPP"}
    command = [
        sys.executable,
        "-m",
        "benchmarks.interleaved_decode",
        "--model",
        "mamba-tiny",
        "--rounds",
        "2",
        "--new-tokens",
        "4",
        "--prompt-length",
        "5",
        "--targets",
        "torch",
        "--quantize",
        "none,int8",
        "--out",
        str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=400, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "llama.cpp skipped" in done.stderr
    result = json.loads((tmp_path / "decode_interleaved.json").read_text())
    assert len(result["rounds"]) == 2
    assert set(result["summary"]) == {"ssmcc-torch", "ssmcc-torch-int8"}
    assert all(row["ms_per_token"] > 0 for row in result["summary"].values())


@pytest.mark.parametrize("contender", ["hf-eager", "ssmcc-torch"])
def test_decode_is_timed_between_the_new_tokens(contender):
    """Both streamer protocols (Hugging Face's put, with the prompt first; ssmcc's call per token
    column) reach the clock: a decode row per contender, time per token positive."""
    (row,) = _worker_rows(contender, "decode", dict(os.environ))
    assert "error" not in row, row.get("error")
    assert 0 < row["ms_per_token"]["min"] <= row["ms_per_token"]["max"] < 1000


def test_token_clock_reads_only_the_new_tokens():
    from benchmarks.stats import TokenClock

    clock = TokenClock()
    clock.times = [0.0, 5.0, 5.5, 6.0, 6.5]  # a prompt put (HF), then 4 new tokens
    assert clock.seconds_per_token(4) == 0.5
    with pytest.raises(ValueError, match="2 or more timed tokens"):
        clock.seconds_per_token(6)


@pytest.mark.slow
def test_serving_suite_reports_both_ways_with_the_same_tokens(tmp_path):
    pytest.importorskip("pytriton", reason="serving extra not installed")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.serving",
            "--model",
            "mamba-tiny",
            "--sequences",
            "3",
            "--new-tokens",
            "4",
            "--prompt-length",
            "5",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads((tmp_path / "serving.json").read_text())
    assert result["same_tokens"] and result["server_inferences"] == 2 * 3 * 4 + 4
    assert result["one_at_a_time"]["tokens_per_s"] > 0 and result["concurrent"]["tokens_per_s"] > 0


def test_gemv_benchmark_streams_every_linear_weight_once(tmp_path):
    """The graph holds one Linear node per distinct weight (a tied head once) and computes
    x W^T for each; the report has every row count."""
    import numpy as np
    import onnxruntime as ort
    import torch

    from benchmarks.gemv import linear_graph, linear_weights, main
    from ssmcc.lowering.onnx.runtime import custom_op_library
    from ssmcc.presets import build_preset

    model = build_preset("granite-hybrid-tiny", seed=0)
    weights = linear_weights(model)
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(weights) == len(linears) - (1 if tied else 0)
    graph, widths = linear_graph(weights)
    options = ort.SessionOptions()
    options.register_custom_ops_library(custom_op_library("auto"))
    session = ort.InferenceSession(graph.SerializeToString(), options, ["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    feed = {f"x_{k}": rng.standard_normal((3, k)).astype(np.float32) for k in widths}
    for w, y in zip(weights, session.run(None, feed), strict=True):
        np.testing.assert_allclose(y, feed[f"x_{w.shape[1]}"] @ w.T, rtol=1e-5, atol=1e-5)

    assert (
        main(["--model", "mamba-tiny", "--rounds", "1", "--rows", "1,3", "--out", str(tmp_path)])
        == 0
    )
    result = json.loads((tmp_path / "gemv.json").read_text())
    assert set(result["summary"]) == {"rows_1", "rows_3"}
    assert all(row["GBps"] > 0 for row in result["summary"].values())
