"""``detect_causal_conv1d`` — Mamba's causal depthwise convolution, written as a padded
``conv1d`` cut to the input length, becomes ``ssmcc::causal_conv1d``.

Rule ``padded_conv_slice``: ``conv1d(x, w, b, stride=1, padding=k-1, dilation=1, groups=d)
[..., :L]`` with x (batch, d, L) and w (d, 1, k) is

    out_t[c] = b[c] + sum_{j=0}^{k-1} w[c, 0, j] * x[c, t + j - (k-1)]     (x = 0 before t = 0)

which is ``causal_conv1d(x, w[:, 0], b)``. Rule ``fold_silu``: a ``silu`` that is the only user
of the result becomes the op's ``activation="silu"``. This is how Hugging Face's Mamba mixers
compute the convolution when capture does not route them; with the scan re-rolled by
``detect_selective_scan`` too, such a program holds the same ssmcc ops as a routed capture.

Before: any program. After: the same function (the op computes the same sums in float32); a
rejected candidate is recorded in ``ctx.diagnostics`` with the check that failed.
"""

from __future__ import annotations

import operator
from collections import Counter

import torch
from torch.export import ExportedProgram
from torch.fx import GraphModule, Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.passes.dim_labels import make_emitter, shape
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import rebuild_program
from ssmcc.passes.rules import Match, NodeRule, Reject, Var, apply_rules, fake_mode_of, op

aten = torch.ops.aten
PASS_NAME = "detect_causal_conv1d"
CONV = SSMCC_OPS["causal_conv1d"]


def _same_size(a, b) -> bool:
    return a == b if isinstance(a, int) and isinstance(b, int) else str(a) == str(b)


# conv1d(x, w, b, stride, padding, dilation, groups)[:, :, start:end:step] (slice on one dim)
PADDED_CONV_SLICE = op(
    aten.slice.Tensor,
    op(
        aten.conv1d.default,
        bind="conv",
        why="input is not a conv1d",
        input=Var("x"),
        weight=Var("weight"),
        bias=Var("bias"),
        stride=Var("stride"),
        padding=Var("padding"),
        dilation=Var("dilation"),
        groups=Var("groups"),
    ),
    dim=Var("dim"),
    start=Var("start"),
    end=Var("end"),
    step=Var("step"),
)


def _is_causal_cut(found: Match) -> bool | Reject:
    conv = found["conv"]
    x_shape, w_shape = shape(found["x"]), shape(found["weight"])
    if len(x_shape) != 3 or len(w_shape) != 3:
        return Reject(f"{conv.name}: input {x_shape} / weight {w_shape} are not 3-d")
    channels, width = x_shape[1], w_shape[2]
    stride, padding, dilation = (list(found[k]) for k in ("stride", "padding", "dilation"))
    groups = found["groups"]
    if stride != [1] or dilation != [1]:
        return Reject(f"{conv.name}: stride {stride}, dilation {dilation}")
    if not (_same_size(groups, channels) and _same_size(w_shape[0], channels) and w_shape[1] == 1):
        return Reject(f"{conv.name}: not depthwise (groups {groups}, weight {w_shape})")
    if padding != [width - 1]:
        return Reject(f"{conv.name}: padding {padding}, not kernel width - 1 = {width - 1}")
    dim, start, end, step = (found[k] for k in ("dim", "start", "end", "step"))
    if dim not in (2, -1) or start not in (0, None) or step != 1:
        return Reject(f"slices dim {dim} from {start} by {step}, not the first L positions")
    if isinstance(end, Node):  # a length read from a tensor: compare its value
        end = end.meta.get("val")
    if end is None or not _same_size(end, x_shape[2]):
        return Reject(f"keeps {end} positions, the input has {x_shape[2]}")
    return True


def _rewrite(found: Match) -> None:
    node, conv = found.root, found["conv"]
    graph = node.graph
    users = list(node.users)
    silu = users[0] if len(users) == 1 and users[0].target == aten.silu.default else None
    emit = make_emitter(graph, fake_mode_of(graph))
    with graph.inserting_before(node):
        kernel = emit(aten.squeeze.dim, found["weight"], 1)
        result = emit(CONV, found["x"], kernel, found["bias"], None, "silu" if silu else None)
        out = emit(operator.getitem, result, 0)
    for new in (kernel, result, out):
        for key in ("nn_module_stack", "stack_trace"):
            if key in conv.meta:
                new.meta[key] = conv.meta[key]
    (silu or node).replace_all_uses_with(out)
    if silu is not None:
        graph.erase_node(silu)
    graph.erase_node(node)
    if not conv.users:
        graph.erase_node(conv)


RULES = (
    NodeRule("padded_conv_slice", PADDED_CONV_SLICE, _is_causal_cut, _rewrite, candidate="conv"),
)


def rewrite_causal_conv1d(graph_module: GraphModule, ctx: PassContext) -> Counter:
    """The pass on an ATen graph, in place: hits by rule (empty: the graph is as it was)."""
    diagnostics = ctx.diagnostics
    silu_before = sum(1 for n in graph_module.graph.nodes if n.target == aten.silu.default)
    hits, rejections = apply_rules(graph_module.graph, RULES)
    for rule, reasons in rejections.items():
        diagnostics.setdefault(f"{PASS_NAME}.{rule}", []).extend(reasons)
    if not hits:
        return Counter()
    folded = silu_before - sum(1 for n in graph_module.graph.nodes if n.target == aten.silu.default)
    if folded:
        hits["fold_silu"] = folded
    return Counter(hits)


def detect_causal_conv1d(program: ExportedProgram, ctx: PassContext) -> PassResult:
    hits = rewrite_causal_conv1d(program.graph_module, ctx)
    if not hits:
        return PassResult(program, False, Counter())
    return PassResult(rebuild_program(program, program.graph_module), True, hits)
