"""The pass pipelines, as explicit ordered lists. The only place pass order is decided."""

from __future__ import annotations

from ssmcc.errors import SSMCCError
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.detect_causal_conv1d import detect_causal_conv1d
from ssmcc.passes.detect_selective_scan import detect_selective_scan
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp
from ssmcc.passes.pass_base import PassFn

PIPELINES: dict[str, list[PassFn]] = {
    # Clean-up every target starts from; convolutions and scans that capture did not route
    # become ssmcc ops; norms fuse into ssmcc ops where the target runs them.
    "default": [
        canonicalize,
        detect_causal_conv1d,
        detect_selective_scan,
        fuse_scan_norm_mlp,
        eliminate_dead_code,
    ],
    # The same without fusion: to compare fused and unfused programs, or to step around a fusion.
    "unfused": [canonicalize, detect_causal_conv1d, detect_selective_scan, eliminate_dead_code],
    # Capture output unchanged (for inspecting what torch.export produced).
    "none": [],
}


def pipeline(name: str) -> list[PassFn]:
    if name not in PIPELINES:
        raise SSMCCError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}")
    return list(PIPELINES[name])
