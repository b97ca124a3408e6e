"""Lowering tables: one per backend, from each ssmcc op to the emitter that handles it.

``Emitter.emit`` is the backend's own hook (torch: ``emit(node, kernels)`` returns the callable the
node will call; onnx: a torch.onnx translation function emitting the ssmcc node); ``kernel`` names
the implementation for the coverage report. A backend that cannot handle an op says why in
``UNSUPPORTED[backend][op]``; ``coverage()`` lists every op x backend either way.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ssmcc.ops import SSMCC_OPS


@dataclasses.dataclass(frozen=True)
class Emitter:
    kernel: str
    emit: Callable


TABLES: dict[str, dict[str, Emitter]] = {}
UNSUPPORTED: dict[str, dict[str, str]] = {}

# Backends the design card names that this version does not build yet, with the reason.
PLANNED_BACKENDS: dict[str, str] = {
    "triton": "the Triton target is not built yet",
    "tensorrt": "the TensorRT target is not built yet (needs the ONNX target first)",
}


def register_table(backend: str, table: dict[str, Emitter]) -> None:
    TABLES[backend] = table


def coverage() -> list[dict[str, str]]:
    """One row per (op, backend): ``supported`` with the kernel, or ``unsupported`` with why."""
    rows = []
    backends = list(TABLES) + [b for b in PLANNED_BACKENDS if b not in TABLES]
    for op in SSMCC_OPS:
        for backend in backends:
            emitter = TABLES.get(backend, {}).get(op)
            if emitter is not None:
                rows.append(
                    {"op": op, "backend": backend, "status": "supported", "detail": emitter.kernel}
                )
                continue
            reason = UNSUPPORTED.get(backend, {}).get(op) or PLANNED_BACKENDS.get(
                backend, "no emitter registered"
            )
            rows.append({"op": op, "backend": backend, "status": "unsupported", "detail": reason})
    return rows
