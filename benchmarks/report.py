"""Turn benchmark rows into ratios, a text table and PNG plots; write a result's JSON."""

from __future__ import annotations

import json
import os
import time

BASELINE = "hf-eager"
MATMULS = "matmuls-only"


def write_json(result: dict, out: str | None, name: str) -> str:
    """``result`` as ``out/name`` (``out`` default: ``benchmarks/results/<time>/``); the path."""
    out = out or os.path.join(os.path.dirname(__file__), "results", time.strftime("%Y%m%d-%H%M%S"))
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return path


def _fmt(summary: dict | None, digits: int = 1) -> str:
    if not summary:
        return "-"
    return (
        f"{summary['median']:.{digits}f} [{summary['min']:.{digits}f}, {summary['max']:.{digits}f}]"
    )


def annotate(rows: list[dict], bounds: dict) -> None:
    """Add ``vs_baseline`` (ratio to hf-eager in the same run) and ``of_bound`` to each row."""

    def key(row):
        return (row["suite"], row.get("length"), row.get("batch"))

    baseline = {key(r): r for r in rows if r["contender"] == BASELINE and "error" not in r}
    matmuls = {key(r): r for r in rows if r["contender"] == MATMULS and "tokens_per_s" in r}
    for row in rows:
        base = baseline.get(key(row))
        if row["suite"] == "prefill" and "tokens_per_s" in row:
            median = row["tokens_per_s"]["median"]
            row["of_bound"] = median / bounds["prefill_bound_tok_s"]
            if key(row) in matmuls:  # time relative to the model's matmuls alone
                row["x_matmul_time"] = matmuls[key(row)]["tokens_per_s"]["median"] / median
            if base and "tokens_per_s" in base:
                row["vs_baseline"] = median / base["tokens_per_s"]["median"]
        if row["suite"] == "decode" and "ms_per_token" in row:
            ms = row["ms_per_token"]["median"]
            bound = bounds["decode_bound_ms_per_token"]
            if row.get("weight_bytes"):  # weights stored small: the time to read those bytes
                bound *= row["weight_bytes"] / bounds["weight_bytes_per_token"]
            row["of_bound"] = bound / ms
            row["x_bound_time"] = ms / bound
            if base and "ms_per_token" in base:
                row["vs_baseline"] = base["ms_per_token"]["median"] / ms
        if row["suite"] == "memory" and "peak_rss_MB" in row and base and "peak_rss_MB" in base:
            row["vs_baseline"] = row["peak_rss_MB"] / base["peak_rss_MB"]


def _ratio(row: dict) -> str:
    return f"{row['vs_baseline']:.2f}x" if "vs_baseline" in row else "-"


def _problem(row: dict) -> str | None:
    if "error" in row:
        return f"error: {row['error'][:110]}"
    if "note" in row:
        return f"n/a: {row['note']}"
    return None


def _remark(row: dict) -> str:
    """What a measured row says about itself (e.g. llama.cpp's last-token-only prefill)."""
    return f"   [{row['remark']}]" if "remark" in row else ""


