"""``eliminate_dead_code`` — erase nodes whose results nobody uses.

Rule ``dead_node``: a ``call_function`` node with no users whose op is functional (no side effect;
``torch.fx``'s ``is_impure`` decides). Multi-output ops stay while any ``getitem`` of them is used.
Before/after: same outputs; placeholders are kept (the program's inputs do not change).
"""

from __future__ import annotations

from collections import Counter

from torch.export import ExportedProgram

from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import rebuild_program


def eliminate_dead_code(program: ExportedProgram, ctx: PassContext) -> PassResult:
    graph_module = program.graph_module
    hits: Counter = Counter()
    for node in reversed(list(graph_module.graph.nodes)):
        if node.op == "call_function" and not node.users and not node.is_impure():
            graph_module.graph.erase_node(node)
            hits["dead_node"] += 1
    if not hits:
        return PassResult(program, False, hits)
    return PassResult(rebuild_program(program, graph_module), True, hits)
