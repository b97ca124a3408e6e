"""What capture (and later the pass pipeline) found: a plain record, printable and JSON-able."""

from __future__ import annotations

import dataclasses
from collections import Counter

from torch.export import ExportedProgram

from ssmcc.ops import is_ssmcc_op


def ssmcc_op_counts(program: ExportedProgram) -> dict[str, int]:
    """Count of each ssmcc op (by short name) among the program's graph nodes."""
    counts: Counter = Counter(
        node.target._opname
        for node in program.graph.nodes
        if node.op == "call_function" and is_ssmcc_op(node.target)
    )
    return dict(sorted(counts.items()))


@dataclasses.dataclass
class CaptureReport:
    model: str
    routes: list[str]
    ssm_layers: list[str]
    dynamic_dims: dict[str, list[str]]
    node_count: int
    op_counts: dict[str, int]
    capture_seconds: float
    notes: list[str] = dataclasses.field(default_factory=list)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)
