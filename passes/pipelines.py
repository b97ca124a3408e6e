"""The pass pipelines, as explicit ordered lists. The only place pass order is decided.

- ``PIPELINES``: what ``compile`` runs on a captured program, by the name the user chose;
- ``derivation``: how each stateful program of a token model (``ProgramSet``) is made from the
  compiled one: its state pass, then the same pipeline the user chose, with the same
  ``PassContext`` (the target's gates included), so a program derived for ``pipeline="none"``
  holds no fused op and one derived for a target holds only ops that target runs.
"""

from __future__ import annotations

from ssmcc.errors import SSMCCError
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.chunk_state_passing import chunk_state_passing
from ssmcc.passes.detect_causal_conv1d import detect_causal_conv1d
from ssmcc.passes.detect_selective_scan import detect_selective_scan
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp
from ssmcc.passes.pass_base import PassFn
from ssmcc.passes.scan_to_recurrent_step import expose_recurrent_state, scan_to_recurrent_step

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

# The stateful programs, in the order they are derived: (program it is derived from, state pass).
DERIVATIONS: dict[str, tuple[str, PassFn]] = {
    "prefill": ("forward", expose_recurrent_state),  # states as inputs and outputs
    "chunk": ("prefill", chunk_state_passing),  # the last position's logits only
    "step": ("forward", scan_to_recurrent_step),  # one token, each stateful op's step
}


def pipeline(name: str) -> list[PassFn]:
    if name not in PIPELINES:
        raise SSMCCError(f"unknown pipeline {name!r}; known: {', '.join(PIPELINES)}")
    return list(PIPELINES[name])


def derivation(graph: str, pipeline_name: str) -> tuple[str, list[PassFn]]:
    """``(source, passes)``: stateful program ``graph`` is ``passes`` run on program ``source``
    (``forward`` or an earlier derived one): its state pass, then pipeline ``pipeline_name``."""
    if graph not in DERIVATIONS:
        raise SSMCCError(f"no derivation of a {graph!r} program; known: {', '.join(DERIVATIONS)}")
    source, state_pass = DERIVATIONS[graph]
    return source, [state_pass, *pipeline(pipeline_name)]
