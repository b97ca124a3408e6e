"""Suite ``torch-compile``: ``torch.compile(backend="ssmcc")`` against inductor and eager.

Each contender runs in a fresh process with an empty inductor cache (cold), on one preset
(random weights, fp32), batch 1:

    eager           the Hugging Face model as it is
    inductor        ``torch.compile(model)`` (HF's own code: Mamba-1's associative scan unrolled)
    ssmcc           ``torch.compile(model, backend="ssmcc", dynamic=True)`` with
                    ``ssmcc.enable_routes(model)``, as the README shows it
    ssmcc-target    ``ssmcc.compile(model, target="torch")``, for reference

    cold_s          the first call at the first length, compile included (ssmcc-target: compile
                    + first call)
    first_<L>_s     the first call at each later length (a recompile where there is one)
    tok_s_<L>       prefill tokens per second at length L: the prompt's full logits, the median
                    of ``--repeats`` calls after the first

    python -m benchmarks.torch_compile --model mamba-130m --lengths 512,2048 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

CONTENDERS = ("eager", "inductor", "ssmcc", "ssmcc-target")


def _prepare(contender: str, model):
    import torch

    if contender == "eager":
        return lambda ids: model(input_ids=ids, use_cache=False).logits
    if contender == "inductor":
        compiled = torch.compile(model)
        return lambda ids: compiled(input_ids=ids, use_cache=False).logits
    if contender == "ssmcc":
        import ssmcc

        ssmcc.enable_routes(model)  # for the life of this process (until disable())
        compiled = torch.compile(model, backend="ssmcc", dynamic=True)
        return lambda ids: compiled(input_ids=ids, use_cache=False).logits
    import ssmcc

    program = ssmcc.compile(model, target="torch")
    return lambda ids: program(ids)


def measure(contender: str, preset: str, lengths: list[int], repeats: int) -> dict:
    """One contender in this process (meant to be a fresh one)."""
    import torch

    from ssmcc.presets import build_preset

    model = build_preset(preset).eval()
    vocab = model.config.vocab_size
    row: dict = {"contender": contender, "model": preset, "threads": torch.get_num_threads()}
    started = time.perf_counter()
    with torch.inference_mode():
        run = _prepare(contender, model)
        for index, length in enumerate(lengths):
            ids = torch.randint(0, vocab, (1, length), generator=torch.Generator().manual_seed(0))
            first = time.perf_counter()
            run(ids)
            if index == 0:
                row["cold_s"] = time.perf_counter() - started
            else:
                row[f"first_{length}_s"] = time.perf_counter() - first
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                run(ids)
                times.append(time.perf_counter() - t)
            row[f"tok_s_{length}"] = length / statistics.median(times)
    return row


def _run_fresh(contender, args) -> dict:
    with tempfile.TemporaryDirectory(prefix="ssmcc-inductor-cache-") as cache:
        env = {
            **os.environ,
            "TORCHINDUCTOR_CACHE_DIR": cache,
            "OMP_NUM_THREADS": str(args.threads),
            "PYTHONWARNINGS": "ignore",
        }
        command = [sys.executable, "-m", "benchmarks.torch_compile", "--worker", contender]
        command += ["--model", args.model, "--lengths", args.lengths]
        command += ["--repeats", str(args.repeats), "--threads", str(args.threads)]
        result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        return {"contender": contender, "error": result.stderr.strip().splitlines()[-1:]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mamba-130m", help="preset (default mamba-130m)")
    parser.add_argument("--lengths", default="512,2048", help="prompt lengths, comma list")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="torch_compile.json", help="JSON file to write")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.worker:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.worker, args.model, lengths, args.repeats)))
        return 0
    from benchmarks.machine import cpu_model_name

    rows = []
    for contender in args.contenders.split(","):
        if contender not in CONTENDERS:
            parser.error(f"unknown contender {contender!r}; known: {', '.join(CONTENDERS)}")
        print(f"[torch-compile] {contender} ({args.model}, fresh process)...", flush=True)
        rows.append(_run_fresh(contender, args))
        print("  " + json.dumps(rows[-1]), flush=True)
    by_name = {r["contender"]: r for r in rows}
    inductor = by_name.get("inductor", {})
    for row in rows:
        for length in lengths:
            key = f"tok_s_{length}"
            if key in row and key in inductor:
                row[f"vs_inductor_{length}"] = row[key] / inductor[key]
        if "cold_s" in row and "cold_s" in inductor:
            row["cold_vs_inductor"] = row["cold_s"] / inductor["cold_s"]
    report = {"cpu": cpu_model_name(), "threads": args.threads, "model": args.model, "rows": rows}
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\n{report['cpu']}, {args.threads} threads, {args.model}, fp32, batch 1")
    header = ["contender", "cold_s"] + [f"tok_s_{n}" for n in lengths]
    print(" | ".join(f"{h:>14s}" for h in header + ["cold/inductor"]))
    for row in rows:
        cells = [row["contender"], *(row.get(h) for h in header[1:]), row.get("cold_vs_inductor")]
        print(" | ".join(f"{c:>14.2f}" if isinstance(c, float) else f"{c!s:>14s}" for c in cells))
    return 0


if __name__ == "__main__":
    sys.exit(main())
