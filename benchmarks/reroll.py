"""What ``detect_selective_scan`` buys for a program that capture did not route.

    python -m benchmarks.reroll                 # mamba-130m shape, T=64, 2 threads
    python -m benchmarks.reroll --small         # mamba-tiny, quick

For Hugging Face Mamba exported with routing off (its own Python loop, unrolled at T tokens) and
for the hand-written stacks of ``benchmarks/handwritten_mamba.py`` (loop, torch ``scan`` op,
mamba.py ``pscan``), one row each: graph nodes as exported and after the passes, the time of the
passes, and forward latency of the exported program as it is (``program.module()``), of the
rewritten program on ssmcc's torch target, and of the eager model, all measured in this run.
Output: a table on stdout and ``reroll.json`` in ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch


def _time_ms(fn, repeats: int) -> float:
    with torch.inference_mode():
        fn()
        samples = []
        for _ in range(repeats):
            started = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - started) * 1e3)
    return statistics.median(samples)


def _models(small: bool):
    from benchmarks.handwritten_mamba import build
    from ssmcc.frontend.export import CausalLMLogits
    from ssmcc.presets import load_model

    hf = load_model("mamba-tiny" if small else "mamba-130m")
    yield "hf-mamba (own loop)", CausalLMLogits(hf).eval(), hf.config.vocab_size
    sizes = (
        dict(d_model=64, layers=2, d_state=16) if small else dict(d_model=768, layers=4, d_state=16)
    )
    for form in ("loop", "scan_op", "pscan"):
        yield f"hand-written {form}", build(form, vocab=512, **sizes), 512


def measure(name, model, vocab, length, repeats) -> dict:
    import ssmcc
    from ssmcc.passes import PassContext, pipeline, run_passes

    ids = torch.randint(0, vocab, (1, length))
    started = time.perf_counter()
    program = torch.export.export(model, (ids,), strict=False)
    export_s = time.perf_counter() - started
    started = time.perf_counter()
    rewritten, report = run_passes(program, pipeline("default"), PassContext())
    passes_s = time.perf_counter() - started
    compiled = ssmcc.compile(rewritten, "torch")
    exported = program.module()
    prefix = "detect_selective_scan."
    hits = {k[len(prefix) :]: v for k, v in report.rule_hits.items() if k.startswith(prefix)}
    return {
        "model": name,
        "length": length,
        "nodes_exported": len(program.graph.nodes),
        "nodes_after": len(rewritten.graph.nodes),
        "scans": sum(v for k, v in hits.items() if not k.startswith(("fold", "functionalize"))),
        "export_s": round(export_s, 2),
        "passes_s": round(passes_s, 2),
        "exported_ms": round(_time_ms(lambda: exported(ids), repeats), 2),
        "ssmcc_torch_ms": round(_time_ms(lambda: compiled(ids), repeats), 2),
        "eager_ms": round(_time_ms(lambda: model(ids), repeats), 2),
    }


def format_rows(rows: list[dict]) -> str:
    header = (
        f"{'model':24} {'T':>4} {'nodes':>13} {'ratio':>6} {'scans':>5} {'passes s':>8} "
        f"{'exported ms':>11} {'ssmcc ms':>9} {'eager ms':>9} {'vs exported':>11}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        lines.append(
            f"{r['model']:24} {r['length']:>4} "
            f"{r['nodes_exported']:>6}->{r['nodes_after']:<5} "
            f"{r['nodes_exported'] / r['nodes_after']:>5.1f}x {r['scans']:>5} {r['passes_s']:>8} "
            f"{r['exported_ms']:>11} {r['ssmcc_torch_ms']:>9} {r['eager_ms']:>9} "
            f"{r['exported_ms'] / r['ssmcc_torch_ms']:>10.2f}x"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.reroll", description=__doc__)
    parser.add_argument("--small", action="store_true", help="tiny models (seconds)")
    parser.add_argument("--length", type=int, default=64, help="tokens (default 64)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per number")
    parser.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    parser.add_argument("--out", default="benchmarks/results", help="folder for reroll.json")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    for name, model, vocab in _models(args.small):
        print(f"[bench] {name}", file=sys.stderr, flush=True)
        rows.append(measure(name, model, vocab, args.length, args.repeats))
    print(format_rows(rows))
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "reroll.json")
    with open(path, "w") as f:
        json.dump({"threads": args.threads, "rows": rows}, f, indent=2)
    print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
