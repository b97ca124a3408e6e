"""``CompiledModel``: what ``ssmcc.compile`` returns, and its report."""

from __future__ import annotations

import dataclasses
import json

import torch
from torch.export import ExportedProgram

from ssmcc.capture.inputs import check_token_ids
from ssmcc.capture.report import CaptureReport
from ssmcc.errors import SSMCCError


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

    Call it like the model: ``compiled(input_ids) -> logits`` for a language model (ids are
    checked before anything runs), or ``compiled(*example-like inputs)`` for a captured module.
    ``program`` is the IR after passes and ``report`` says what capture and the passes did (both
    None for a model opened with ``ssmcc.load``); ``manifest`` describes a saved artifact (ONNX).
    """

    def __init__(
        self,
        runner,
        target: str,
        vocab_size: int | None,
        token_model: bool,
        program: ExportedProgram | None = None,
        report: CompileReport | None = None,
        manifest: dict | None = None,
        artifact_dir: str | None = None,
    ):
        self.program = program
        self.report = report
        self.manifest = manifest
        self.target = target
        self.vocab_size = vocab_size
        self.artifact_dir = artifact_dir
        self._runner = runner
        self._token_model = token_model

    @classmethod
    def from_artifact(cls, runner, manifest: dict, artifact_dir: str) -> CompiledModel:
        return cls(
            runner,
            manifest["target"],
            manifest.get("vocab_size"),
            manifest.get("vocab_size") is not None,
            manifest=manifest,
            artifact_dir=artifact_dir,
        )

    @torch.inference_mode()
    def __call__(self, *args):
        if self._token_model:
            if len(args) != 1:
                raise TypeError("call a compiled language model with one argument: input_ids")
            return self._runner(check_token_ids(args[0], self.vocab_size))
        return self._runner(*args)

    def save(self, out_dir: str, overwrite: bool = False) -> None:
        """Write the artifact directory (model files + manifest.json), atomically."""
        if self.artifact_dir is None:
            raise SSMCCError(
                f"target {self.target!r} has no saved form yet; compile with target='onnx' "
                "to get a deployable artifact"
            )
        from ssmcc.onnx_target import copy_artifact

        copy_artifact(self.artifact_dir, out_dir, overwrite)

    def __repr__(self) -> str:
        if self.report is None:
            return f"CompiledModel(target={self.target}, artifact={self.artifact_dir})"
        return (
            f"CompiledModel(model={self.report.capture.model}, target={self.target}, "
            f"nodes={self.report.node_count}, ops={self.report.op_counts})"
        )
