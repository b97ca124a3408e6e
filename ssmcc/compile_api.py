"""``ssmcc.compile``: capture -> passes -> lowering, for one target."""

from __future__ import annotations

import time

import torch
from torch import nn

from ssmcc.capture.export import capture_with_report, is_hf_model, vocab_size_of
from ssmcc.capture.report import ssmcc_op_counts
from ssmcc.compiled import CompiledModel, CompileReport
from ssmcc.errors import InputError
from ssmcc.lowering import PLANNED_BACKENDS, TARGETS
from ssmcc.onnx_target import compile_to_onnx, keep_workdir_until_collected
from ssmcc.passes import PassContext, pipeline, run_passes, verify_program
from ssmcc.passes.chunk_state_passing import DEFAULT_CHUNK_SIZE, check_chunk_size
from ssmcc.runners import TorchRunner

DEFAULT_EXAMPLE_LENGTH = 16
COMPILE_TARGETS = tuple(TARGETS)


def default_example_ids(vocab_size: int, length: int = DEFAULT_EXAMPLE_LENGTH) -> torch.Tensor:
    """Example token ids (2, length) for tracing; only their shape and dtype matter."""
    return (torch.arange(2 * length).reshape(2, length) * 7919) % vocab_size


def compile(
    model: nn.Module,
    target: str = "torch",
    example_inputs=None,
    *,
    pipeline_name: str = "default",
    verify: bool = False,
    kernels: str = "auto",
    chunk_size: int = DEFAULT_CHUNK_SIZE,
) -> CompiledModel:
    """Compile ``model`` for ``target``.

    ``example_inputs``: for a Hugging Face causal LM, optional token ids (batch, length) used only
    for tracing (default: 2 x 16 ids); for any other module, required, as for ``torch.export``.
    ``verify``: run the IR verifier after every pass (always run once at the end).
    ``kernels``: ``"auto"`` uses ssmcc's C++ kernels (torch ops; ONNX Runtime custom ops) when they
    can be built here; ``"reference"`` runs the pure-PyTorch references / portable ONNX bodies.
    ``chunk_size``: tokens per chunk when ``prefill``/``generate`` run a prompt (pass
    ``chunk_state_passing``); also the granularity of prefix caching.
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
    if example_inputs is None:
        if not token_model or vocab_size is None:
            raise InputError(
                f"{type(model).__name__} is not a Hugging Face language model: pass "
                "example_inputs (a tuple of example tensors, as for torch.export)"
            )
        example_inputs = (default_example_ids(vocab_size),)
    captured, capture_report = capture_with_report(model, example_inputs, dynamic=True)
    program, pipeline_report = run_passes(
        captured, pipeline(pipeline_name), PassContext(verify=verify)
    )
    verify_program(program, after=f"pipeline {pipeline_name}")
    manifest = artifact_dir = workdir = None
    if target == "onnx":
        extra = {
            "model": type(model).__name__,
            "vocab_size": vocab_size,
            "ssmcc_ops": ssmcc_op_counts(program),
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
    )
    if workdir is not None:
        keep_workdir_until_collected(compiled, workdir)
    return compiled
