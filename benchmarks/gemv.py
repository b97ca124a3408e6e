"""How close the ssmcc library's float32 decode product (the ONNX ``ssmcc.Linear`` node) comes to
the machine's plain read rate, on the weight shapes of a real model.

    python -m benchmarks.gemv                                    # granite-hybrid-200m, rows 1,4,16
    python -m benchmarks.gemv --model mamba2-130m --rows 1 --rounds 8

One ONNX graph holds one ``Linear`` node per ``nn.Linear`` weight of the preset (random weights),
all reading the same x rows, so a run streams every weight once: bytes = the weights' bytes. Each
round times, back to back, the graph (ONNX Runtime with the ssmcc library) at every row count and
``torch.sum`` over a buffer of the same size (the read probe of ``benchmarks.machine``), with the
same threads. Read bandwidth on these machines moves by 1.5x within minutes, so the per-round
ratio to the probe is the figure to quote; at one row of x the product should read at the probe's
rate, at more rows it is bound by the FMA units instead (reported as GFLOP/s).
Writes ``gemv.json`` to ``--out`` (default ``benchmarks/results/<time>/``).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np
import torch

from benchmarks.report import write_json
from benchmarks.stats import summarize, time_calls


def _parse(argv):
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gemv")
    parser.add_argument("--model", default="granite-hybrid-200m", help="ssmcc preset")
    parser.add_argument("--rows", default="1,4,16", help="comma list of rows of x")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", help="output folder (default benchmarks/results/<time>)")
    return parser.parse_args(argv)


def linear_weights(model: torch.nn.Module) -> list[np.ndarray]:
    """Every distinct ``nn.Linear`` weight (a tied LM head once), as float32 arrays (N, K)."""
    seen, weights = set(), []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            weights.append(module.weight.detach().float().contiguous().numpy())
    return weights


def linear_graph(weights: list[np.ndarray]):
    """An ONNX model with one ``ssmcc.Linear`` node per weight; input ``x_K`` (rows, K) for each
    input width K."""
    from onnx import TensorProto, helper, numpy_helper

    from ssmcc.lowering.onnx.schemas import DOMAIN

    widths = sorted({w.shape[1] for w in weights})
    inputs = [
        helper.make_tensor_value_info(f"x_{k}", TensorProto.FLOAT, ["rows", k]) for k in widths
    ]
    nodes, outputs, initializers = [], [], []
    for i, w in enumerate(weights):
        initializers.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(
            helper.make_node("Linear", [f"x_{w.shape[1]}", f"w{i}"], [f"y{i}"], domain=DOMAIN)
        )
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, None))
    graph = helper.make_graph(nodes, "linears", inputs, outputs, initializers)
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(DOMAIN, 1)]
    ), widths


def main(argv=None) -> int:
    import onnxruntime as ort

    from benchmarks.machine import cpu_model_name
    from ssmcc.lowering.onnx.runtime import custom_op_library
    from ssmcc.presets import build_preset

    args = _parse(argv)
    torch.set_num_threads(args.threads)
    library = custom_op_library("auto")
    if library is None:
        print("the ssmcc ONNX Runtime library does not build here: nothing to measure")
        return 1
    weights = linear_weights(build_preset(args.model, seed=0))
    weight_bytes = sum(w.nbytes for w in weights)
    macs = sum(w.size for w in weights)
    model, widths = linear_graph(weights)
    del weights
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])
    del model
    probe = torch.ones(weight_bytes // 4)
    row_counts = [int(r) for r in args.rows.split(",")]
    rng = np.random.default_rng(0)
    feeds = {
        rows: {f"x_{k}": rng.standard_normal((rows, k)).astype(np.float32) for k in widths}
        for rows in row_counts
    }
    print(
        f"[gemv] {args.model}: {len(session.get_outputs())} weights, {weight_bytes / 1e6:.0f} MB",
        file=sys.stderr,
    )
    rounds = []
    for index in range(args.rounds):
        measured = {
            "probe_GBps": weight_bytes / summarize(time_calls(probe.sum, 5))["median"] / 1e9
        }
        for rows, feed in feeds.items():
            seconds = summarize(time_calls(lambda feed=feed: session.run(None, feed), 5))["median"]
            measured[f"rows_{rows}"] = {
                "ms": seconds * 1e3,
                "GBps": weight_bytes / seconds / 1e9,
                "GFLOPs": 2 * macs * rows / seconds / 1e9,
            }
        rounds.append(measured)
        print(
            f"[gemv] round {index + 1}/{args.rounds}: probe {measured['probe_GBps']:.1f} GB/s, "
            + ", ".join(f"{rows} rows {measured[f'rows_{rows}']['GBps']:.1f}" for rows in feeds),
            file=sys.stderr,
        )
    summary = {}
    for rows in row_counts:
        key = f"rows_{rows}"
        summary[key] = {
            "ms": statistics.median(r[key]["ms"] for r in rounds),
            "GBps": statistics.median(r[key]["GBps"] for r in rounds),
            "GFLOPs": statistics.median(r[key]["GFLOPs"] for r in rounds),
            "x_probe_rate": statistics.median(r[key]["GBps"] / r["probe_GBps"] for r in rounds),
        }
    result = {
        "model": args.model,
        "cpu": cpu_model_name(),
        "threads": args.threads,
        "weight_bytes": weight_bytes,
        "probe_GBps": statistics.median(r["probe_GBps"] for r in rounds),
        "summary": summary,
        "rounds": rounds,
    }
    write_json(result, args.out, "gemv.json")
    print(f"{args.model}, {args.threads} threads, {result['cpu']}, median of {args.rounds} rounds")
    print(f"  read probe (torch.sum)  {result['probe_GBps']:.1f} GB/s")
    for rows in row_counts:
        row = summary[f"rows_{rows}"]
        print(
            f"  Linear, {rows:2d} rows of x  {row['ms']:7.2f} ms  {row['GBps']:5.1f} GB/s "
            f"({row['x_probe_rate']:.2f}x the probe's rate)  {row['GFLOPs']:6.1f} GFLOP/s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
