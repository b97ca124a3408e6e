"""How compiling and running grow with model size: the ``scale`` suite.

    python -m benchmarks.scale                                  # 130m .. 1.4b, onnx and torch
    python -m benchmarks.scale --sizes 130m,370m --targets onnx --quantize none,bf16
    SSMCC_BENCH_MODELS=/big/disk python -m benchmarks.scale --sizes 2.8b --quantize bf16

For each size -- Mamba-1's (the configs of state-spaces/mamba-{130m,370m,790m,1.4b,2.8b}) and
Mamba-2's (``--sizes mamba2-130m,...``: the configs of
state-spaces/mamba2-{130m,370m,780m,1.3b,2.7b}) -- with random weights, the model is built once and
saved with ``save_pretrained`` under ``$SSMCC_BENCH_MODELS`` (default
``~/.cache/ssmcc/bench-models``); then, each in a fresh process, it is compiled from that folder
(``ssmcc.load_model`` + ``ssmcc.compile`` + ``save``) and the artifact is run (``ssmcc.load`` + a
prompt of ``--prompt`` tokens + ``--new-tokens`` greedy tokens). Memory is net peak RSS: the
process's peak minus its RSS right after its imports (torch, onnxruntime, ssmcc), so small models
are judged fairly; it is also given as a multiple of the weights' bytes (what the checkpoint holds;
for ``--quantize bf16`` what the artifact stores).

Output: a table on stdout, ``scale.json`` and ``scale.png`` (each figure against parameter count,
log-log) in ``--out``, with the fitted exponent of compile time against parameter count.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

# state-spaces/mamba-* (Mamba-1; vocab 50280 as in HF's conversions, state 16) and
# state-spaces/mamba2-* (Mamba-2; vocab 50277 padded to 50288, state 128, head 64, 1 group):
# name -> (family, d_model, n_layer)
SIZES = {
    "130m": ("mamba", 768, 24),
    "370m": ("mamba", 1024, 48),
    "790m": ("mamba", 1536, 48),
    "1.4b": ("mamba", 2048, 48),
    "2.8b": ("mamba", 2560, 64),
    "mamba2-130m": ("mamba2", 768, 24),
    "mamba2-370m": ("mamba2", 1024, 48),
    "mamba2-780m": ("mamba2", 1536, 48),
    "mamba2-1.3b": ("mamba2", 2048, 48),
    "mamba2-2.7b": ("mamba2", 2560, 64),
}
DEFAULT_SIZES = ["130m", "370m", "790m", "1.4b"]


def model_folder(size: str) -> str:
    """Where a size's random-weight checkpoint is saved (once)."""
    name = size if SIZES[size][0] == "mamba2" else f"mamba-{size}"
    return os.path.join(models_dir(), name)


def _progress(message: str) -> None:
    print(f"[scale] {message}", file=sys.stderr, flush=True)


def models_dir() -> str:
    return os.environ.get(
        "SSMCC_BENCH_MODELS", os.path.join(os.path.expanduser("~"), ".cache/ssmcc/bench-models")
    )


# ---- the measurements, each run in its own process (``--phase``) -------------------------


def _rss() -> tuple[float, float]:
    from ssmcc.progress import resident_memory

    return resident_memory()


