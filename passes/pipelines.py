"""The pass pipelines, as explicit ordered lists. The only place pass order is decided.

- ``PIPELINES``: what ``compile`` runs on a captured program, by the name the user chose;
- ``derivation``: how each stateful program of a token model (``ProgramSet``) is made from the
  compiled one: its state pass, then the same pipeline the user chose, with the same
  ``PassContext`` (the target's gates included), so a program derived for ``pipeline="none"``
  holds no fused op and one derived for a target holds only ops that target runs;
- ``QUANTIZATION``: what ``compile(quantize=...)`` runs after the pipeline;
- ``DYNAMO_REWRITES``: the graph rewrites (``pass_base.GraphRewrite``) the Dynamo backend runs on
  each functional ATen graph ``torch.compile`` hands it, in place.

Nothing outside this module and ``manager.py`` builds a pass list or calls a pass
(``tests/test_layout.py`` holds every module to it).
"""

from __future__ import annotations

from ssmcc.errors import SSMCCError
from ssmcc.passes.canonicalize import canonicalize
from ssmcc.passes.chunk_state_passing import chunk_state_passing
from ssmcc.passes.detect_causal_conv1d import detect_causal_conv1d, rewrite_causal_conv1d
from ssmcc.passes.detect_selective_scan import detect_selective_scan, rewrite_scans
from ssmcc.passes.eliminate_dead_code import eliminate_dead_code
from ssmcc.passes.fold_batched_matmul import fold_batched_matmuls
from ssmcc.passes.fuse_scan_norm_mlp import fuse_scan_norm_mlp
from ssmcc.passes.pass_base import GraphRewrite, PassFn
from ssmcc.passes.quantize_weights import quantize_weights
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


# After the pipeline, when the user asks for quantized weights (its options: the scheme).
QUANTIZATION: list[PassFn] = [quantize_weights]

# torch.compile's graphs: AOT autograd's batched matmuls folded back first (the readouts as the
# detection rules read them), then the convolutions and the scans.
DYNAMO_REWRITES: list[GraphRewrite] = [fold_batched_matmuls, rewrite_causal_conv1d, rewrite_scans]


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


def quantization() -> list[PassFn]:
    return list(QUANTIZATION)


def dynamo_rewrites() -> list[GraphRewrite]:
    return list(DYNAMO_REWRITES)
