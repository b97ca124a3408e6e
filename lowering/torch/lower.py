"""Lowering to the torch target: an ``nn.Module`` that runs the program eagerly.

The program is unlifted (weights bound as module attributes, input-shape checks kept), then one
loop walks the graph: ATen/prims ops and ``getitem`` stay as they are (PyTorch runs them), and every
ssmcc op with an entry in ``TORCH_TABLE`` calls that entry's kernel directly, unless an
implementation is registered for the ``torch`` backend (``ssmcc.ops.backends``: a plug-in's
kernel, with ``kernels="auto"``). An ssmcc op with neither stays a ``torch.ops.ssmcc`` call:
PyTorch dispatches it to the op's registered implementation (a kernel registered with
``torch.library``, else its reference), so the torch target runs every op.

Kernels: the C++ CPU kernels (``kernels/cpu``, built on first use) when ``kernels="auto"`` and a
compiler is available, called without per-call argument checks (the IR verifier checked the
program against the ops' fake implementations); otherwise (or with ``kernels="reference"``) the
op library's pure-PyTorch reference.

The weights are then frozen (``freeze.py``): weight-only expressions are evaluated once, and every
weight is bound as one flat attribute. With the C++ kernels, float32 linear layers run on ssmcc's
matrix-vector kernel in decode and on oneDNN otherwise (``linear.py``: MKL's sgemm is 2x slower
on AMD processors). The module therefore holds the
weights' values at lowering time, as every compiled target does.
"""

from __future__ import annotations

from torch import nn
from torch.export import ExportedProgram

from ssmcc.lowering.table import Emitter
from ssmcc.lowering.torch.freeze import flatten_weight_attributes, fold_weight_expressions
from ssmcc.lowering.torch.linear import route_linears
from ssmcc.lowering.torch.skip_weights import bind_per_channel_skips
from ssmcc.ops import SSMCC_REFERENCES, is_ssmcc_op
from ssmcc.ops.backends import implementations

# Ops whose PyTorch implementation is already what a kernel would do (ATen matmuls and a
# softmax for attention, an arange for positions, a gather and a multiply for a quantised
# embedding): no C++ kernel of their own. moe_experts has one for few tokens (decode: only the
# chosen experts' weights read, once each) and keeps per-expert ATen matmuls for many.
ATEN_ONLY = ("attention", "positions", "quantized_embedding")


def _emit(name: str, kernels: str):
    """The C++ kernel when asked for and buildable here, else the op's PyTorch reference."""
    if kernels == "auto" and name not in ATEN_ONLY:
        from ssmcc.kernels.cpu import torch_binding

        if torch_binding.available():
            return torch_binding.VERIFIED_PROGRAM_KERNELS[name]
    return SSMCC_REFERENCES[name]


def _kernel_description(name: str) -> str:
    if name in ATEN_ONLY:
        return "the op's PyTorch implementation (ATen)"
    if name == "moe_experts":
        return (
            "C++ (kernels/cpu) for few tokens when a compiler is found, per-expert ATen matmuls "
            "for many"
        )
    return "C++ (kernels/cpu, OpenMP) when a compiler is found, else the PyTorch reference"


TORCH_TABLE: dict[str, Emitter] = {
    name: Emitter(
        kernel=_kernel_description(name),
        emit=lambda node, kernels, name=name: _emit(name, kernels),
    )
    for name in SSMCC_REFERENCES
}


def lower_to_torch(program: ExportedProgram, kernels: str = "auto") -> nn.Module:
    module = program.module()
    registered = implementations("torch")
    for node in module.graph.nodes:
        if node.op != "call_function" or not is_ssmcc_op(node.target):
            continue
        name = node.target._opname
        emitter = TORCH_TABLE.get(name)
        if kernels == "auto" and name in registered:
            node.target = registered[name]
        elif emitter is not None:
            node.target = emitter.emit(node, kernels)
    fold_weight_expressions(module)
    if kernels == "auto":
        bind_per_channel_skips(module)
    flatten_weight_attributes(module)
    if kernels == "auto":
        route_linears(module)
    return module
