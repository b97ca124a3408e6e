"""``fuse_scan_norm_mlp`` — fuse the small memory-bound chains between the scans into ssmcc ops.

Between two scans a Mamba block is a chain of steps that each read and write the whole
activation; in decode every step is also one more dispatch. The pass rewrites such chains into
fused ops, only where the target runs the fused op (``ctx.options["fuse_scan_norm_mlp"]
["unsupported"]``: the ops the target cannot run, from the target registry).

Rules (hits counted by name; a near miss is reported with the check that failed):

- ``rmsnorm``: the RMSNorm every family writes out in ATen (HF ``MambaRMSNorm``,
  ``Mamba2RMSNorm``, the hybrids' ``*RMSNorm``)::

      out = w * (x * rsqrt(mean(x^2, -1) + eps))        (x in float32, rounded to w's dtype)

  7 ATen nodes (pow, mean, add, rsqrt, two muls, and casts in low precision) become one
  ``ssmcc.rmsnorm_gated(x, None, w, group_size=d, eps)``: without a gate that op is this norm over
  one group of the whole last dim. The norms are what every block holds once or twice; they are
  fused first because in mamba-130m's step program they are 175 of the 803 ONNX nodes.

- ``ssd_mixer`` (``fuse_ssd_mixer.py``): a Mamba-2 mixer's whole chain between its input
  projection and its output projection — split, transposes, ``causal_conv1d``, split, views,
  ``ssd_scan``, gated ``rmsnorm_gated`` — becomes one ``ssmcc.ssd_mixer`` reading the projection
  output in place. In the derived step program it becomes ``ssd_mixer_step``: one op per layer
  between the two matmuls (mamba2-130m's step.onnx: 532 -> ~150 nodes), and in prefill no
  transposed or split copies of the activations.

- ``mamba_mixer`` (``fuse_mamba_mixer.py``): the Mamba-1 mixer's chain — transposes and chunks of
  the input projection, ``causal_conv1d``, x_proj, the split into dt/B/C (FalconMamba's weightless
  norms on them), dt_proj, ``selective_scan`` and the transpose back — becomes one
  ``ssmcc.mamba_mixer``; x_proj and dt_proj (R + 2n and R columns: a few percent of the layer's
  weights) run inside the op. In the step program it becomes ``mamba_mixer_step``: one op per
  layer between the two big matmuls (mamba-130m's step.onnx: 532 -> ~170 nodes).

Not fused, and why: the residual add + the next RMSNorm (``add_rmsnorm``): two memory passes over
a (b, l, hidden) activation per layer, a few percent of prefill; the output projection and the
next input projection stay matmuls of the target (ORT's MLAS, oneDNN), faster than ssmcc's own.

The rewrite is exact in float32 (the op computes the same formula); in bf16/fp16 the op rounds
once where HF rounds before the weight multiply, within one rounding of the input dtype.
"""

from __future__ import annotations

import operator
from collections import Counter

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ssmcc.ops import SSMCC_OPS
from ssmcc.passes.dim_labels import make_emitter, shape, tensor
from ssmcc.passes.fuse_mamba_mixer import MAMBA_MIXER, SELECTIVE_SCAN, match_mamba_mixer
from ssmcc.passes.fuse_ssd_mixer import SSD_MIXER, SSD_SCAN, match_ssd_mixer, ssd_mixer_call
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import rebuild_program
from ssmcc.passes.rules import (
    CASTS,
    Match,
    NodeRule,
    Reject,
    Through,
    Var,
    apply_rules,
    fake_mode_of,
    op,
    rms_constraints,
    rms_normalised,
)

aten = torch.ops.aten
PASS_NAME = "fuse_scan_norm_mlp"
RMSNORM = SSMCC_OPS["rmsnorm_gated"]


# w * (x * rsqrt(mean(x^2, -1) + eps)), through a cast of the normalised value (low precision)
RMSNORM_PATTERN = op(
    aten.mul.Tensor,
    Var("weight"),
    Through(CASTS, rms_normalised(one_user=True), bind="casts", one_user=True),
    commutative=True,
)


def _is_rmsnorm(unsupported):
    def check(found: Match) -> bool | Reject:
        if "rmsnorm_gated" in unsupported:
            return Reject(f"the target cannot run rmsnorm_gated: {unsupported['rmsnorm_gated']}")
        verdict = rms_constraints(found)
        if isinstance(verdict, Reject):
            return verdict
        if any(set(cast.kwargs) - {"dtype"} for cast in found["casts"]):
            return Reject("the normalised value is cast with more than a dtype")
        x, weight = found["x"], found["weight"]
        if not isinstance(weight, Node) or shape(weight) != (shape(x)[-1],):
            return Reject(f"the normalised value is multiplied by {weight}, not a weight (d,)")
        if shape(found.root) != shape(x):
            return Reject("the weight broadcasts the normalised value to another shape")
        return True

    return check


