"""Run an ordered list of passes over a program, or of graph rewrites over a bare FX graph.

The manager copies the program once (weights shared), runs each pass in order, optionally repeats
the list until no pass modifies the program, runs the verifier after each pass when asked, and
records per pass: whether it modified the program, its rule hits and its time. An exception inside a
pass is re-raised as ``PassError`` naming the pass and the passes that ran before it.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence

from torch.export import ExportedProgram
from torch.fx import GraphModule

from ssmcc.errors import PassError
from ssmcc.passes.pass_base import GraphRewrite, PassContext, PassFn
from ssmcc.passes.program import clone_program
from ssmcc.passes.verifier import verify_program


@dataclasses.dataclass
class PassRecord:
    name: str
    modified: bool
    stats: dict[str, int]
    seconds: float


@dataclasses.dataclass
class PipelineReport:
    records: list[PassRecord] = dataclasses.field(default_factory=list)

    @property
    def rule_hits(self) -> dict[str, int]:
        """Hits summed over the run, keyed ``pass.rule``."""
        total: Counter = Counter()
        for record in self.records:
            for rule, count in record.stats.items():
                total[f"{record.name}.{rule}"] += count
        return dict(sorted(total.items()))

    @property
    def passes_run(self) -> list[str]:
        return [record.name for record in self.records]


def run_passes(
    program: ExportedProgram,
    passes: Sequence[PassFn],
    ctx: PassContext | None = None,
    *,
    until_fixed_point: bool = False,
    max_rounds: int = 10,
) -> tuple[ExportedProgram, PipelineReport]:
    ctx = ctx or PassContext()
    report = PipelineReport()
    program = clone_program(program)
    for _ in range(max_rounds if until_fixed_point else 1):
        any_modified = False
        for pass_fn in passes:
            name = pass_fn.__name__
            started = time.perf_counter()
            try:
                result = pass_fn(program, ctx)
            except Exception as error:
                before = ", ".join(report.passes_run) or "none"
                raise PassError(
                    f"pass {name} failed (passes run before it: {before}): "
                    f"{type(error).__name__}: {error}"
                ) from error
            program = result.program
            any_modified |= result.modified
            report.records.append(
                PassRecord(
                    name,
                    result.modified,
                    dict(result.stats),
                    round(time.perf_counter() - started, 4),
                )
            )
            if ctx.verify:
                verify_program(program, after=f"pass {name}")
        if not any_modified:
            break
    return program, report


def rewrite_in_place(
    graph_module: GraphModule, rewrites: Sequence[GraphRewrite], ctx: PassContext
) -> dict[str, Counter]:
    """Each graph rewrite on ``graph_module`` in order, in place: its hits by rule, by rewrite
    name. An exception inside one is re-raised as ``PassError`` naming it and those before it."""
    hits: dict[str, Counter] = {}
    for rewrite in rewrites:
        name = rewrite.__name__
        try:
            hits[name] = Counter(rewrite(graph_module, ctx))
        except Exception as error:
            before = ", ".join(hits) or "none"
            raise PassError(
                f"graph rewrite {name} failed (rewrites run before it: {before}): "
                f"{type(error).__name__}: {error}"
            ) from error
    return hits
