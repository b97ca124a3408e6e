"""The public API: ``compile`` (capture -> passes -> a target's lowering) and ``load`` (an
artifact back into a ``CompiledModel``). Both read the target registry and the options module;
neither knows any target by name."""

from __future__ import annotations

import time

import torch
from torch import nn
from torch.export import ExportedProgram

from ssmcc.errors import ArtifactError, InputError, OptionError
from ssmcc.frontend.dtypes import model_in_dtype
from ssmcc.frontend.dynamic_length import (
    relax_static_dims,
    relax_static_length,
    static_input_dims,
    takes_flat_tensors,
)
from ssmcc.frontend.export import (
    capture_with_report,
    describe_input_dims,
    is_hf_model,
    vocab_size_of,
)
from ssmcc.frontend.report import ssmcc_op_counts
from ssmcc.lowering.registry import get_target, target_names, targets
from ssmcc.options import COMPILE, DEFAULT_CHUNK_SIZE, DEFAULT_TARGET, LOAD, resolve_options
from ssmcc.passes import PassContext, run_passes, verify_program
from ssmcc.passes.pipelines import PIPELINES, pipeline, quantization
from ssmcc.passes.program_set import ProgramSet
from ssmcc.progress import phase
from ssmcc.runtime.artifact import read_artifact
from ssmcc.runtime.compiled import CompiledModel
from ssmcc.runtime.input_dims import check_input_dims_entry, input_dims
from ssmcc.runtime.quantization_report import (
    fixed_prompts,
    quantization_accuracy,
    reference_logits,
)
from ssmcc.runtime.report import CompileReport
from ssmcc.runtime.text import check_tokenizer_fits, tokenizer_of

DEFAULT_EXAMPLE_LENGTH = 16


def static_sequence_length(program) -> int | None:
    """The length of ``input_ids`` when the program fixes it (a capture with routing off)."""
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == "input_ids":
            length = node.meta["val"].shape[1]
            return length if isinstance(length, int) else None
    return None


def pass_findings(diagnostics: dict[str, list[str]], name: str) -> list[str]:
    """What pass ``name``'s rules looked at but did not rewrite, and why (for the report)."""
    prefix = f"{name}."
    return [
        f"{rule[len(prefix) :]}: {reason}"
        for rule, reasons in diagnostics.items()
        if rule.startswith(prefix)
        for reason in reasons
    ]


def default_example_ids(vocab_size: int, length: int = DEFAULT_EXAMPLE_LENGTH) -> torch.Tensor:
    """Example token ids (2, length) for tracing; only their shape and dtype matter."""
    return (torch.arange(2 * length).reshape(2, length) * 7919) % vocab_size


def compile_options(target: str, stage: str, values: dict):
    """The validated ``Options`` of a compile or load for ``target``."""
    return resolve_options(
        get_target(target),
        stage,
        values,
        known_targets=targets,
        choices={"pipeline": tuple(PIPELINES)},
    )


def _weight_bytes(program) -> int:
    tensors = {**program.state_dict, **program.constants}
    return sum(t.nbytes for t in tensors.values() if isinstance(t, torch.Tensor))


def quantize_program(program, scheme: str, ctx: PassContext, accuracy_inputs: tuple):
    """``quantize_weights`` over the pipeline's program, and what it did: the scheme, weights
    stored small, bytes before/after, weights kept and why, and the accuracy against the float
    program on ``accuracy_inputs`` (``quantization_report``); and the pass's records."""
    ctx.options["quantize_weights"] = {"scheme": scheme}
    # The float run first: a memory-mapped checkpoint is then read (and given back) layer by
    # layer, and quantize_weights gives each weight back once converted, so the float weights
    # and their small copies are never all resident together.
    expected = reference_logits(program, accuracy_inputs)
    quantized, report = run_passes(program, quantization(), ctx)
    verify_program(quantized, after="quantize_weights")
    hits = report.records[0].stats
    return (
        quantized,
        {
            "scheme": scheme,
            "weights": sum(hits.get(k, 0) for k in ("linear", "embedding", "experts", "mixer"))
            - hits.get("tied", 0),
            "bytes_before": _weight_bytes(program),
            "bytes_after": _weight_bytes(quantized),
            "kept": list(ctx.diagnostics.get("quantize_weights", [])),
            "notes": list(ctx.diagnostics.get("quantize_weights_notes", [])),
            "accuracy": quantization_accuracy(expected, quantized, accuracy_inputs),
        },
        report.records,
    )


def _unsupported_ops(target: str) -> dict[str, str]:
    """The ops ``target`` cannot run (the fusion pass fuses only into ops it runs)."""
    return get_target(target).module().unsupported_ops()


