"""``CompileReport``: what capture, the passes and the target did for one ``compile``."""

from __future__ import annotations

import dataclasses
import json

from ssmcc.frontend.report import CaptureReport


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
    findings: list[str] = dataclasses.field(default_factory=list)  # scans not rewritten, and why
    streaming: str = "yes"  # "yes", or why prefill/step/generate are unavailable
    not_fused: list[str] = dataclasses.field(default_factory=list)  # fusion near misses, and why
    # quantize=: scheme, weights stored small, bytes before/after, weights kept (and why),
    # accuracy vs the float program (quantization_report.quantization_accuracy)
    quantization: dict | None = None

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
            f"streaming:      {self.streaming.splitlines()[0]}",
            *[f"  {line}" for line in self.streaming.splitlines()[1:]],
            f"time:           capture {cap.capture_seconds:.2f}s, "
            f"total {self.compile_seconds:.2f}s",
        ]
        lines += [f"note:           {note}" for note in cap.notes]
        if self.findings:
            lines.append(f"not rewritten:  {len(self.findings)} scan-like structure(s)")
            lines += [f"  {finding}" for finding in self.findings]
        if self.quantization:
            lines += _quantization_lines(self.quantization)
        if self.not_fused:
            lines.append(f"not fused:      {len(self.not_fused)} norm-like chain(s)")
            lines += [f"  {line}" for line in self.not_fused]
        return "\n".join(lines)


def _quantization_lines(q: dict) -> list[str]:
    mb = 1 << 20
    lines = [
        f"quantized:      {q['scheme']}: {q['weights']} weights, "
        f"{q['bytes_before'] / mb:.1f} MiB -> {q['bytes_after'] / mb:.1f} MiB"
    ]
    accuracy = q.get("accuracy")
    if accuracy:
        lines.append(
            f"  vs float:     logit cosine min {accuracy['logit_cosine_min']:.5f} mean "
            f"{accuracy['logit_cosine_mean']:.5f}, top-1 agreement "
            f"{100 * accuracy['top1_agreement']:.1f}% ({accuracy['positions']} positions of "
            f"{accuracy['prompts']} prompts)"
        )
    lines += [f"  kept:         {line}" for line in q.get("kept", [])]
    lines += [f"  note:         {line}" for line in q.get("notes", [])]
    return lines
