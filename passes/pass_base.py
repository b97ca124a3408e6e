"""The pass contract.

A pass is a callable ``(program, ctx) -> PassResult``. It receives a program it may edit (the
manager hands each pipeline a copy), and returns the resulting program, whether anything changed,
and ``stats``: hits counted by rule name (what golden tests assert). A pass never imports a backend.

A graph rewrite is the rule set of a pass applied in place to a bare FX ``GraphModule`` (what
``torch.compile`` hands the Dynamo backend, which has no ExportedProgram):
``(graph_module, ctx) -> Counter`` of hits by rule (empty: the graph is as it was), its near misses
in ``ctx.diagnostics``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable

from torch.export import ExportedProgram
from torch.fx import GraphModule


@dataclasses.dataclass
class PassContext:
    """Options shared by the passes of one pipeline run.

    ``verify``: run the IR verifier after every pass (tests set it; compile does once at the end).
    ``pipeline``: the pipeline the user chose (``pipelines.PIPELINES``); the stateful programs
    derived from a compiled program are cleaned by the same one (``pipelines.derivation``).
    ``options``: per-pass options by pass name, e.g. ``{"some_pass": {"chunk_size": 256}}``;
    compile puts the target's gates here (``fuse_scan_norm_mlp``'s ``unsupported`` ops).
    ``diagnostics``: why a rule did not fire (rule name -> reasons), gathered for ``ssmcc inspect``.
    """

    verify: bool = False
    pipeline: str = "default"
    options: dict[str, dict] = dataclasses.field(default_factory=dict)
    diagnostics: dict[str, list[str]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class PassResult:
    program: ExportedProgram
    modified: bool
    stats: Counter = dataclasses.field(default_factory=Counter)


PassFn = Callable[[ExportedProgram, PassContext], PassResult]
GraphRewrite = Callable[[GraphModule, PassContext], Counter]
