"""Rule ``ssd_mixer`` of ``fuse_scan_norm_mlp``: a Mamba-2 mixer's chain from its input projection
to its gated norm becomes one ``ssmcc.ssd_mixer`` (math: ``ssmcc.ops.ssd_mixer``).

Matched (every HF Mamba-2 family after routing; P = the projection output (b, l, w))::

    z, xBC, dt = slices of P's last axis          (split / slice, then views)
    conv       = causal_conv1d(xBC^T, weight, bias, None, act)            channel-first
    x, B, C    = slices [0, d), [d, d+gn), [d+gn, d+2gn) of conv[0]^T,  viewed (b, l, h, p),
                 (b, l, g, n), (b, l, g, n)
    y          = ssd_scan(x, dt, A, B, C, D, None, dt_bias, ...)[0]  viewed (b, l, d)
    out        = rmsnorm_gated(y, z, norm_weight, ...)
->  out        = ssd_mixer(P, weight, bias, A, D, dt_bias, norm_weight, g, offsets of z/xBC/dt,
                           ...)[0]

"Slices of P's last axis" are read through views that keep (b, l) and merge or split the rest,
``split``/``split_with_sizes`` and ``slice`` on the last axis (``token_slice``). Nothing between P
and the norm may be used outside the chain (the conv's and the scan's final states included):
the chain must disappear whole. A chain that does not fit is reported with the first check that
failed. The rewrite is exact: the op's reference is these ops in this order.
"""

from __future__ import annotations

import operator

import torch
from torch.fx import Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.ops.contracts import bind_arguments
from ssmcc.passes.call_args import node_arg, optional_node_arg
from ssmcc.passes.dim_labels import shape
from ssmcc.passes.rules import Reject
from ssmcc.passes.token_layout import SPLITS, VIEWS, getitems, token_slice, transpose_1_2

aten = torch.ops.aten
SSD_SCAN, CONV, NORM = (SSMCC_OPS[k] for k in ("ssd_scan", "causal_conv1d", "rmsnorm_gated"))
SSD_MIXER = SSMCC_OPS["ssd_mixer"]


def _norm_of(scan: Node, walked: set) -> Node | Reject:
    """The gated norm reading the scan's output through views (the only user on the way)."""
    outputs = getitems(scan)
    if 1 in outputs and outputs[1].users:
        return Reject("the scan's final state is used")
    if 0 not in outputs:
        return Reject("the scan's output is not used")
    node = outputs[0]
    walked.update(outputs.values())
    while len(node.users) == 1:
        user = next(iter(node.users))
        if user.target == NORM and user.args[0] is node:
            return user
        if user.target not in VIEWS:
            break
        walked.add(user)
        node = user
    return Reject("the scan's output does not reach an rmsnorm_gated through views alone")


def match_ssd_mixer(scan: Node) -> dict | Reject:
    """The pieces of a fusable mixer around ``scan``, or why not."""
    args = bind_arguments(scan.target, scan.args, scan.kwargs)
    if args["z"] is not None or args["initial_state"] is not None:
        return Reject("the scan has its own gate or initial state")
    walked: set = {scan}
    norm = _norm_of(scan, walked)
    if isinstance(norm, Reject):
        return norm
    z = optional_node_arg(norm, 1)
    heads, head_dim = shape(args["x"])[2:]
    groups, state = shape(args["B"])[2:]
    inner, gn = heads * head_dim, groups * state
    pieces = {}
    expected = (("x", args["x"], 0), ("B", args["B"], inner), ("C", args["C"], inner + gn))
    for name, value, offset in expected:
        found = token_slice(value, walked)
        if isinstance(found, Reject):
            return found
        if found[1] != offset:
            return Reject(f"{name} is at offset {found[1]} of the conv output, expected {offset}")
        pieces[name] = found[0]
    conv_token_major = pieces["x"]
    if not (pieces["B"] is conv_token_major and pieces["C"] is conv_token_major):
        return Reject("x, B and C are not slices of one conv output")
    conv_out = transpose_1_2(conv_token_major)
    if conv_out is None or conv_out.target != operator.getitem or node_arg(conv_out).target != CONV:
        return Reject("x, B and C do not come from a causal_conv1d (transposed back)")
    conv = node_arg(conv_out)
    walked.update((conv_token_major, conv_out, conv))
    conv_args = bind_arguments(conv.target, conv.args, conv.kwargs)
    if conv_args["initial_state"] is not None:
        return Reject("the conv has an initial state")
    if 1 in getitems(conv) and getitems(conv)[1].users:
        return Reject("the conv's final state is used")
    walked.update(getitems(conv).values())
    channels = shape(conv_args["weight"])[0]
    if channels != inner + 2 * gn:
        return Reject(f"the conv has {channels} channels, not x, B and C ({inner + 2 * gn})")
    conv_in = transpose_1_2(conv_args["x"])
    if conv_in is None:
        return Reject("the conv's input is not a (b, l, c) slice transposed to (b, c, l)")
    walked.add(conv_args["x"])
    sources = {}
    for name, value in (("xBC", conv_in), ("dt", args["dt"]), ("z", z)):
        if value is None:
            continue
        found = token_slice(value, walked)
        if isinstance(found, Reject):
            return found
        sources[name] = found
    projections = {source for source, _ in sources.values()}
    if len(projections) != 1:
        return Reject("z, xBC and dt are not slices of one projection output")
    # a split may also feed pieces the mixer does not read (it stays for them)
    inside = [n for n in walked if n.target not in SPLITS]
    outside = [n for n in inside if any(u not in walked and u is not norm for u in n.users)]
    if outside:
        return Reject(f"{outside[0].name} is also used outside the mixer")
    norm_args = bind_arguments(norm.target, norm.args, norm.kwargs)
    return dict(
        norm=norm,
        scan=scan,
        projection=projections.pop(),
        offsets={name: offset for name, (_, offset) in sources.items()},
        conv=conv_args,
        scan_args=args,
        norm_args=norm_args,
        groups=groups,
    )


def ssd_mixer_call(match: dict) -> tuple:
    """The arguments of the ``ssd_mixer`` call that replaces ``match``."""
    conv, scan, norm = match["conv"], match["scan_args"], match["norm_args"]
    offsets = match["offsets"]
    return (
        match["projection"],
        conv["weight"],
        conv["bias"],
        scan["A"],
        scan["D"],
        scan["dt_bias"],
        norm["weight"],
        int(match["groups"]),
        offsets.get("z", -1),
        offsets["xBC"],
        offsets["dt"],
        int(norm["group_size"]),
        float(norm["eps"]),
        bool(norm["norm_before_gate"]),
        conv["activation"],
        bool(scan["dt_softplus"]),
        float(scan["dt_min"]),
        None if scan["dt_max"] is None else float(scan["dt_max"]),
    )
