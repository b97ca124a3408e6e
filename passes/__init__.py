"""Graph passes over the ssmcc IR (an ExportedProgram of ATen + ssmcc ops).

A pass is ``(program, ctx) -> PassResult``; pipelines are explicit lists in ``pipelines.py``;
``run_passes`` runs them with the verifier; ``format_program`` prints a program stably.
See README.md in this folder for the invariants every pass keeps.
"""

from ssmcc.passes.manager import PassRecord, PipelineReport, run_passes
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.pipelines import PIPELINES, pipeline
from ssmcc.passes.printer import format_program, op_histogram
from ssmcc.passes.verifier import verification_errors, verify_program

__all__ = [
    "PIPELINES",
    "PassContext",
    "PassRecord",
    "PassResult",
    "PipelineReport",
    "format_program",
    "op_histogram",
    "pipeline",
    "run_passes",
    "verification_errors",
    "verify_program",
]
