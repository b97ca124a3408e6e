"""Rule ``mamba_mixer`` of ``fuse_scan_norm_mlp``: a Mamba-1 mixer's chain from its input
projection to its scan becomes one ``ssmcc.mamba_mixer`` (math: ``ssmcc.ops.mamba_mixer``).

Matched (HF Mamba and FalconMamba after routing; P = the projection output (b, l, w))::

    x, z        = channel slices of P^T (b, c, l)            (transpose, then chunk/split/slice)
    xc          = causal_conv1d(x, conv_weight, conv_bias, None, act)[0]
    dt_r, B, C  = split(linear(xc^T, x_proj_weight), [R, n, n])     optionally each through a
                                                                   weightless RMS norm (FalconMamba)
    y           = selective_scan(xc, dt_proj_weight @ dt_r^T, A, B^T, C^T, D, z, dt_bias, ...)[0]
    out         = y^T                          (b, l, d): what the output projection reads
->  out         = mamba_mixer(P, conv_weight, conv_bias, x_proj_weight, dt_proj_weight, A, D,
                              dt_bias, offsets of x and z, ...)[0]

Nothing between P and ``out`` may be used outside the chain (the scan's and conv's final states
included). The rewrite is exact: the op's reference is this chain.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.ops.contracts import bind_arguments
from ssmcc.passes.call_args import int_arg, node_arg
from ssmcc.passes.dim_labels import shape
from ssmcc.passes.rules import (
    CASTS,
    Reject,
    Through,
    match,
    rms_constraints,
    rms_normalised,
    through_casts,
)
from ssmcc.passes.token_layout import (
    SPLITS,
    channel_slice,
    getitems,
    split_offset,
    transpose_1_2,
)

aten = torch.ops.aten
SELECTIVE_SCAN, CONV = SSMCC_OPS["selective_scan"], SSMCC_OPS["causal_conv1d"]
MAMBA_MIXER = SSMCC_OPS["mamba_mixer"]
# FalconMamba's weightless norms on dt_r, B and C: v * rsqrt(mean(v^2, -1) + eps), through casts
WEIGHTLESS_RMS = Through(CASTS | {aten.type_as.default}, rms_normalised())


def _weightless_rms(node: Node) -> tuple[Node, float] | None:
    """(v, eps) when ``node`` is ``v * rsqrt(mean(v^2, -1, keepdim) + eps)`` (through casts)."""
    found = match(WEIGHTLESS_RMS, node)
    if isinstance(found, Reject) or isinstance(rms_constraints(found), Reject):
        return None
    return through_casts(found["x"]), float(found["eps"])


def _projected_piece(value: Node, walked: set):
    """(x_proj output, offset, rms eps or None) of dt_r / B / C, read back from the scan side."""
    eps = None
    normed = _weightless_rms(value)
    if normed is not None:
        start = value
        value, eps = normed
        stack = [start]
        while stack:  # the norm's nodes belong to the chain
            node = stack.pop()
            if node in walked or node is value:
                continue
            walked.add(node)
            stack.extend(n for n in node.all_input_nodes if n is not value)
    if value.target != operator.getitem or node_arg(value).target not in SPLITS:
        return Reject(f"{value.name} is not a piece of the x_proj output")
    split = node_arg(value)
    offset = split_offset(split, int_arg(value, 1))
    if offset is None:
        return Reject(f"{split.name} splits another axis than the last")
    walked.update((value, split))
    return node_arg(split), offset, eps


def match_mamba_mixer(scan: Node) -> dict | Reject:
    """The pieces of a fusable Mamba-1 mixer around ``scan``, or why not."""
    args = bind_arguments(scan.target, scan.args, scan.kwargs)
    if args["initial_state"] is not None:
        return Reject("the scan has an initial state")
    if args["B"].meta["val"].dim() != 3 or args["C"].meta["val"].dim() != 3:
        return Reject("B or C is grouped (the fused op takes one B and C for every channel)")
    walked: set = {scan}
    outputs = getitems(scan)
    if 1 in outputs and outputs[1].users:
        return Reject("the scan's final state is used")
    if 0 not in outputs or len(outputs[0].users) != 1:
        return Reject("the scan's output is not read once")
    walked.update(outputs.values())
    out = next(iter(outputs[0].users))
    if transpose_1_2(out) is not outputs[0]:
        return Reject("the scan's output is not transposed back to (b, l, d)")
    conv_out = args["u"]
    if conv_out.target != operator.getitem or conv_out.args[0].target != CONV:
        return Reject("the scan's input is not a causal_conv1d output")
    conv = conv_out.args[0]
    conv_args = bind_arguments(conv.target, conv.args, conv.kwargs)
    if conv_args["initial_state"] is not None:
        return Reject("the conv has an initial state")
    if 1 in getitems(conv) and getitems(conv)[1].users:
        return Reject("the conv's final state is used")
    walked.update((conv, *getitems(conv).values()))
    sources = {}
    for name, value in (("x", conv_args["x"]), ("z", args["z"])):
        if value is None:
            continue
        found = channel_slice(value, walked)
        if isinstance(found, Reject):
            return found
        sources[name] = found
    if len({source for source, _ in sources.values()}) != 1:
        return Reject("x and z are not slices of one projection output")
    delta = args["delta"]
    if delta.target != aten.matmul.default or transpose_1_2(delta.args[1]) is None:
        return Reject("dt is not dt_proj_weight @ dt_r^T")
    dt_proj_weight = delta.args[0]
    walked.update((delta, delta.args[1]))
    pieces = {}
    for name, transposed in (("dt", delta.args[1]), ("B", args["B"]), ("C", args["C"])):
        value = transpose_1_2(transposed)
        if value is None:
            return Reject(f"{name} is not a transposed piece of the x_proj output")
        walked.add(transposed)
        found = _projected_piece(value, walked)
        if isinstance(found, Reject):
            return found
        pieces[name] = found
    projections = {p for p, _, _ in pieces.values()}
    epsilons = {e for _, _, e in pieces.values()}
    rank, state = shape(dt_proj_weight)[1], shape(args["A"])[1]
    offsets = {name: offset for name, (_, offset, _) in pieces.items()}
    if len(projections) != 1 or offsets != {"dt": 0, "B": rank, "C": rank + state}:
        return Reject("dt_r, B and C are not the pieces [R, n, n] of one x_proj output")
    if len(epsilons) != 1:
        return Reject("dt_r, B and C are not normalised alike")
    x_proj = projections.pop()
    if x_proj.target != aten.linear.default or len(x_proj.args) > 2 and x_proj.args[2] is not None:
        return Reject("the x_proj output is not a linear without bias")
    if transpose_1_2(x_proj.args[0]) is not conv_out:
        return Reject("x_proj does not read the conv output")
    walked.update((x_proj, x_proj.args[0]))
    inside = [n for n in walked if n.target not in SPLITS]
    outside = [n for n in inside if any(u not in walked and u is not out for u in n.users)]
    if outside:
        return Reject(f"{outside[0].name} is also used outside the mixer")
    return dict(
        out=out,
        scan=scan,
        call=(
            sources["x"][0],
            conv_args["weight"],
            conv_args["bias"],
            x_proj.args[1],
            dt_proj_weight,
            args["A"],
            args["D"],
            args["delta_bias"],
            sources["x"][1],
            sources["z"][1] if "z" in sources else -1,
            conv_args["activation"],
            bool(args["delta_softplus"]),
            epsilons.pop(),
        ),
    )
