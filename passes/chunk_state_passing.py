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

Rules (hits counted in ``stats``):

- ``head_on_last_position``: the logits output is reached from an ``aten.linear`` / ``aten.matmul``
  (or ``ssmcc.quantized_linear``) through position-wise ops only (casts, scaling, softcapping);
  that head's input is sliced to its last position, so the head runs on one row per sequence.
- ``logits_sliced``: no such head was found; the full logits are computed and the last row taken
  (correct, without the memory saving). The reason goes to ``ctx.diagnostics``.

Option ``chunk_size`` (``ctx.options["chunk_state_passing"]``) must be a positive integer; it is
checked here and carried by ``StatefulPrograms``, not baked into the graph, so one program serves
every chunk length, the last (shorter) chunk included.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from ssmcc.errors import InputError
from ssmcc.ops import SSMCC_OPS
from ssmcc.options import DEFAULT_CHUNK_SIZE, check_chunk_size
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.rules import CASTS
from ssmcc.passes.scan_to_recurrent_step import PAST_EXAMPLE, past_dim

PASS_NAME = "chunk_state_passing"

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


def find_head(graph: torch.fx.Graph) -> tuple[torch.fx.Node | None, str]:
    """The linear/matmul producing the first output through position-wise ops, or why not."""
    output = next(n for n in graph.nodes if n.op == "output")
    results = output.args[0]
    node = results[0] if isinstance(results, (tuple, list)) else results
    while isinstance(node, torch.fx.Node) and node.op == "call_function":
        if node.target in _HEADS:
            return node, ""
        if node.target not in _POSITIONWISE:
            return None, f"logits come from {node.target} ({node.name}), not a position-wise op"
        tensors = [a for a in node.args if isinstance(a, torch.fx.Node)]
        if len(tensors) != 1:
            return None, f"{node.name} ({node.target}) combines {len(tensors)} tensors"
        node = tensors[0]
    return None, "the logits are not computed by a linear or matmul head"


class _LastPositionInterpreter(torch.fx.Interpreter):
    def __init__(self, module, head_name: str | None):
        super().__init__(module)
        self.head_name = head_name

    def run_node(self, node):
        if node.name != self.head_name:
            return super().run_node(node)
        args, kwargs = self.fetch_args_kwargs_from_env(node)
        hidden, *rest = args
        return node.target(hidden[:, -1:], *rest, **kwargs)


class _Chunk(nn.Module):
    def __init__(self, program: ExportedProgram, head_name: str | None):
        super().__init__()
        self.inner = program.module()
        self.head_name = head_name

    def forward(self, input_ids, *states):
        logits, *new_states = _LastPositionInterpreter(self.inner, self.head_name).run(
            input_ids, *states
        )
        return (logits[:, -1], *new_states)


def chunk_state_passing(program: ExportedProgram, ctx: PassContext) -> PassResult:
    """The chunk program of a stateful prefill program (see the module docstring)."""
    chunk_size_option(ctx)
    user_inputs = program.graph_signature.user_inputs
    if len(user_inputs) < 2:
        raise InputError(
            "chunk_state_passing needs the stateful prefill program (input_ids and the states "
            "as inputs); run expose_recurrent_state first"
        )
    module = program.module()
    head, reason = find_head(module.graph)
    hits: Counter[str] = Counter()
    if head is None:
        hits["logits_sliced"] += 1
        ctx.diagnostics.setdefault(f"{PASS_NAME}.head_on_last_position", []).append(reason)
    else:
        hits["head_on_last_position"] += 1
    ids_example = torch.zeros(2, 8, dtype=torch.long)
    values = [
        node.meta["val"]
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in user_inputs[1:]
    ]
    # A dynamic state axis is a cache's positions (all caches hold the same ones).
    growing = [[isinstance(size, torch.SymInt) for size in v.shape[1:]] for v in values]
    states = [
        torch.zeros(
            2,
            *(PAST_EXAMPLE if g else int(n) for g, n in zip(grow, v.shape[1:], strict=True)),
            dtype=v.dtype,
        )
        for grow, v in zip(growing, values, strict=True)
    ]
    batch, past = Dim("batch", min=1), past_dim()
    shapes = (
        {0: batch, 1: Dim("seq", min=1)},
        tuple({0: batch, **{1 + a: past for a, g in enumerate(grow) if g}} for grow in growing),
    )
    exported = torch.export.export(
        _Chunk(program, None if head is None else head.name),
        (ids_example, *states),
        dynamic_shapes=shapes,
        strict=False,
    )
    return PassResult(exported, True, hits)
