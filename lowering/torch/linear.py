"""The torch target's linear layers: ssmcc's matrix-vector kernel in decode, oneDNN otherwise.

A lowered program computes ``aten.linear(x, W, b)`` = ``x W^T + b`` for every projection: in
prefill these matrix products are most of the time, in decode (one token) they are matrix-vector
products that read every weight once, i.e. most of the memory traffic. PyTorch runs
``aten.linear`` in float32 through MKL's sgemm, which on AMD processors takes a slow path:
measured on an AMD EPYC (Zen 5, 2 threads) at mamba2-130m's shapes, MKL 157 GFLOP/s for the
(2048 x 768) x (768 x 3352) product against oneDNN's 315-378, and 12 GB/s against 28-31 GB/s
for the LM head's matrix-vector product. ``torch.ops.mkldnn._linear_pointwise`` (oneDNN, the
primitive inductor's CPU freezing uses) takes the same dense weight, so routing each float32
``aten.linear`` with a weight attribute to it costs no memory; oneDNN is Intel's own library, so
Intel processors lose nothing.

With at most ``GEMV_MAX_ROWS`` rows of input (decode: one token per sequence) the product is
ssmcc's own matrix-vector kernel (``kernels/cpu/gemv.h``), which streams the weights at the
speed of memory: the same machine, all of mamba2-130m's weights per token, read at 34-38 GB/s
against oneDNN's 24-26 and MKL's 11.

Applied at lowering (the lowered module's graph), never to the IR: saved programs and every
other target keep ``aten.linear``. ``kernels="reference"`` keeps ``aten.linear`` too.
"""

from __future__ import annotations

import torch
from torch import fx

from ssmcc.kernels.cpu import linear_binding, native
from ssmcc.kernels.cpu.linear_binding import GEMV_MAX_ROWS, dense_linear, onednn_available

aten = torch.ops.aten


def _float32_attr(module: fx.GraphModule, node, rank: int) -> bool:
    """A float32 attribute of ``rank`` dims with at least one element (a projection of width 0,
    such as GraniteMoeHybrid's shared MLP at ``shared_intermediate_size=0``, stays
    ``aten.linear``, whose empty sum is zero)."""
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return False
    value = module
    for name in node.target.split("."):
        value = getattr(value, name)
    return (
        isinstance(value, torch.Tensor)
        and value.dtype == torch.float32
        and value.dim() == rank
        and value.numel() > 0
    )


def linear_cpu(x, weight, bias=None):
    """``x W^T + b``: the matrix-vector kernel for a few rows, else oneDNN, else aten."""
    if gemv_available() and x.numel() <= GEMV_MAX_ROWS * x.shape[-1]:
        return linear_binding.linear_cpu(x, weight, bias)
    return dense_linear(x, weight, bias)


def gemv_available() -> bool:
    return native.available()


def route_linears(module: fx.GraphModule) -> int:
    """Call ``linear_cpu`` for every float32 ``aten.linear`` whose weight (and bias) are module
    attributes; returns how many. Nothing changes where neither kernel is available."""
    if not (onednn_available() or gemv_available()):
        return 0
    routed = 0
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target != aten.linear.default or node.kwargs:
            continue
        x, weight, bias = (*node.args, None)[:3]
        value = x.meta.get("val") if isinstance(x, fx.Node) else None
        if not (isinstance(value, torch.Tensor) and value.dtype == torch.float32):
            continue
        if not _float32_attr(module, weight, 2):
            continue
        if bias is not None and not _float32_attr(module, bias, 1):
            continue
        node.target = linear_cpu
        routed += 1
    module.recompile()
    return routed
