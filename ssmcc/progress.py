"""Phase lines for long work (capture, passes, export, file writes, kernel builds).

Library code reports each phase with ``phase("...")`` on the ``ssmcc`` logger at INFO level, so a
Python caller sees nothing unless it enables logging (``logging.basicConfig(level="INFO")``);
the command line shows them on stderr as ``[ssmcc] ...`` lines (``show_phases``).
"""

from __future__ import annotations

import logging
import sys

LOGGER = logging.getLogger("ssmcc")


def phase(message: str) -> None:
    LOGGER.info(message)


class _StderrLines(logging.Handler):
    """``[ssmcc] message`` on whatever ``sys.stderr`` is when the line is written."""

    def emit(self, record: logging.LogRecord) -> None:
        print(f"[ssmcc] {record.getMessage()}", file=sys.stderr, flush=True)


def show_phases() -> None:
    """Print phase lines on stderr (installed once per process)."""
    if not any(isinstance(h, _StderrLines) for h in LOGGER.handlers):
        LOGGER.addHandler(_StderrLines())
    LOGGER.setLevel(logging.INFO)
    LOGGER.propagate = False
