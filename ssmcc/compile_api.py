"""``ssmcc.compile``: capture -> passes -> lowering, for one target."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.export import ExportedProgram

from ssmcc.capture.export import capture_with_report, is_hf_model, vocab_size_of
from ssmcc.capture.report import ssmcc_op_counts
from ssmcc.compiled import CompiledModel, CompileReport
from ssmcc.dynamic_length import relax_static_length
from ssmcc.errors import InputError
from ssmcc.lowering import PLANNED_BACKENDS, TARGETS
from ssmcc.onnx_target import compile_to_onnx, keep_workdir_until_collected
from ssmcc.passes import PassContext, pipeline, run_passes, verify_program
from ssmcc.passes.chunk_state_passing import DEFAULT_CHUNK_SIZE, check_chunk_size
from ssmcc.runners import TorchRunner

DEFAULT_EXAMPLE_LENGTH = 16
COMPILE_TARGETS = tuple(TARGETS)


def static_sequence_length(program) -> int | None:
    """The length of ``input_ids`` when the program fixes it (a capture with routing off)."""
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == "input_ids":
            length = node.meta["val"].shape[1]
            return length if isinstance(length, int) else None
    return None


def scan_findings(diagnostics: dict[str, list[str]]) -> list[str]:
    """What looked like a selective scan but was not rewritten, and why (for the report)."""
    prefix = "detect_selective_scan."
    return [
        f"{rule[len(prefix) :]}: {reason}"
        for rule, reasons in diagnostics.items()
        if rule.startswith(prefix)
        for reason in reasons
    ]


def default_example_ids(vocab_size: int, length: int = DEFAULT_EXAMPLE_LENGTH) -> torch.Tensor:
    """Example token ids (2, length) for tracing; only their shape and dtype matter."""
    return (torch.arange(2 * length).reshape(2, length) * 7919) % vocab_size


def compile(
    model: nn.Module | ExportedProgram,
    target: str = "torch",
    example_inputs=None,
    *,
    pipeline_name: str = "default",
    verify: bool = False,
    kernels: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    route: bool = True,
) -> CompiledModel:
    """Compile ``model`` for ``target``.

    ``model``: an ``nn.Module``, or a program the caller exported with ``torch.export`` (taken
    as it is: no capture, no routing; the passes, ``detect_selective_scan`` included, run on it).
    ``example_inputs``: for a Hugging Face causal LM, optional token ids (batch, length) used only
    for tracing (default: 2 x 16 ids); for any other module, required, as for ``torch.export``.
    ``verify``: run the IR verifier after every pass (always run once at the end).
    ``kernels``: ``"auto"`` uses ssmcc's C++ kernels (torch ops; ONNX Runtime custom ops) when they
    can be built here; ``"reference"`` runs the pure-PyTorch references / portable ONNX bodies.
    ``chunk_size``: tokens per chunk when ``prefill``/``generate`` run a prompt (pass
    ``chunk_state_passing``); also the granularity of prefix caching.
    ``route``: capture known SSM layers (Hugging Face Mamba, FalconMamba) as ssmcc ops. With
    ``route=False`` the model's own code is exported (a Python loop over time: at the example's
    length) and the passes ``detect_causal_conv1d`` and ``detect_selective_scan`` rewrite what
    they recognise; if nothing else used the captured length the program is re-exported with a
    dynamic length (and streams like a routed one), else it runs at that length only, without
    prefill/step/generate (the report's notes say which, and why).
    """
    check_chunk_size(chunk_size)
    if kernels not in ("auto", "reference"):
        raise InputError(f"kernels must be 'auto' or 'reference', got {kernels!r}")
    if target not in COMPILE_TARGETS:
        available = ", ".join(COMPILE_TARGETS)
        if target in PLANNED_BACKENDS:
            raise InputError(
                f"target {target!r} is not available in this version ({PLANNED_BACKENDS[target]}); "
                f"available: {available}"
            )
        raise InputError(f"unknown target {target!r}; available: {available}")
    started = time.perf_counter()
    token_model = is_hf_model(model)
    vocab_size = vocab_size_of(model) if token_model else None
    if example_inputs is None and not isinstance(model, ExportedProgram):
        if not token_model or vocab_size is None:
            raise InputError(
                f"{type(model).__name__} is not a Hugging Face language model: pass "
                "example_inputs (a tuple of example tensors, as for torch.export)"
            )
        example_inputs = (default_example_ids(vocab_size),)
    captured, capture_report = capture_with_report(model, example_inputs, dynamic=True, route=route)
    ctx = PassContext(verify=verify)
    program, pipeline_report = run_passes(captured, pipeline(pipeline_name), ctx)
    static_length = static_sequence_length(program) if token_model else None
    if static_length is not None:
        relaxed, why = relax_static_length(program, static_length, vocab_size)
        if relaxed is None:
            capture_report.notes.append(f"length stays static at {static_length} tokens: {why}")
        else:
            program, again = run_passes(relaxed, pipeline(pipeline_name), ctx)
            pipeline_report.records += again.records
            capture_report.notes.append(
                f"length made dynamic: only the scans and convolutions the passes replaced "
                f"used the captured length ({static_length})"
            )
            static_length = None
    verify_program(program, after=f"pipeline {pipeline_name}")
    manifest = artifact_dir = workdir = None
    if target == "onnx":
        extra = {
            "model": capture_report.model,
            "vocab_size": vocab_size,
            "ssmcc_ops": ssmcc_op_counts(program),
            "static_length": static_length,
        }
        runner, manifest, artifact_dir, workdir = compile_to_onnx(program, extra, kernels)
    else:
        runner = TorchRunner(program, kernels)
    report = CompileReport(
        target=target,
        capture=capture_report,
        pipeline=pipeline_name,
        passes_run=pipeline_report.passes_run,
        rule_hits=pipeline_report.rule_hits,
        node_count=len(program.graph.nodes),
        op_counts=ssmcc_op_counts(program),
        compile_seconds=round(time.perf_counter() - started, 3),
        findings=scan_findings(ctx.diagnostics),
    )
    compiled = CompiledModel(
        runner,
        target,
        vocab_size,
        token_model,
        program=program,
        report=report,
        manifest=manifest,
        artifact_dir=artifact_dir,
        chunk_size=chunk_size,
        static_length=static_length,
    )
    if workdir is not None:
        keep_workdir_until_collected(compiled, workdir)
    return compiled
