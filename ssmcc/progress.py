"""Phase lines for long work (capture, passes, export, file writes, kernel builds).

Library code reports each phase with ``phase("...")`` on the ``ssmcc`` logger at INFO level, so a
Python caller sees nothing unless it enables logging (``logging.basicConfig(level="INFO")``);
the command line shows them on stderr as ``[ssmcc] ...`` lines (``show_phases``); with
``timed=True`` (``ssmcc -v``) each line also says the seconds since the first line and the
process's resident memory now and at its peak, so the phase that holds the memory is visible.
"""

from __future__ import annotations

import logging
import sys
import time

LOGGER = logging.getLogger("ssmcc")


def phase(message: str) -> None:
    LOGGER.info(message)


def resident_memory() -> tuple[float, float]:
    """(now, peak) resident set size of this process in bytes (Linux ``/proc``; zeros where
    the process has no such file)."""
    found = {}
    try:
        with open("/proc/self/status") as status:
            for line in status:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "VmHWM"):
                    found[key] = float(value.split()[0]) * 1024
    except OSError:
        pass
    return found.get("VmRSS", 0.0), found.get("VmHWM", 0.0)


class _StderrLines(logging.Handler):
    """``[ssmcc] message`` on whatever ``sys.stderr`` is when the line is written; when timed,
    ``[ssmcc] 12.3s rss 1.24 GB (peak 2.01 GB) message``."""

    def __init__(self):
        super().__init__()
        self.timed = False
        self.start = None

    def emit(self, record: logging.LogRecord) -> None:
        prefix = ""
        if self.timed:
            self.start = self.start or time.perf_counter()
            now, peak = resident_memory()
            seconds = time.perf_counter() - self.start
            prefix = f"{seconds:6.1f}s rss {now / 1e9:.2f} GB (peak {peak / 1e9:.2f} GB) "
        print(f"[ssmcc] {prefix}{record.getMessage()}", file=sys.stderr, flush=True)


def show_phases(timed: bool = False) -> None:
    """Print phase lines on stderr (installed once per process), with time and memory when
    ``timed``."""
    handler = next((h for h in LOGGER.handlers if isinstance(h, _StderrLines)), None)
    if handler is None:
        handler = _StderrLines()
        LOGGER.addHandler(handler)
    handler.timed = timed
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
