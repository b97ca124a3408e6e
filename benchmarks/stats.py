"""Timing helpers: warm-up then repeats, summarised as min / median / max."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def summarize(values: list[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
    }


def time_calls(fn: Callable[[], object], repeats: int, warmup: int = 1) -> list[float]:
    """Seconds per call of ``fn``: ``warmup`` calls discarded, then ``repeats`` timed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return times


def invert(summary: dict[str, float], numerator: float) -> dict[str, float]:
    """``numerator / seconds`` (e.g. tokens/s): min and max swap places."""
    return {
        "min": numerator / summary["max"],
        "median": numerator / summary["median"],
        "max": numerator / summary["min"],
        "n": summary["n"],
    }
