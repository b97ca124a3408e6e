"""Lowering: from the ssmcc IR to a backend, through one table of emitters per backend."""

from ssmcc.errors import LoweringError
from ssmcc.lowering.onnx import lower_to_onnx
from ssmcc.lowering.table import PLANNED_BACKENDS, TABLES, coverage
from ssmcc.lowering.torch import lower_to_torch

# target -> lowering function: torch gives an nn.Module, onnx an onnx.ModelProto.
TARGETS = {"torch": lower_to_torch, "onnx": lower_to_onnx}


def lower(program, target: str, **options):
    """Lower ``program`` to ``target``; unknown or unbuilt targets raise ``LoweringError``."""
    if target in TARGETS:
        return TARGETS[target](program, **options)
    if target in PLANNED_BACKENDS:
        raise LoweringError(
            f"target {target!r} is not available in this version: {PLANNED_BACKENDS[target]}. "
            f"Available targets: {', '.join(TARGETS)}"
        )
    raise LoweringError(
        f"unknown target {target!r}; available: {', '.join(TARGETS)} "
        f"(planned: {', '.join(PLANNED_BACKENDS)})"
    )


__all__ = ["PLANNED_BACKENDS", "TABLES", "TARGETS", "coverage", "lower"]