def _relax_static_dims(program, token_model, vocab_size, ctx, capture_report, pipeline_report):
    """``(program, static length of a token model or None)``: the dims torch.export fixed at
    capture made symbolic where, after the passes, nothing else uses them
    (``frontend/dynamic_length.py``; the pipeline runs again on the re-exported program). The
    capture report's notes say what was made dynamic and what stays static, and why; its input
    dims describe the program as compiled."""
    axis_names = {"input_ids": ("batch", "seq")} if token_model else None
    static_length = static_sequence_length(program) if token_model else None
    relaxed = None
    if static_length is not None:
        relaxed, why = relax_static_length(program, static_length, vocab_size)
        if relaxed is None:
            capture_report.notes.append(f"length stays static at {static_length} tokens: {why}")
        else:
            capture_report.notes.append(
                f"length made dynamic: only the scans and convolutions the passes replaced "
                f"used the captured length ({static_length})"
            )
            static_length = None
    elif not token_model and takes_flat_tensors(program) and static_input_dims(program):
        candidate, made, kept = relax_static_dims(program)
        if made:
            relaxed = candidate
            capture_report.notes.append(
                f"made dynamic: {'; '.join(made)}: only ops the passes replaced used those sizes"
            )
        if kept:
            capture_report.notes.append(f"static (calls must have these sizes): {'; '.join(kept)}")
    if relaxed is not None:
        phase("re-exported with dynamic dims; running the passes again")
        ctx.diagnostics.clear()  # the near misses the report lists are the final run's
        program, again = run_passes(relaxed, pipeline(ctx.pipeline), ctx)
        pipeline_report.records += again.records
    capture_report.dynamic_dims = describe_input_dims(program, axis_names)
    return program, static_length


