"""Chunked state passing: the program that runs one chunk of a long prompt.

Prefill of ``l`` tokens is a fold over chunks of ``chunk_size`` tokens::

    state_0 = given (zeros for a new prompt)
    logits_j, state_{j+1} = chunk(ids[:, j*c : (j+1)*c], state_j)

which computes exactly what one prefill of all ``l`` tokens computes, because every SSM layer's
conv and scan take the previous chunk's final state as their initial state (the stateful prefill
program of ``expose_recurrent_state``). Peak activation memory is then that of one chunk, not of
the whole prompt; the loop itself is ``ssmcc.runtime.chunked.run_chunks``, shared by every target.

This pass takes the stateful prefill program ``(input_ids (b, l), *states) -> (logits (b, l, v),
*states)`` and returns the chunk program ``(input_ids (b, c), *states) -> (last_logits (b, v),
*states)``: only the last position is sent through the language-model head, so a chunk never
materialises ``(b, c, v)`` logits (at 32K tokens and a 50K vocabulary those alone are 6.6 GB).

The chunk program is the prefill graph edited, not traced again: the head's input becomes
``hidden[:, -1:]`` (``aten.slice``), the logits output ``logits[:, -1]`` (``aten.select``), and
the recorded shapes of the head and the position-wise ops after it are recomputed in the
program's fake mode. (It was a second ``torch.export`` of an interpreter doing the same until
2026-12-06: the same ops, 0.4-1.3 s per tiny model.)

Rules (hits counted in ``stats``):

- ``head_on_last_position``: the logits output is reached from an ``aten.linear`` / ``aten.matmul``
  (or ``ssmcc.quantized_linear``) through position-wise ops only (casts, scaling, softcapping),
  each read by the next alone; that head's input is sliced to its last position, so the head
  runs on one row per sequence.
- ``logits_sliced``: no such head was found; the full logits are computed and the last row taken
  (correct, without the memory saving). The reason goes to ``ctx.diagnostics``.

Option ``chunk_size`` (``ctx.options["chunk_state_passing"]``) must be a positive integer; it is
checked here and carried by ``StatefulPrograms``, not baked into the graph, so one program serves
every chunk length, the last (shorter) chunk included.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable
from typing import Any, cast

import torch
from torch.export import ExportedProgram
from torch.fx.passes.shape_prop import _extract_tensor_metadata

from ssmcc.errors import InputError
from ssmcc.ops import SSMCC_OPS
from ssmcc.options import DEFAULT_CHUNK_SIZE, check_chunk_size
from ssmcc.passes.call_args import list_arg
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import clone_program, rebuild_program
from ssmcc.passes.rules import CASTS, fake_mode_of

PASS_NAME = "chunk_state_passing"
_TO_THE_END = sys.maxsize  # aten.slice's end for "to the end", as export writes ``x[:, -1:]``

# input 0 is the hidden state (a quantised head: ssmcc.quantized_linear, from quantize_weights)
_HEADS = {
    torch.ops.aten.linear.default,
    torch.ops.aten.matmul.default,
    SSMCC_OPS["quantized_linear"],
}
# Ops that act on each position on its own: the head may be moved before them.
_POSITIONWISE = {
    *CASTS,
    torch.ops.aten.mul.Tensor,
    torch.ops.aten.div.Tensor,
    torch.ops.aten.tanh.default,
    torch.ops.aten.add.Tensor,
    torch.ops.aten.clone.default,
    torch.ops.aten.contiguous.default,
}


def chunk_size_option(ctx: PassContext) -> int:
    return check_chunk_size(ctx.options.get(PASS_NAME, {}).get("chunk_size", DEFAULT_CHUNK_SIZE))


def find_head(graph: torch.fx.Graph) -> tuple[list[torch.fx.Node] | None, str]:
    """The nodes from the linear/matmul head to the first output through position-wise ops, each
    read by the next alone and the logits once by the output alone (so slicing the head's input
    changes nothing else), or why not."""
    output = graph.output_node()
    results = list_arg(output, 0)
    chain: list[torch.fx.Node] = []
    node = results[0] if results else None
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        chain.append(node)
        if node.target in _HEADS:
            readers = [output, *chain[:-1]]  # chain runs back from the logits to the head
            shared = any(list(n.users) != [r] for n, r in zip(chain, readers, strict=True))
            if shared or results.count(chain[0]) != 1:
                reason = f"a value between the head {node.name} and the logits has other readers"
                return None, reason
            return chain[::-1], ""
        if node.target not in _POSITIONWISE:
            return None, f"logits come from {node.target} ({node.name}), not a position-wise op"
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != 1:
            return None, f"{node.name} ({node.target}) combines {len(tensors)} tensors"
        node = tensors[0]
    return None, "the logits are not computed by a linear or matmul head"


def chunk_state_passing(program: ExportedProgram, ctx: PassContext) -> PassResult:
    """The chunk program of a stateful prefill program (see the module docstring)."""
    chunk_size_option(ctx)
    user_inputs = program.graph_signature.user_inputs
    if len(user_inputs) < 2:
        raise InputError(
            "chunk_state_passing needs the stateful prefill program (input_ids and the states "
            "as inputs); run expose_recurrent_state first"
        )
    program = clone_program(program)
    graph = program.graph_module.graph
    chain, reason = find_head(graph)
    hits: Counter[str] = Counter()
    if chain is None:
        hits["logits_sliced"] += 1
        ctx.diagnostics.setdefault(f"{PASS_NAME}.head_on_last_position", []).append(reason)
    else:
        hits["head_on_last_position"] += 1
    _last_position_edit(graph, chain or [])
    return PassResult(rebuild_program(program, program.graph_module), True, hits)


def _last_position_edit(graph: torch.fx.Graph, chain: list[torch.fx.Node]) -> None:
    """``hidden[:, -1:]`` into the head of ``chain`` (none: the logits as they are), then the
    logits output's last position; the edited values' recorded shapes recomputed."""
    output = graph.output_node()
    results = list_arg(output, 0)
    logits = results[0]
    if not isinstance(logits, torch.fx.Node):
        raise InputError(f"the stateful prefill program's first output is {logits!r}, not logits")
    fake_mode = fake_mode_of(graph)
    edited: list[torch.fx.Node] = []
    if chain:
        head = chain[0]
        with graph.inserting_before(head):
            last = graph.create_node(
                "call_function",
                torch.ops.aten.slice.Tensor,
                (head.args[0], 1, -1, _TO_THE_END),
                name="slice",
            )
        head.args = (last, *head.args[1:])
        edited = [last, *chain]
    with graph.inserting_before(output):
        picked = graph.create_node(
            "call_function", torch.ops.aten.select.int, (logits, 1, -1), name="select"
        )
    output.args = ((picked, *results[1:]),)
    edited.append(picked)
    for node in edited:
        node.meta.setdefault("stack_trace", logits.meta.get("stack_trace"))
        node.meta.setdefault("nn_module_stack", logits.meta.get("nn_module_stack", {}))
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta["val"])
        target = cast(Callable[..., Any], node.target)  # a call_function node's: an op
        with fake_mode:
            node.meta["val"] = target(*args, **kwargs)
        if "tensor_meta" in logits.meta:
            node.meta["tensor_meta"] = _extract_tensor_metadata(node.meta["val"])
