"""The serving suite: throughput of a model served by Triton Inference Server, concurrent sequences
against the same sequences served one at a time.

    python -m benchmarks.serving                              # mamba-130m, 16 sequences, onnx
    python -m benchmarks.serving --model mamba-tiny --sequences 4 --new-tokens 8

The artifact (random weights) is exported with ``ssmcc export-serving`` (Python backend,
``max_batch_size`` = the sequence count) and served by the ``tritonserver`` of nvidia-pytriton on
this machine. Each sequence streams ``--new-tokens`` greedy tokens after its own prompt through
``ssmcc.serving.Client`` (one client per thread, gRPC by default). One-at-a-time: the sequences
one after the other. Concurrent: all at once, so the server batches their steps. Throughput =
generated tokens / wall time; the tokens of every sequence must be the same both ways. Writes
``serving.json`` to ``--out`` (default ``benchmarks/results/<time>/``).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import sys
import tempfile
import time

import torch

from benchmarks.report import write_json


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.serving")
    parser.add_argument("--model", default="mamba-130m", help="ssmcc preset (random weights)")
    parser.add_argument("--target", default="onnx", choices=["onnx", "torch"])
    parser.add_argument("--sequences", type=int, default=16)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2, help="the model's intra-op threads")
    parser.add_argument("--protocol", default="grpc", choices=["grpc", "http"])
    parser.add_argument(
        "--batch-delay-ms", type=float, default=1.0, help="export-serving's --batch-delay"
    )
    parser.add_argument("--out", help="output folder (default benchmarks/results/<time>)")
    return parser.parse_args(argv)


def _progress(message: str) -> None:
    print(f"[serving] {message}", file=sys.stderr, flush=True)


def main(argv=None) -> int:
    args = _parse(argv)
    import ssmcc
    from benchmarks.machine import cpu_model_name
    from ssmcc.presets import build_preset
    from ssmcc.serving import Client, TritonServer, export_triton

    folder = tempfile.mkdtemp(prefix="ssmcc-bench-serving-")
    _progress(f"compiling {args.model} for the {args.target} target")
    model = build_preset(args.model).eval()
    compiled = ssmcc.compile(model, target=args.target)
    compiled.save(os.path.join(folder, "artifact"))
    repo = export_triton(
        os.path.join(folder, "artifact"),
        os.path.join(folder, "repo"),
        name="model",
        max_batch_size=args.sequences,
        batch_delay_ms=args.batch_delay_ms,
        threads=args.threads,
    )
    generator = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(0, min(1000, compiled.vocab_size), (args.prompt_length,), generator=generator)
        for _ in range(args.sequences)
    ]

    def run(index: int) -> list[int]:
        url = server.grpc_url if args.protocol == "grpc" else server.url
        client = Client(url, "model", protocol=args.protocol)
        return client.generate(prompts[index], args.new_tokens, sequence_id=index + 1)

    tokens = args.sequences * args.new_tokens
    with TritonServer(repo) as server:
        run(0)  # warm: sessions open, kernels built
        _progress(f"{args.sequences} sequences one at a time")
        started = time.perf_counter()
        alone = [run(i) for i in range(args.sequences)]
        alone_s = time.perf_counter() - started
        _progress(f"{args.sequences} sequences at once")
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.sequences) as pool:
            together = list(pool.map(run, range(args.sequences)))
        together_s = time.perf_counter() - started
        stats = Client(server.url, "model").client.get_inference_statistics("model")
    counts = stats["model_stats"][0]
    result = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpu": cpu_model_name(),
        "settings": vars(args),
        "one_at_a_time": {"seconds": alone_s, "tokens_per_s": tokens / alone_s},
        "concurrent": {"seconds": together_s, "tokens_per_s": tokens / together_s},
        "speedup": alone_s / together_s,
        "same_tokens": alone == together,
        "server_inferences": int(counts["inference_count"]),
        "server_executions": int(counts["execution_count"]),
    }
    write_json(result, args.out, "serving.json")
    print(
        f"{args.model} ({args.target} target), {args.sequences} sequences x "
        f"{args.new_tokens} tokens after {args.prompt_length}-token prompts, {result['cpu']}"
    )
    print(f"one at a time  {alone_s:7.2f} s  {tokens / alone_s:7.1f} tok/s")
    print(
        f"concurrent     {together_s:7.2f} s  {tokens / together_s:7.1f} tok/s  "
        f"{result['speedup']:.2f}x"
    )
    print(
        f"tokens identical: {result['same_tokens']}; server: {result['server_inferences']} "
        f"inferences in {result['server_executions']} executions"
    )
    return 0 if result["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
