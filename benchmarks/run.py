"""Benchmark ssmcc against Hugging Face eager, torch.compile and torch.onnx, in one run.

    python -m benchmarks.run                      # every suite, mamba-130m shape, 2 threads
    python -m benchmarks.run --small              # quick: tiny model, short lengths
    python -m benchmarks.run --suite prefill --contenders hf-eager,ssmcc-torch

Each (suite, contender) runs in its own process under a time limit; a contender that fails, hangs
or runs out of memory becomes a row with the error's first line. The machine's bounds (read
bandwidth, matmul throughput) are measured in the same run. Output: a table on stdout,
``results.json`` and PNG plots in ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import time

from benchmarks.contenders import CONTENDERS, DEBUG_CONTENDERS
from benchmarks.machine import cpu_model_name, measure_machine
from benchmarks.model_bounds import model_bounds
from benchmarks.report import annotate, format_table, write_plots

SUITES = ("prefill", "decode", "memory", "export", "long-prefill", "prefix-cache")
FULL = dict(
    model="mamba-130m",
    lengths=[512, 2048],
    memory_lengths=[2048, 8192],
    long_lengths=[2048, 32768],
    long_repeats=1,
    prefix_prompt_length=2048,
    prefix_cached_length=1920,
    prompt_length=64,
    new_tokens=64,
    repeats=3,
    timeout=900,
)
SMALL = dict(
    model="mamba-tiny",
    lengths=[64, 256],
    memory_lengths=[256, 1024],
    long_lengths=[256, 4096],
    long_repeats=2,
    prefix_prompt_length=512,
    prefix_cached_length=384,
    prompt_length=16,
    new_tokens=16,
    repeats=3,
    timeout=300,
)


def _progress(message: str) -> None:
    print(f"[bench] {message}", file=sys.stderr, flush=True)


def _int_list(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.run",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--suite", default="all", help=f"comma list of {', '.join(SUITES)}, or all (default)"
    )
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma list (default all): {', '.join(CONTENDERS)}; harness "
        f"self-test: {', '.join(DEBUG_CONTENDERS)}",
    )
    parser.add_argument("--small", action="store_true", help="tiny model, short lengths")
    parser.add_argument("--model", help="ssmcc preset (default mamba-130m; --small: mamba-tiny)")
    parser.add_argument("--lengths", type=_int_list, help="prefill lengths, e.g. 512,2048")
    parser.add_argument("--memory-lengths", type=_int_list, help="memory suite lengths")
    parser.add_argument(
        "--long-lengths",
        type=_int_list,
        help="long-prefill lengths, one process each (default 2048,32768; small 256,4096)",
    )
    parser.add_argument(
        "--long-repeats", type=int, help="timed chunked prefills per long length (default 1)"
    )
    parser.add_argument(
        "--prefix-prompt-length", type=int, help="prefix-cache prompt length (default 2048)"
    )
    parser.add_argument(
        "--prefix-cached-length",
        type=int,
        help="of which an earlier prompt shared this many tokens (default 1920)",
    )
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--prompt-length", type=int)
    parser.add_argument("--new-tokens", type=int)
    parser.add_argument(
        "--export-length", type=int, default=16, help="length torch.onnx exports at (default 16)"
    )
    parser.add_argument("--repeats", type=int, help="timed runs after one warm-up (default 3)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--timeout",
        type=float,
        help="seconds per (suite, contender) process (default 900; small 300)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="output folder (default benchmarks/results/<time>)")
    args = parser.parse_args(argv)
    defaults = SMALL if args.small else FULL
    for name, value in defaults.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    args.suites = list(SUITES) if args.suite == "all" else args.suite.split(",")
    unknown = [s for s in args.suites if s not in SUITES]
    known = {**CONTENDERS, **DEBUG_CONTENDERS}
    args.contender_list = args.contenders.split(",")
    unknown += [c for c in args.contender_list if c not in known]
    if unknown:
        parser.error(f"unknown suite or contender: {', '.join(unknown)}")
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2 (time per token excludes the first token)")
    return args


def _error_row(spec: dict, error: str) -> dict:
    row = {"suite": spec["suite"], "contender": spec["contender"], "error": error[:300]}
    if spec["suite"] == "memory":
        row["length"] = spec["lengths"][0]
    return row


def _streamed_rows(stdout: str) -> list[dict]:
    prefix = "BENCH_ROW "
    return [
        json.loads(line[len(prefix) :]) for line in stdout.splitlines() if line.startswith(prefix)
    ]


def run_worker(spec: dict, timeout: float) -> tuple[list[dict], float]:
    """Run one worker process; never raises: failures come back as error rows. Rows the worker
    finished before failing or timing out are kept."""
    command = [sys.executable, "-m", "benchmarks.worker", json.dumps(spec)]
    started = time.perf_counter()
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # also ends compile workers it started
        stdout, _ = process.communicate()
        rows = _streamed_rows(stdout)
        done = f" (after {len(rows)} finished row(s))" if rows else ""
        return rows + [_error_row(spec, f"timeout after {timeout:.0f}s{done}")], timeout
    rows = _streamed_rows(stdout)
    elapsed = time.perf_counter() - started
    if "BENCH_DONE" in stdout:
        return rows, elapsed
    lines = [ln for ln in stderr.strip().splitlines() if ln.strip()]
    cause = lines[-1] if lines else f"exit code {process.returncode}"
    if process.returncode in (-signal.SIGKILL, 137):
        cause = f"killed (exit {process.returncode}, out of memory?)"
    return rows + [_error_row(spec, cause)], elapsed


def main(argv=None) -> int:
    args = parse_args(argv)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", stamp)
    os.makedirs(out, exist_ok=True)

    _progress(f"measuring the machine ({args.threads} threads)")
    machine = measure_machine(args.threads)
    machine["cpu"] = cpu_model_name()
    from ssmcc.presets import build_preset

    model = build_preset(args.model, seed=args.seed)
    bounds = model_bounds(model, machine)
    del model

    rows = []
    # prefill workers also report the export figures of their own preparation
    fold_export = "prefill" in args.suites and "export" in args.suites
    for suite in args.suites:
        if suite == "export" and fold_export:
            continue
        for contender in args.contender_list:
            lengths_sets = (
                [[n] for n in args.memory_lengths]
                if suite == "memory"
                else [[n] for n in args.long_lengths]
                if suite == "long-prefill"
                else [args.lengths]
            )
            for lengths in lengths_sets:
                spec = dict(
                    suite=suite,
                    contender=contender,
                    model=args.model,
                    lengths=lengths,
                    batch=args.batch,
                    repeats=args.repeats,
                    threads=args.threads,
                    prompt_length=args.prompt_length,
                    new_tokens=args.new_tokens,
                    export_length=args.export_length,
                    long_repeats=args.long_repeats,
                    prefix_prompt_length=args.prefix_prompt_length,
                    prefix_cached_length=args.prefix_cached_length,
                    seed=args.seed,
                    with_export=fold_export and suite == "prefill",
                )
                _progress(f"{suite}: {contender} {lengths if suite != 'export' else ''}")
                worker_rows, seconds = run_worker(spec, args.timeout)
                _progress(f"  done in {seconds:.0f}s")
                rows.extend(worker_rows)

    annotate(rows, bounds)
    result = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "model": args.model,
        "settings": {
            k: getattr(args, k)
            for k in (
                "batch",
                "threads",
                "repeats",
                "lengths",
                "memory_lengths",
                "prompt_length",
                "new_tokens",
                "export_length",
                "long_lengths",
                "long_repeats",
                "prefix_prompt_length",
                "prefix_cached_length",
                "timeout",
            )
        },
        "machine": machine,
        "bounds": bounds,
        "rows": rows,
    }
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(result, f, indent=2)
    print(format_table(result))
    plots = write_plots(result, out)
    _progress(f"wrote {os.path.join(out, 'results.json')} and {len(plots)} plot(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
