"""The stateful programs of a compiled model: prefill with state in/out, the chunk program
(prefill returning only the last position's logits) and the decode step."""

from __future__ import annotations

import dataclasses

from torch.export import ExportedProgram

from ssmcc.errors import SSMCCError
from ssmcc.passes import PassContext, pipeline, run_passes
from ssmcc.passes.chunk_state_passing import chunk_state_passing
from ssmcc.passes.scan_to_recurrent_step import (
    expose_recurrent_state,
    scan_to_recurrent_step,
    state_specs,
)
from ssmcc.state import spec_dicts


@dataclasses.dataclass
class StatefulPrograms:
    prefill: ExportedProgram  # (input_ids (b, l), *states) -> (logits (b, l, v), *states)
    chunk: ExportedProgram  # (input_ids (b, c), *states) -> (last logits (b, v), *states)
    step: ExportedProgram  # (input_ids (b, 1), *states) -> (logits (b, v), *states)
    specs: list[dict]


def derive_stateful_programs(program: ExportedProgram, verify: bool = False) -> StatefulPrograms:
    specs = state_specs(program)
    if not specs:
        raise SSMCCError(
            "this program has no SSM layer, so it has no recurrent state: prefill, "
            "step and generate need one"
        )
    ctx = PassContext(verify=verify)
    prefill, _ = run_passes(program, [expose_recurrent_state, *pipeline("default")], ctx)
    chunk, _ = run_passes(prefill, [chunk_state_passing, *pipeline("default")], ctx)
    step, _ = run_passes(program, [scan_to_recurrent_step, *pipeline("default")], ctx)
    return StatefulPrograms(prefill, chunk, step, spec_dicts(specs))
