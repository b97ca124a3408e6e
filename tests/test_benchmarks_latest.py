"""benchmarks/latest.py: per suite, the newest recorded sitting's table; a result that is not a
benchmarks.run result is refused; the README section is replaced between its markers only."""

from __future__ import annotations

import json

import pytest

from benchmarks.latest import BEGIN, END, latest_section, record, rewrite


def _sitting(date: str, model: str, rows: list[dict], cpu: str) -> dict:
    machine = {
        "threads": 2,
        "cpu": cpu,
        "read_bandwidth_GBps": {"median": 20.0},
        "matmul_GFLOPs": {"median": 200.0},
    }
    bounds = {
        "parameters": 129e6,
        "prefill_bound_tok_s": 800.0,
        "decode_bound_ms_per_token": 25.0,
    }
    return {"date": date, "model": model, "machine": machine, "bounds": bounds, "rows": rows}


def _prefill(contender: str, tokens_per_s: float) -> dict:
    summary = {"median": tokens_per_s, "min": tokens_per_s, "max": tokens_per_s}
    return {
        "suite": "prefill",
        "contender": contender,
        "length": 512,
        "tokens_per_s": summary,
        "of_bound": tokens_per_s / 800.0,
    }


def _decode(contender: str, ms: float) -> dict:
    return {
        "suite": "decode",
        "contender": contender,
        "prompt_length": 64,
        "new_tokens": 32,
        "ms_per_token": {"median": ms, "min": ms, "max": ms},
        "tokens_per_s": {"median": 1e3 / ms},
        "x_bound_time": ms / 25.0,
    }


def test_each_suite_shows_its_newest_sitting(tmp_path):
    not_applicable = {"suite": "decode", "contender": "matmuls-only", "note": "prefill only"}
    older = _sitting(
        "2026-12-01T10:00:00",
        "mamba-130m",
        [_prefill("a", 100.0), _decode("a", 30), not_applicable],
        "Old CPU",
    )
    newer = _sitting("2026-12-02T10:00:00", "mamba-130m", [_prefill("b", 555.5)], "New CPU")
    for sitting in (older, newer):
        path = tmp_path / "r.json"
        path.write_text(json.dumps(sitting))
        record(path, tmp_path)
    (tmp_path / "r.json").unlink()

    section = latest_section(tmp_path)
    decode, prefill = section.split("**prefill**")
    assert decode.startswith("**decode**") and "Old CPU" in decode and "30.0" in decode
    assert "New CPU" in prefill and "555.5" in prefill and "100.0" not in section
    assert "No sitting recorded yet: memory, export, long-prefill, prefix-cache." in section
    assert "matmuls-only" not in section  # a contender the suite does not apply to


def test_a_file_that_is_not_a_run_result_is_refused(tmp_path):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"date": "2026-12-01T10:00:00", "rows": []}))
    with pytest.raises(SystemExit, match="not a benchmarks.run result.*model"):
        record(path, tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_only_the_text_between_the_markers_is_replaced():
    text = f"# top\n{BEGIN}\nold table\n{END}\n## History\n"
    assert rewrite(text, "new table\n") == f"# top\n{BEGIN}\n\nnew table\n\n{END}\n## History\n"
    with pytest.raises(SystemExit, match="lacks the markers"):
        rewrite("# no markers\n", "x")
