"""Decode speed of ssmcc's targets and llama.cpp measured in interleaved rounds.

    python -m benchmarks.interleaved_decode                   # mamba-130m, 5 rounds, 2 threads
    python -m benchmarks.interleaved_decode --model mamba2-130m --rounds 7 --quantize none,int8
    python -m benchmarks.interleaved_decode --targets onnx,openvino --quantize none,int8

These machines' memory bandwidth moves by 1.5x within minutes (the harness's probe has read 27
and 49 GB/s in one sitting), and ``benchmarks.run`` measures one contender after another, so a
decode ratio between two contenders can be off by that much. Here every round runs every
contender once, back to back (llama.cpp's ``llama-bench -r 1`` for F32 / F16 / Q8_0; ssmcc's step
loop on each target and ``quantize=``), and the report gives per contender the median over
rounds and, per round, the ratio to llama.cpp at the matching precision measured seconds
apart: float32 -> F32, bf16 / fp16 -> F16, int8 -> Q8_0. Ratios are the figures to quote.

ssmcc decode time per token: between the first and the last of N new tokens of
``generate(prompt, N)``, read by a streamer clock (``stats.TokenClock``, as the harness's decode
suite does), so the prompt's time, which at a long prompt varies by more than the whole decode,
is never subtracted; llama.cpp: ``llama-bench -p 0 -n N -d P``.
Writes ``decode_interleaved.json`` to ``--out`` (default ``benchmarks/results/<time>/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import torch

from benchmarks.report import write_json
from benchmarks.stats import TokenClock

LLAMA_FOR = {"none": "f32", "bf16": "f16", "fp16": "f16", "int8": "q8_0"}


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.interleaved_decode")
    parser.add_argument("--model", default="mamba-130m", help="ssmcc preset (random weights)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt-length", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument(
        "--targets",
        default="onnx,torch",
        help="comma list of onnx, torch, openvino (the onnx target's inline artifact in OpenVINO)",
    )
    parser.add_argument(
        "--quantize", default="none,int8,fp16", help="comma list of quantize= values"
    )
    parser.add_argument("--out", help="output folder (default benchmarks/results/<time>)")
    return parser.parse_args(argv)


def _progress(message: str) -> None:
    print(f"[decode] {message}", file=sys.stderr, flush=True)


def _ssmcc_contenders(model, targets, schemes, threads):
    import ssmcc

    contenders = {}
    for target in targets:
        for scheme in schemes:
            name = f"ssmcc-{target}" + ("" if scheme == "none" else f"-{scheme}")
            _progress(f"compiling {name}")
            if target == "openvino":
                from benchmarks.openvino_decode import OpenVinoDecoder

                contenders[name] = (OpenVinoDecoder(model, scheme, threads), scheme)
                continue
            options = {"threads": threads} if target == "onnx" else {}
            compiled = ssmcc.compile(model, target=target, quantize=scheme, **options)
            contenders[name] = (compiled, scheme)
    return contenders


def _ssmcc_ms_per_token(compiled, prompt, new_tokens) -> float:
    compiled.generate(prompt, 2)  # warm (sessions, kernels)
    clock = TokenClock()
    compiled.generate(prompt, new_tokens, streamer=clock)
    return clock.seconds_per_token(new_tokens) * 1e3


def main(argv=None) -> int:
    from benchmarks import llama_cpp
    from benchmarks.machine import cpu_model_name
    from ssmcc.presets import build_preset

    args = _parse(argv)
    torch.set_num_threads(args.threads)
    model = build_preset(args.model, seed=0)
    schemes = args.quantize.split(",")
    contenders = _ssmcc_contenders(model, args.targets.split(","), schemes, args.threads)
    gguf = {}
    try:
        for outtype in sorted({LLAMA_FOR[s] for s in schemes}):
            _progress(f"converting to GGUF {outtype}")
            gguf[outtype] = llama_cpp.convert(model, outtype)[0]
    except llama_cpp.LlamaCppMissing as missing:
        _progress(f"llama.cpp skipped: {missing}")
    prompt = torch.randint(0, model.config.vocab_size, (1, args.prompt_length))
    rounds = []
    for index in range(args.rounds):
        measured = {}
        for outtype, path in gguf.items():
            entry = llama_cpp.bench(path, args.threads, 0, args.new_tokens, 1, args.prompt_length)
            measured[f"llama-cpp-{outtype}"] = 1e3 / entry["avg_ts"]
        for name, (compiled, _) in contenders.items():
            measured[name] = _ssmcc_ms_per_token(compiled, prompt, args.new_tokens)
        rounds.append(measured)
        _progress(
            f"round {index + 1}/{args.rounds}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in measured.items())
        )
    summary = {}
    for name in rounds[0]:
        row = {"ms_per_token": statistics.median(r[name] for r in rounds)}
        scheme = contenders[name][1] if name in contenders else None
        peer = f"llama-cpp-{LLAMA_FOR[scheme]}" if scheme else None
        if peer in rounds[0]:
            ratios = [r[name] / r[peer] for r in rounds]
            row.update(peer=peer, x_peer_time=statistics.median(ratios), ratios=ratios)
        summary[name] = row
    result = {
        "model": args.model,
        "cpu": cpu_model_name(),
        "threads": args.threads,
        "prompt_length": args.prompt_length,
        "new_tokens": args.new_tokens,
        "rounds": rounds,
        "summary": summary,
    }
    write_json(result, args.out, "decode_interleaved.json")
    print(f"{args.model}, {args.threads} threads, {result['cpu']}, median of {args.rounds} rounds")
    for name, row in summary.items():
        ratio = ""
        if "peer" in row:
            ratio = f"  {row['x_peer_time']:.2f}x the time of {row['peer']} (same round)"
        print(f"  {name:22s} {row['ms_per_token']:6.2f} ms/token{ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