def _copy_location(source: Node, nodes) -> None:
    """The new nodes belong to ``source``'s module (reports and state names read it)."""
    for node_ in nodes:
        for key in ("nn_module_stack", "stack_trace"):
            if key in source.meta:
                node_.meta[key] = source.meta[key]


def _is_ssd_mixer(unsupported):
    def check(found: Match):
        for name in ("ssd_mixer", "ssd_mixer_step"):
            if name in unsupported:
                return Reject(f"the target cannot run {name}: {unsupported[name]}")
        match = match_ssd_mixer(found.root)
        return match if isinstance(match, Reject) else True

    return check


def _accepted(match: dict | Reject) -> dict:
    """A mixer match found again by the rewrite, after the rule's check accepted it."""
    if isinstance(match, Reject):
        raise RuntimeError(f"a mixer match the check accepted is gone: {match.reason}")
    return match


def _fuse_ssd_mixer(found: Match) -> None:
    scan = found.root
    match = _accepted(match_ssd_mixer(scan))
    norm = match["norm"]
    emit = make_emitter(scan.graph, fake_mode_of(scan.graph))
    with scan.graph.inserting_before(norm):
        mixer = emit(SSD_MIXER, *ssd_mixer_call(match))
        y = emit(operator.getitem, mixer, 0)
    _copy_location(scan, (mixer, y))
    norm.replace_all_uses_with(y)


def _is_mamba_mixer(unsupported):
    def check(found: Match):
        for name in ("mamba_mixer", "mamba_mixer_step"):
            if name in unsupported:
                return Reject(f"the target cannot run {name}: {unsupported[name]}")
        match = match_mamba_mixer(found.root)
        return match if isinstance(match, Reject) else True

    return check


def _fuse_mamba_mixer(found: Match) -> None:
    scan = found.root
    match = _accepted(match_mamba_mixer(scan))
    out = match["out"]
    emit = make_emitter(scan.graph, fake_mode_of(scan.graph))
    with scan.graph.inserting_before(out):
        mixer = emit(MAMBA_MIXER, *match["call"])
        y = emit(operator.getitem, mixer, 0)
    _copy_location(scan, (mixer, y))
    out.replace_all_uses_with(y)


def _fuse_rmsnorm(found: Match) -> None:
    x, eps, out, weight = found["x"], float(found["eps"]), found.root, found["weight"]
    graph = out.graph
    emit = make_emitter(graph, fake_mode_of(graph))
    with graph.inserting_before(out):
        fused = emit(RMSNORM, x, None, weight, shape(x)[-1], eps, False)
        new = [fused]
        if tensor(fused).dtype != tensor(out).dtype:
            fused = emit(aten._to_copy.default, fused, dtype=tensor(out).dtype)
            new.append(fused)
    _copy_location(out, new)  # the fused op belongs to the norm's module
    out.replace_all_uses_with(fused)


def rules(unsupported: dict) -> tuple[tuple[NodeRule, ...], ...]:
    """The rules in rounds: the mixers first, then the norms left outside them (a norm inside a
    fused mixer, e.g. FalconMamba's weightless ones, is gone by then and not reported)."""
    mixers = (
        NodeRule("ssd_mixer", op(SSD_SCAN), _is_ssd_mixer(unsupported), _fuse_ssd_mixer),
        NodeRule(
            "mamba_mixer", op(SELECTIVE_SCAN), _is_mamba_mixer(unsupported), _fuse_mamba_mixer
        ),
    )
    norms = (
        NodeRule(
            "rmsnorm",
            RMSNORM_PATTERN,
            _is_rmsnorm(unsupported),
            _fuse_rmsnorm,
            candidate="rsqrt",
        ),
    )
    return mixers, norms


def fuse_scan_norm_mlp(program: ExportedProgram, ctx: PassContext) -> PassResult:
    unsupported = ctx.options.get(PASS_NAME, {}).get("unsupported", {})
    graph = program.graph_module.graph
    hits: Counter[str] = Counter()
    for round_ in rules(unsupported):  # a later round skips what an earlier one made unused
        found, rejections = apply_rules(graph, round_, live_only=True)
        hits.update(found)
        for rule, reasons in rejections.items():
            ctx.diagnostics.setdefault(f"{PASS_NAME}.{rule}", []).extend(reasons)
    if not hits:
        return PassResult(program, False, hits)
    return PassResult(rebuild_program(program, program.graph_module), True, hits)