def _phase_prepare(size: str, folder: str) -> dict:
    """Build the size's model with random weights and save it (once)."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM, MambaConfig, MambaForCausalLM

    family, hidden, layers = SIZES[size]
    if family == "mamba2":
        config = Mamba2Config(
            vocab_size=50288,
            hidden_size=hidden,
            num_hidden_layers=layers,
            state_size=128,
            expand=2,
            head_dim=64,
            num_heads=2 * hidden // 64,
            n_groups=1,
            chunk_size=256,
            tie_word_embeddings=True,
        )
        model_class = Mamba2ForCausalLM
    else:
        config = MambaConfig(
            vocab_size=50280, hidden_size=hidden, num_hidden_layers=layers, state_size=16, expand=2
        )
        model_class = MambaForCausalLM
    torch.manual_seed(0)
    start = time.perf_counter()
    model = model_class(config).eval()
    model.save_pretrained(folder + ".partial", max_shard_size="2GB")  # a shard's copy at a time
    os.replace(folder + ".partial", folder)
    params = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    return {"parameters": params, "build_s": time.perf_counter() - start}


def _phase_compile(folder: str, target: str, quantize: str, out: str) -> dict:
    import onnxruntime  # noqa: F401 (part of the baseline, as the issue measures it)

    import ssmcc
    from ssmcc.presets import load_model

    base = _rss()[0]
    start = time.perf_counter()
    model = load_model(folder)
    loaded = time.perf_counter() - start
    unique = {t.data_ptr(): t for t in model.state_dict().values()}  # a tied head once
    weights = sum(t.numel() * t.element_size() for t in unique.values())
    parameters = sum(t.numel() for t in unique.values())
    compiled = ssmcc.compile(model, target=target, quantize=quantize)
    compiled.save(out)
    seconds = time.perf_counter() - start
    del compiled, model
    artifact = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
    return {
        "compile_s": seconds,
        "load_s": loaded,
        "compile_net_peak_bytes": _rss()[1] - base,
        "checkpoint_weight_bytes": weights,
        "parameters": parameters,
        "artifact_bytes": artifact,
    }


def _phase_run(artifact: str, prompt: int, new_tokens: int) -> dict:
    import onnxruntime  # noqa: F401 (part of the baseline, as the issue measures it)
    import torch

    import ssmcc

    base = _rss()[0]
    compiled = ssmcc.load(artifact)
    ids = torch.randint(0, 50000, (1, prompt), generator=torch.Generator().manual_seed(0))
    compiled.generate(ids[:, :8], 2)  # sessions open, kernels built
    start = time.perf_counter()
    compiled.generate(ids, 1)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    out = compiled.generate(ids[:, :8], new_tokens + 1)
    generate = time.perf_counter() - start
    first = time.perf_counter()
    compiled.generate(ids[:, :8], 1)
    first = time.perf_counter() - first
    assert out.shape[1] == 8 + new_tokens + 1
    return {
        "prefill_tokens_per_s": prompt / prefill,
        "decode_ms_per_token": (generate - first) / new_tokens * 1e3,
        "run_net_peak_bytes": _rss()[1] - base,
    }


# ---- the driver ----------------------------------------------------------------------------


def _run_phase(args: list[str], timeout: float) -> dict:
    command = [sys.executable, "-m", "benchmarks.scale", "--phase", *args]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"over the {timeout:.0f} s limit"}
    for line in done.stdout.splitlines():
        if line.startswith("SCALE_ROW "):
            return json.loads(line.removeprefix("SCALE_ROW "))
    lines = (done.stderr or done.stdout or "no output").strip().splitlines()
    return {"error": f"exit {done.returncode}: {lines[-1] if lines else ''}"[:300]}


def _fit_exponent(rows: list[dict], key: str) -> float | None:
    """Least-squares slope of log(key) against log(parameters)."""
    points = [
        (math.log(r["parameters"]), math.log(r[key]))
        for r in rows
        if r.get(key) and "error" not in r
    ]
    if len(points) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else None


def _table(rows: list[dict]) -> str:
    head = (
        "size         target quant  params   weights  compile s  compile net    artifact  run net"
        "        prefill tok/s  decode ms"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['size']:12} {r['target']:6} {r['quantize']:6} error: {r['error']}")
            continue
        gb = 1e9
        lines.append(
            f"{r['size']:12} {r['target']:6} {r['quantize']:6} {r['parameters'] / 1e6:6.0f}M "
            f"{r['checkpoint_weight_bytes'] / gb:6.2f}GB {r['compile_s']:9.1f} "
            f"{r['compile_net_peak_bytes'] / gb:6.2f}GB {r['compile_x_weights']:4.2f}x "
            f"{r['artifact_bytes'] / gb:6.2f}GB {r['run_net_peak_bytes'] / gb:6.2f}GB "
            f"{r['run_x_weights']:4.2f}x {r['prefill_tokens_per_s']:12.1f} "
            f"{r['decode_ms_per_token']:10.1f}"
        )
    return "\n".join(lines)


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [
        ("compile_s", "compile time (s)"),
        ("compile_net_peak_bytes", "compile net peak RSS (bytes)"),
        ("artifact_bytes", "artifact size (bytes)"),
        ("run_net_peak_bytes", "run net peak RSS (bytes)"),
        ("prefill_tokens_per_s", "prefill (tokens/s)"),
        ("decode_ms_per_token", "decode (ms/token)"),
    ]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    series = sorted({(r["target"], r["quantize"]) for r in rows if "error" not in r})
    for axis, (key, label) in zip(axes.flat, keys, strict=True):
        for target, quantize in series:
            points = sorted(
                (r["parameters"], r[key])
                for r in rows
                if "error" not in r and (r["target"], r["quantize"]) == (target, quantize)
            )
            axis.plot(*zip(*points, strict=True), marker="o", label=f"{target} {quantize}")
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("parameters")
        axis.set_title(label)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.scale",
        description="Compile time, compile and run memory, artifact size, prefill and decode "
        "speed against model size (Mamba-1 130m to 2.8b, random weights).",
    )
    parser.add_argument("--sizes", default=",".join(DEFAULT_SIZES), help=f"of {', '.join(SIZES)}")
    parser.add_argument("--targets", default="onnx,torch", help="comma list (onnx,torch)")
    parser.add_argument("--quantize", default="none", help="comma list of schemes (none,bf16)")
    parser.add_argument("--prompt", type=int, default=512, help="prompt tokens (prefill speed)")
    parser.add_argument("--new-tokens", type=int, default=16, help="generated tokens (decode)")
    parser.add_argument("--out", default="bench-scale", help="folder for scale.json, scale.png")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per phase")
    parser.add_argument("--phase", nargs="+", help=argparse.SUPPRESS)  # internal: one phase
    return parser.parse_args(argv)


def _one_phase(args: list[str]) -> int:
    kind, *rest = args
    if kind == "prepare":
        row = _phase_prepare(*rest)
    elif kind == "compile":
        row = _phase_compile(*rest)
    else:
        row = _phase_run(rest[0], int(rest[1]), int(rest[2]))
    print("SCALE_ROW " + json.dumps(row), flush=True)
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.phase:
        return _one_phase(args.phase)
    from benchmarks.machine import cpu_model_name

    os.makedirs(args.out, exist_ok=True)
    rows = []
    for size in args.sizes.split(","):
        if size not in SIZES:
            raise SystemExit(f"unknown size {size!r}; known: {', '.join(SIZES)}")
        folder = model_folder(size)
        if not os.path.isdir(folder):
            _progress(f"building and saving {os.path.basename(folder)} in {folder} (once)")
            info = _run_phase(["prepare", size, folder], args.timeout)
            if "error" in info:
                rows.append({"size": size, "target": "-", "quantize": "-", **info})
                continue
        for target in args.targets.split(","):
            for quantize in args.quantize.split(","):
                row = {"size": size, "target": target, "quantize": quantize}
                label = os.path.basename(folder)
                artifact = os.path.join(args.out, f"{label}.{target}.{quantize}")
                subprocess.run(["rm", "-rf", artifact], check=True)
                _progress(f"{label} {target} {quantize}: compiling")
                row.update(
                    _run_phase(["compile", folder, target, quantize, artifact], args.timeout)
                )
                if "error" not in row:
                    _progress(f"{label} {target} {quantize}: running")
                    row.update(
                        _run_phase(
                            ["run", artifact, str(args.prompt), str(args.new_tokens)],
                            args.timeout,
                        )
                    )
                subprocess.run(["rm", "-rf", artifact], check=True)
                if "error" not in row:
                    stored, artifact_bytes = row["checkpoint_weight_bytes"], row["artifact_bytes"]
                    row["compile_x_weights"] = row["compile_net_peak_bytes"] / stored
                    row["compile_x_artifact"] = row["compile_net_peak_bytes"] / artifact_bytes
                    row["run_x_weights"] = row["run_net_peak_bytes"] / artifact_bytes
                rows.append(row)
                print(_table([row]).splitlines()[-1], flush=True)
    exponents = {
        f"{t}/{q}": _fit_exponent(
            [r for r in rows if (r["target"], r["quantize"]) == (t, q)], "compile_s"
        )
        for t in args.targets.split(",")
        for q in args.quantize.split(",")
    }
    result = {
        "cpu": cpu_model_name(),
        "threads": _threads(),
        "rows": rows,
        "compile_time_exponent": exponents,
    }
    with open(os.path.join(args.out, "scale.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(_table(rows))
    print(f"compile time ~ parameters^k: {exponents}  (CPU: {result['cpu']})")
    if any("error" not in r for r in rows):
        _plot(rows, os.path.join(args.out, "scale.png"))
    return 0


def _threads() -> int:
    import torch

    return torch.get_num_threads()


if __name__ == "__main__":
    sys.exit(main())