def compile(
    model: nn.Module | ExportedProgram,
    target: str = DEFAULT_TARGET,
    example_inputs=None,
    *,
    tokenizer="auto",
    **options,
) -> CompiledModel:
    """Compile ``model`` for ``target`` (``ssmcc coverage`` lists the targets).

    ``model``: an ``nn.Module``, or a program the caller exported with ``torch.export`` (taken
    as it is: no capture, no routing; the passes, ``detect_selective_scan`` included, run on it).
    ``example_inputs``: for a Hugging Face causal LM, optional token ids (batch, length) used only
    for tracing (default: 2 x 16 ids); for any other module, required, as for ``torch.export``.

    Options (``ssmcc.options`` defines and checks them; a target may add its own):
    ``kernels`` ("auto": ssmcc's native kernels where they build here; "reference": the
    op library's PyTorch references / portable ONNX bodies), ``chunk_size`` (prompt tokens per
    prefill chunk; also the granularity of prefix caching), ``route`` (capture known SSM layers
    as ssmcc ops; with ``route=False`` the model's own code is exported, a Python loop over time
    at the example's length, and the passes rewrite what they recognise; if nothing else used
    the captured length the program is re-exported with a dynamic length, else it runs at that
    length only, without prefill/step/generate -- the report says which, and why),
    ``pipeline`` ("default"; "unfused": the same without ``fuse_scan_norm_mlp``; "none": the raw
    capture), ``verify`` (the IR verifier after every
    pass; it always runs once at the end), ``dtype`` (the compute dtype, e.g. ``torch.bfloat16``:
    the model is captured from a copy in that dtype; the ssmcc ops compute in float32 inside and
    return the model's dtype, their states keep the dtype their contracts name) and ``quantize``
    (as the target implements).

    ``tokenizer``: a Hugging Face tokenizer (or the folder it was saved in) kept with the compiled
    model and in its artifact, for text in and out (``generate("text")``, ``ssmcc run
    --prompt``); "auto" (default): the one saved beside the checkpoint the model was loaded from,
    if any; None: none.
    """
    opts = compile_options(target, COMPILE, options)
    kept_tokenizer = tokenizer_of(model, tokenizer)
    if opts.dtype is not None:
        if isinstance(model, ExportedProgram):
            raise OptionError(
                "dtype applies to a module, which ssmcc captures in that dtype; an "
                "ExportedProgram is taken as it was exported: cast the module before exporting"
            )
        model = model_in_dtype(model, opts.dtype)
    started = time.perf_counter()
    token_model = is_hf_model(model)
    vocab_size = vocab_size_of(model) if token_model else None
    check_tokenizer_fits(kept_tokenizer, vocab_size)
    if example_inputs is None and not isinstance(model, ExportedProgram):
        if not token_model or vocab_size is None:
            raise InputError(
                f"{type(model).__name__} is not a Hugging Face language model: pass "
                "example_inputs (a tuple of example tensors, as for torch.export)"
            )
        example_inputs = (default_example_ids(vocab_size),)
    if isinstance(model, ExportedProgram):
        phase("taking the exported program as it is (no capture, no routing)")
    else:
        how = "SSM layers routed to ssmcc ops" if opts.route else "routing off"
        phase(f"capturing {type(model).__name__} with torch.export ({how})")
    captured, capture_report = capture_with_report(
        model, example_inputs, dynamic=True, route=opts.route
    )
    phase(f"running pass pipeline {opts.pipeline!r} ({len(captured.graph.nodes)} nodes)")
    ctx = PassContext(
        verify=opts.verify,
        pipeline=opts.pipeline,
        options={"fuse_scan_norm_mlp": {"unsupported": _unsupported_ops(opts.target)}},
    )
    program, pipeline_report = run_passes(captured, pipeline(opts.pipeline), ctx)
    program, static_length = _relax_static_dims(
        program, token_model, vocab_size, ctx, capture_report, pipeline_report
    )
    verify_program(program, after=f"pipeline {opts.pipeline}")
    quantization = None
    if opts.quantize != "none":
        phase(f"quantizing weights ({opts.quantize}) and measuring the accuracy against float")
        accuracy_inputs = (fixed_prompts(vocab_size),) if token_model else tuple(example_inputs)
        program, quantization, records = quantize_program(
            program, opts.quantize, ctx, accuracy_inputs
        )
        pipeline_report.records += records
    programs = ProgramSet(
        program, token_model=token_model, static_length=static_length, context=ctx
    )
    phase(f"lowering to target {opts.target} ({len(program.graph.nodes)} nodes)")
    executable = get_target(opts.target).module().lower(programs, opts)
    info = {
        "model": capture_report.model,
        "vocab_size": vocab_size,
        "ssmcc_ops": ssmcc_op_counts(program),
        "static_length": static_length,
        "input_dims": None if token_model else input_dims(program),
        "streaming_refusal": programs.refusal,
        "quantization": quantization,
    }
    report = CompileReport(
        target=opts.target,
        capture=capture_report,
        pipeline=opts.pipeline,
        passes_run=pipeline_report.passes_run,
        rule_hits=pipeline_report.rule_hits,
        node_count=len(program.graph.nodes),
        op_counts=info["ssmcc_ops"],
        compile_seconds=round(time.perf_counter() - started, 3),
        findings=pass_findings(ctx.diagnostics, "detect_selective_scan"),
        not_fused=pass_findings(ctx.diagnostics, "fuse_scan_norm_mlp"),
        streaming="yes" if programs.refusal is None else f"no: {programs.refusal}",
        quantization=quantization,
    )
    return CompiledModel(
        executable, opts, info, program=program, report=report, tokenizer=kept_tokenizer
    )


def load(artifact_dir: str, verify: bool = True, **options) -> CompiledModel:
    """Open an artifact written by ``CompiledModel.save`` / ``ssmcc compile``.

    Every file the manifest lists is read once, into memory the file cannot change, and checked
    (``verify``: its SHA-256 too) as it is read; the model computes with those bytes whatever
    happens to the directory afterwards. Options: ``kernels`` ("auto":
    ssmcc's native kernels where they build here; "reference": the reference / portable path),
    ``chunk_size`` (default: the one the model was compiled with), and the target's own (e.g.
    the ONNX target's ``threads``).
    """
    manifest, files = read_artifact(artifact_dir, verify_hashes=verify)
    if manifest["target"] not in target_names():
        raise ArtifactError(
            f"{artifact_dir}: target {manifest['target']!r} cannot be loaded by this ssmcc "
            f"(loadable targets: {', '.join(target_names())})"
        )
    options.setdefault("chunk_size", manifest.get("chunk_size", DEFAULT_CHUNK_SIZE))
    try:
        opts = compile_options(manifest["target"], LOAD, options)
    except OptionError as error:
        raise OptionError(f"ssmcc.load({artifact_dir!r}): {error}") from error
    executable = get_target(opts.target).module().load(files, manifest, opts)
    info = {
        key: manifest.get(key)
        for key in ("model", "vocab_size", "ssmcc_ops", "static_length", "streaming_refusal")
    }
    info["input_dims"] = check_input_dims_entry(manifest.get("input_dims"), artifact_dir)
    return CompiledModel(
        executable, opts, info, manifest=manifest, artifact_dir=artifact_dir, files=files
    )
