"""``CompiledModel``: what ``ssmcc.compile`` returns, and its report."""

from __future__ import annotations

import dataclasses
import json

import torch
from torch import nn
from torch.export import ExportedProgram

from ssmcc.capture.inputs import check_token_ids
from ssmcc.capture.report import CaptureReport


@dataclasses.dataclass
class CompileReport:
    target: str
    capture: CaptureReport
    pipeline: str
    passes_run: list[str]
    rule_hits: dict[str, int]
    node_count: int
    op_counts: dict[str, int]
    compile_seconds: float

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def format(self) -> str:
        """Human-readable summary, as ``ssmcc inspect`` prints it."""
        cap = self.capture
        lines = [
            f"model:          {cap.model}",
            f"routes:         {', '.join(cap.routes) or 'none'}",
            f"SSM layers:     {len(cap.ssm_layers)}",
        ]
        lines += [f"  {layer}" for layer in cap.ssm_layers]
        dims = "; ".join(f"{name}: ({', '.join(d)})" for name, d in cap.dynamic_dims.items())
        lines += [
            f"inputs:         {dims}",
            f"graph nodes:    {cap.node_count} captured -> {self.node_count} after passes",
            "ssmcc ops:      "
            + (", ".join(f"{op} x{n}" for op, n in self.op_counts.items()) or "none"),
            f"pipeline:       {self.pipeline} ({', '.join(self.passes_run) or 'no passes'})",
            "rule hits:      "
            + (", ".join(f"{rule} {n}" for rule, n in self.rule_hits.items()) or "none"),
            f"target:         {self.target}",
            f"time:           capture {cap.capture_seconds:.2f}s, "
            f"total {self.compile_seconds:.2f}s",
        ]
        lines += [f"note:           {note}" for note in cap.notes]
        return "\n".join(lines)


class CompiledModel:
    """A model compiled by ssmcc for one target.

    Call it like the model: ``compiled(input_ids) -> logits`` for a Hugging Face causal LM (ids are
    checked before anything runs), or ``compiled(*example-like inputs)`` for a captured module.
    ``program`` is the IR after passes; ``report`` says what capture and the passes did.
    """

    def __init__(
        self,
        program: ExportedProgram,
        runner: nn.Module,
        report: CompileReport,
        vocab_size: int | None,
        token_model: bool,
    ):
        self.program = program
        self.report = report
        self.target = report.target
        self.vocab_size = vocab_size
        self._runner = runner
        self._token_model = token_model

    @torch.inference_mode()
    def __call__(self, *args):
        if self._token_model:
            if len(args) != 1:
                raise TypeError("call a compiled language model with one argument: input_ids")
            return self._runner(check_token_ids(args[0], self.vocab_size))
        return self._runner(*args)

    def __repr__(self) -> str:
        return (
            f"CompiledModel(model={self.report.capture.model}, target={self.target}, "
            f"nodes={self.report.node_count}, ops={self.report.op_counts})"
        )
