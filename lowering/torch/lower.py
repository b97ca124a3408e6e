"""Lowering to the torch target: an ``nn.Module`` that runs the program eagerly.

The program is unlifted (weights bound as module attributes, input-shape checks kept), then one
loop walks the graph: ATen/prims ops and ``getitem`` stay as they are (PyTorch runs them), and every
ssmcc op is replaced by its emitter's callable from ``TORCH_TABLE``. An op with no entry raises
``LoweringError`` naming the op, the node and the backend.

Kernels: every ssmcc op dispatches through ``torch.ops.ssmcc.*`` on CPU, i.e. the op library's
pure-PyTorch reference implementation.
"""

from __future__ import annotations

from torch import nn
from torch.export import ExportedProgram

from ssmcc.errors import LoweringError
from ssmcc.lowering.table import Emitter, register_table
from ssmcc.ops import SSMCC_OPS, is_ssmcc_op


def _dispatch_through_op(node):
    return node.target


TORCH_TABLE: dict[str, Emitter] = {
    name: Emitter(kernel="reference (pure PyTorch, torch.ops.ssmcc)", emit=_dispatch_through_op)
    for name in SSMCC_OPS
}
register_table("torch", TORCH_TABLE)


def lower_to_torch(program: ExportedProgram) -> nn.Module:
    module = program.module()
    for node in module.graph.nodes:
        if node.op != "call_function" or not is_ssmcc_op(node.target):
            continue
        emitter = TORCH_TABLE.get(node.target._opname)
        if emitter is None:
            raise LoweringError(
                f"backend 'torch' has no emitter for op ssmcc.{node.target._opname} "
                f"(node {node.name}); supported: {', '.join(sorted(TORCH_TABLE))}"
            )
        node.target = emitter.emit(node)
    module.recompile()
    return module
