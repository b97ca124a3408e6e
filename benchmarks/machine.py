"""The machine's own bounds, measured in the same run as the contenders.

- read bandwidth: ``torch.sum`` over a 1 GiB float32 array (bytes read / second), the same
  number of threads as the contenders;
- fp32 matmul throughput: 2048 x 2048 x 2048 products (2 n^3 FLOP / second) on oneDNN where
  torch has it (``matmul_GFLOPs``, what the matmuls-only contender uses) and on ``torch.mm``
  (MKL: ``matmul_GFLOPs_aten``; about half of oneDNN's on AMD processors).
Each is the median of several runs after a warm-up.
"""

from __future__ import annotations

import os
import platform

import torch

from benchmarks.stats import invert, summarize, time_calls
from ssmcc.lowering.torch.linear import onednn_available


def measure_machine(threads: int, repeats: int = 5) -> dict:
    torch.set_num_threads(threads)
    array = torch.ones(256 * 1024 * 1024)  # 1 GiB of float32, pages touched by the fill
    read = summarize(time_calls(array.sum, repeats))
    del array
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    mm = summarize(time_calls(lambda: torch.mm(a, b), repeats))
    fast = mm
    if onednn_available():
        weight = b.t().contiguous()
        fast = summarize(
            time_calls(
                lambda: torch.ops.mkldnn._linear_pointwise(a, weight, None, "none", [], ""),
                repeats,
            )
        )
    return {
        "threads": threads,
        "cpu": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "read_bandwidth_GBps": invert(read, 256 * 1024 * 1024 * 4 / 1e9),
        "matmul_GFLOPs": invert(fast, 2 * n**3 / 1e9),
        "matmul_GFLOPs_aten": invert(mm, 2 * n**3 / 1e9),
    }


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()
