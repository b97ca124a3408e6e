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


class TokenClock:
    """The time each new token of a generation is handed out: Hugging Face's streamer protocol
    (``put``; its first put is the prompt) and ssmcc's (a call per token column) alike."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, tokens) -> None:
        self.times.append(time.perf_counter())

    def put(self, value) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass

    def seconds_per_token(self, new_tokens: int) -> float:
        """Between the first and the last of the ``new_tokens`` new tokens, per token: decode
        alone, whatever the prompt's time (which, at a long prompt, varies by more than a whole
        decode takes)."""
        if new_tokens < 2 or len(self.times) < new_tokens:
            raise ValueError(f"need 2 or more timed tokens, got {len(self.times)} of {new_tokens}")
        times = self.times[-new_tokens:]
        return (times[-1] - times[0]) / (new_tokens - 1)