def format_table(result: dict) -> str:
    rows, bounds, machine = result["rows"], result["bounds"], result["machine"]
    out = [
        f"model {result['model']} ({bounds['parameters'] / 1e6:.1f}M params), "
        f"{machine['threads']} threads, {result['date']}",
        f"machine: read {machine['read_bandwidth_GBps']['median']:.1f} GB/s, "
        f"matmul {machine['matmul_GFLOPs']['median']:.0f} GFLOP/s -> prefill bound "
        f"{bounds['prefill_bound_tok_s']:.0f} tok/s, decode bound "
        f"{bounds['decode_bound_ms_per_token']:.3g} ms/token",
    ]
    for suite in ("prefill", "decode", "memory", "export", "long-prefill", "prefix-cache"):
        suite_rows = [r for r in rows if r["suite"] == suite]
        if not suite_rows:
            continue
        out.append(f"\n== {suite} ==")
        for row in suite_rows:
            name = f"{row['contender']:14s}"
            problem = _problem(row)
            shape = (
                f"L={row['length']:<6d}"
                if "length" in row
                else f"P={row.get('prompt_length', '-')} N={row.get('new_tokens', '-')}"
                if suite == "decode"
                else ""
            )
            if problem:
                out.append(f"{name} {shape} {problem}")
            elif suite == "prefill":
                matmul = (
                    f"   {row['x_matmul_time']:.2f}x matmul time" if "x_matmul_time" in row else ""
                )
                out.append(
                    f"{name} {shape} {_fmt(row['tokens_per_s'])} tok/s   "
                    f"{_ratio(row)} HF   {100 * row['of_bound']:.0f}% of bound{matmul}"
                    + _remark(row)
                )
            elif suite == "decode":
                ttft = f"TTFT {row['ttft_s']['median'] * 1e3:.0f} ms  " if "ttft_s" in row else ""
                out.append(
                    f"{name} {shape} {_fmt(row['ms_per_token'])} ms/token  "
                    f"({row['tokens_per_s']['median']:.1f} tok/s)  {ttft}{_ratio(row)} HF  "
                    f"{row['x_bound_time']:.2f}x the bound's time" + _remark(row)
                )
            elif suite == "memory":
                out.append(
                    f"{name} {shape} peak RSS {row['peak_rss_MB']:.0f} MB "
                    f"(+{row['prefill_extra_MB']:.0f} MB during prefill)  {_ratio(row)} HF"
                )
            elif suite == "long-prefill":
                out.append(
                    f"{name} {shape} chunk {row['chunk_size']}: {_fmt(row['tokens_per_s'])} "
                    f"tok/s  peak RSS {row['peak_rss_MB']:.0f} MB "
                    f"(+{row['prefill_extra_MB']:.0f} MB during prefill)"
                    + _vs_first_length(row, suite_rows)
                )
            elif suite == "prefix-cache":
                out.append(
                    f"{name} P={row['prompt_length']} cached {row['cached_length']}: TTFT "
                    f"{row['ttft_cached_s']['median'] * 1e3:.0f} ms vs "
                    f"{row['ttft_uncached_s']['median'] * 1e3:.0f} ms uncached "
                    f"({row['ttft_ratio']:.3f}x), logits max|diff| {row['max_logit_diff']:.1e}"
                )
            else:
                nodes = row.get("nodes", "-")
                size = f"{row['artifact_MB']:.1f} MB" if "artifact_MB" in row else "-"
                out.append(
                    f"{name} prepare {row.get('prepare_s', 0):.1f}s "
                    f"({row.get('prepare_what', 'none')}), nodes {nodes}, artifact {size}, "
                    f"other length: {row.get('runs_other_length')}"
                )
    return "\n".join(out)


def _vs_first_length(row: dict, rows: list[dict]) -> str:
    """Peak RSS and tokens/s relative to the same contender's shortest length."""
    same = [r for r in rows if r["contender"] == row["contender"] and "peak_rss_MB" in r]
    first = min(same, key=lambda r: r["length"])
    if first is row:
        return ""
    rss = row["peak_rss_MB"] / first["peak_rss_MB"]
    speed = row["tokens_per_s"]["median"] / first["tokens_per_s"]["median"]
    return f"  vs L={first['length']}: {rss:.2f}x RSS, {speed:.2f}x tok/s"


def write_plots(result: dict, folder: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for suite, metric, ylabel, filename in (
        ("prefill", "tokens_per_s", "prefill tokens/s", "prefill_tokens_per_s.png"),
        ("memory", "peak_rss_MB", "peak RSS (MB)", "memory_peak_rss.png"),
    ):
        rows = [r for r in result["rows"] if r["suite"] == suite and metric in r]
        if not rows:
            continue
        figure, axes = plt.subplots(figsize=(7, 4.5))
        for contender in dict.fromkeys(r["contender"] for r in rows):
            points = sorted((r["length"], r[metric]) for r in rows if r["contender"] == contender)
            xs = [p[0] for p in points]
            if isinstance(points[0][1], dict):
                ys = [p[1]["median"] for p in points]
                err = [
                    [y - p[1]["min"] for y, p in zip(ys, points, strict=True)],
                    [p[1]["max"] - y for y, p in zip(ys, points, strict=True)],
                ]
                axes.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=contender)
            else:
                axes.plot(xs, [p[1] for p in points], marker="o", label=contender)
        if suite == "prefill":
            axes.axhline(
                result["bounds"]["prefill_bound_tok_s"],
                color="gray",
                linestyle="--",
                label="matmul bound",
            )
        axes.set_xscale("log", base=2)
        axes.set_xlabel("sequence length (tokens)")
        axes.set_ylabel(ylabel)
        axes.set_title(f"{result['model']}, {result['machine']['threads']} threads")
        axes.legend()
        axes.grid(alpha=0.3)
        path = os.path.join(folder, filename)
        figure.tight_layout()
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
