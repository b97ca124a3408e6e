"""The ``ssmcc`` command line.

    ssmcc inspect MODEL|FILE.pt2 capture MODEL (or read a saved torch.export program), run the
                                 passes, print the report
    ssmcc compile MODEL --target torch|onnx|triton --out DIR
                                 write a deployable artifact (model files + manifest.json)
    ssmcc run DIR|MODEL --prompt "text" | --prompt-ids 1,2,3 --max-new-tokens N
                                 generate, printing text (or token ids) as it comes
    ssmcc presets                list the built-in models
    ssmcc coverage               which backend supports which ssmcc op
    ssmcc kernels build MODEL... --arch sm_80,sm_90 --out DIR
                                 ahead-of-time PTX/cubin of the Triton kernels MODEL needs

MODEL is a local Hugging Face model directory (config.json + weights, as save_pretrained writes
it) or a preset name (a small model built from a config with random weights; nothing is
downloaded).
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from ssmcc.errors import SSMCCError


def _progress(message: str) -> None:
    """A phase line of the command itself (timed with ``-v``, like the library's)."""
    from ssmcc.progress import phase

    phase(message)


def _check_options(target: str, options: dict) -> None:
    """Refuse bad option values before any model is loaded (``compile`` checks them again)."""
    from ssmcc.api import compile_options

    compile_options(target, "compile", options)


def _cmd_inspect(args: argparse.Namespace) -> int:
    import ssmcc
    from ssmcc.api import default_example_ids
    from ssmcc.options import DEFAULT_TARGET
    from ssmcc.passes import format_program
    from ssmcc.presets import check_model_spec, load_model

    options = {
        "pipeline": args.pipeline,
        "verify": args.verify,
        "route": args.route,
        "quantize": args.quantize,
    }
    _check_options(DEFAULT_TARGET, options)
    if not args.model.endswith(".pt2"):
        check_model_spec(args.model)
    started = time.perf_counter()
    _progress(f"loading {args.model}")
    if args.model.endswith(".pt2"):
        model, example_inputs = _load_exported_program(args.model), None
        _progress("running the passes on the exported program")
    else:
        model = load_model(args.model)
        example_inputs = (default_example_ids(model.config.vocab_size, args.seq_len),)
    compiled = ssmcc.compile(model, DEFAULT_TARGET, example_inputs, **options)
    _progress(
        f"done in {time.perf_counter() - started:.1f}s (the compile itself: "
        f"{compiled.report.compile_seconds:.1f}s, the report's 'time' line)"
    )
    if args.json:
        print(compiled.report.to_json())
    else:
        print(compiled.report.format())
    if args.memory:
        _print_memory_plan(compiled, args.context, args.batch)
    if args.graph:
        print()
        print(format_program(compiled.program), end="")
    return 0


def _print_memory_plan(compiled, context: int, batch: int) -> None:
    from ssmcc.runtime.memory_plan import MemoryPlan

    if context < 1 or batch < 1:
        raise SSMCCError(f"--context and --batch must be >= 1, got {context} and {batch}")
    if compiled.info.get("streaming_refusal") is not None:
        print("memory plan:    none: this program does not stream, so it carries no state")
        return
    for line in MemoryPlan.of(compiled.state_specs, context, batch).lines():
        print(line)


def _load_exported_program(path: str):
    import os

    import torch

    if not os.path.isfile(path):
        raise SSMCCError(f"{path}: no such file (expected a program saved with torch.export.save)")
    try:
        return torch.export.load(path)
    except Exception as error:  # torch's own exception types
        raise SSMCCError(
            f"{path} could not be read by torch.export.load: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        ) from error


def _cmd_compile(args: argparse.Namespace) -> int:
    import os

    import ssmcc
    from ssmcc.api import default_example_ids
    from ssmcc.presets import check_model_spec, load_model

    if os.path.exists(args.out) and not args.overwrite:
        print(
            f"ssmcc: error: {args.out} already exists; pass --overwrite to replace it",
            file=sys.stderr,
        )
        return 1
    problem = _check_out_parent(args.out)
    if problem is not None:
        print(f"ssmcc: error: {problem}", file=sys.stderr)
        return 1
    options = {**_compile_options(args), **_target_options(args, "compile")}
    _check_options(args.target, options)
    if not args.model.endswith(".pt2"):
        check_model_spec(args.model)
    started = time.perf_counter()
    _progress(f"loading {args.model}")
    tokenizer = None
    if args.model.endswith(".pt2"):
        model, example_inputs = _load_exported_program(args.model), None
        name = "the exported program"
    else:
        model = load_model(args.model)
        example_inputs = (default_example_ids(model.config.vocab_size, args.seq_len),)
        name = type(model).__name__
        tokenizer = _tokenizer_folder(args.model)
        if tokenizer is not None:
            _progress(f"keeping the tokenizer of {args.model} in the artifact")
    _progress(f"compiling {name} for target {args.target}")
    compiled = ssmcc.compile(model, args.target, example_inputs, tokenizer=tokenizer, **options)
    for finding in compiled.report.findings:
        _progress(f"not rewritten: {finding}")
    if not compiled.report.op_counts:
        print(
            f"ssmcc: warning: {args.model} has no state-space layer ssmcc knows (no ssmcc op in "
            f"the program): it compiles as a plain torch.export program of {name}, and nothing "
            "of ssmcc's scans, fusions or state handling applies ('ssmcc presets' lists the "
            "families it compiles; 'ssmcc inspect' says what it found)",
            file=sys.stderr,
        )
    quantization = compiled.report.quantization
    if quantization:
        accuracy = quantization["accuracy"]
        _progress(
            f"quantized {quantization['scheme']}: {quantization['weights']} weights, "
            f"{quantization['bytes_before'] / 2**20:.1f} MiB -> "
            f"{quantization['bytes_after'] / 2**20:.1f} MiB; vs float on fixed prompts: logit "
            f"cosine min {accuracy['logit_cosine_min']:.5f}, top-1 agreement "
            f"{100 * accuracy['top1_agreement']:.1f}% ('ssmcc inspect --quantize' lists what "
            "was kept)"
        )
    if compiled.report.streaming != "yes":
        _progress(f"streaming {compiled.report.streaming}")
    from ssmcc.kernels.cpu.prepare import prepare_native_kernels

    prepare_native_kernels(args.target, args.kernels, _progress)  # so that run never builds
    _progress(f"writing {args.out}")
    manifest = compiled.save(args.out, overwrite=args.overwrite)
    total = sum(f["bytes"] for f in manifest["files"].values()) / 1e6
    print(f"wrote {args.out}: {', '.join(manifest['files'])} ({total:.1f} MB)")
    for name, graph in manifest["graphs"].items():
        first = graph["inputs"][0]
        print(
            f"  {name}: {graph['nodes']} nodes, ssmcc nodes {graph['ssmcc_nodes']}, "
            f"inputs {first['name']}{first['dims']}"
            + (f" + {len(graph['inputs']) - 1} state tensors" if manifest["states"] else "")
        )
    _progress(f"done in {time.perf_counter() - started:.1f}s")
    return 0


def _token_list(text: str) -> list[int]:
    entries = text.replace(" ", "").split(",")
    if entries == [""]:
        raise argparse.ArgumentTypeError("the prompt needs at least one token id")
    if "" in entries:
        raise argparse.ArgumentTypeError(
            f"empty entry in {text!r}: give token ids separated by single commas, e.g. 1,2,3"
        )
    try:
        ids = [int(x) for x in entries]
    except ValueError as error:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated token ids, got {text!r}"
        ) from error
    negative = [i for i in ids if i < 0]
    if negative:
        raise argparse.ArgumentTypeError(f"token ids are >= 0, got {negative[0]} in {text!r}")
    return ids


def _tokenizer_folder(model: str):
    """The tokenizer to keep when compiling ``model``: its folder when it holds one, else None."""
    import os

    from ssmcc.runtime.text import has_tokenizer

    return model if os.path.isdir(model) and has_tokenizer(model) else None


def _cmd_run(args: argparse.Namespace) -> int:
    import os

    import torch

    import ssmcc
    from ssmcc.errors import OptionError
    from ssmcc.options import DEFAULT_TARGET

    options = {"kernels": args.kernels}
    if args.chunk_size is not None:
        options["chunk_size"] = args.chunk_size
    artifact = os.path.isdir(args.model) and os.path.isfile(
        os.path.join(args.model, "manifest.json")
    )
    compiling = {
        name: getattr(args, name)
        for name in ("target", *_RUN_COMPILE_OPTIONS)
        if getattr(args, name, None) is not None
    }
    started = time.perf_counter()
    if artifact:
        if compiling:
            flags = ", ".join(_flag(name) for name in compiling)
            raise OptionError(
                f"{flags}: {args.model} is an artifact, compiled already; these apply when run "
                "compiles a preset or model folder first (compile the model again with "
                "'ssmcc compile' to change them)"
            )
        _progress(f"loading artifact {args.model}")
        compiled = ssmcc.load(args.model, **options, **_target_options(args, "load"))
    else:
        from ssmcc.presets import PRESETS, check_model_spec, load_model

        target = compiling.pop("target", DEFAULT_TARGET)
        _check_options(target, {**options, **compiling})
        check_model_spec(args.model)
        if args.model in PRESETS:
            _progress(f"{args.model} is a preset with random weights: its tokens mean nothing")
        _progress(f"loading {args.model} and compiling it for the {target} target")
        compiled = ssmcc.compile(
            load_model(args.model),
            target,
            tokenizer=_tokenizer_folder(args.model),
            **options,
            **compiling,
            **_target_options(args, "compile"),
        )
    sampling = dict(
        do_sample=args.temperature > 0,
        temperature=args.temperature or 1.0,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
    )
    if args.eos_id is not None:
        sampling["eos_token_id"] = args.eos_id[0] if len(args.eos_id) == 1 else args.eos_id
    if args.prompt is not None and compiled.tokenizer is None:
        raise SSMCCError(
            f"{args.model} has no tokenizer, so --prompt cannot be encoded: compile it from a "
            "model folder that holds one (tokenizer.save_pretrained beside the weights), or "
            "pass --prompt-ids"
        )
    _progress(
        f"ready in {time.perf_counter() - started:.1f}s; generating up to "
        f"{args.max_new_tokens} token(s)"
    )
    times = []  # when each token came, from the start of generation

    def count(_token) -> None:
        times.append(time.perf_counter() - begin)

    begin = time.perf_counter()
    if args.prompt is not None:
        print(args.prompt, end="", flush=True)
        for piece in compiled.stream_text(
            args.prompt, args.max_new_tokens, streamer=count, **sampling
        ):
            print(piece, end="", flush=True)
    else:
        prompt = torch.tensor([args.prompt_ids])
        for token in compiled.stream(prompt, args.max_new_tokens, **sampling):
            count(token)
            print(int(token[0]), end=" ", flush=True)
    print()
    if not times:
        _progress("no token generated")
        return 0
    first, total = times[0], time.perf_counter() - begin
    rate = (len(times) - 1) / (total - first) if len(times) > 1 and total > first else float("nan")
    _progress(
        f"{len(times)} token(s); time to first token {first * 1e3:.0f} ms, then {rate:.1f} tokens/s"
    )
    return 0


def _cmd_presets(args: argparse.Namespace) -> int:
    from ssmcc.presets import DEFAULT_PRESET, PRESETS

    for name, preset in PRESETS.items():
        marker = " (default)" if name == DEFAULT_PRESET else ""
        print(f"{name:20s} {preset.description}{marker}")
    return 0


def _cmd_coverage(args: argparse.Namespace) -> int:
    from ssmcc.lowering.registry import coverage

    rows = coverage()
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    for row in rows:
        print(f"{row['op']:24s} {row['backend']:9s} {row['status']:12s} {row['detail']}")
    return 0


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _add_option(parser, spec, default=argparse.SUPPRESS, help_suffix: str = "") -> None:
    """A flag for an ``OptionSpec``: its type, choices, default and help, from the spec."""
    kwargs = {"help": spec.help + help_suffix, "default": default}
    if spec.kind is int:
        kwargs.update(type=int, metavar=spec.metavar or "N")
    elif spec.kind is bool:  # an option on by default is turned off with --no-NAME
        kwargs.update(action="store_true" if not spec.default else argparse.BooleanOptionalAction)
    elif spec.choices is not None:
        kwargs.update(choices=list(spec.choices))
    parser.add_argument(_flag(spec.name), **kwargs)


def _add_target_options(parser, stage: str) -> None:
    """Every target's own options, each marked with its target (validated when used)."""
    from ssmcc.lowering.registry import targets

    for target in targets():
        for spec in target.options:
            if stage in spec.stages:
                _add_option(parser, spec, None, f" (target {target.name})")


def _target_options(args: argparse.Namespace, stage: str) -> dict:
    from ssmcc.lowering.registry import targets

    names = {spec.name for t in targets() for spec in t.options if stage in spec.stages}
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def _pipeline_spec():
    """The ``pipeline`` option with the pipelines' names as its choices."""
    import dataclasses

    from ssmcc.options import COMMON_OPTIONS
    from ssmcc.passes.pipelines import PIPELINES

    return dataclasses.replace(COMMON_OPTIONS["pipeline"], choices=tuple(PIPELINES))


# What the compile command says after an option's own help (its default, where it is recorded).
_COMPILE_HELP = {
    "kernels": " (default auto)",
    "chunk_size": " (default {default}; recorded in the artifact)",
    "pipeline": " (default default)",
    "dtype": " (default: as the model is; a target lists what it implements)",
    "quantize": " (default none; int8: a scale per output channel, int8-gN: per N inputs)",
    "verify": "",
}
_OWN_FLAGS = {"route": "--no-route"}  # common options the command offers under its own flag
# What ``ssmcc run MODEL`` takes for the compile it runs first (an artifact keeps its own).
_RUN_COMPILE_OPTIONS = ("dtype", "pipeline", "quantize")


def _add_compile_options(parser) -> None:
    """A flag for every common option ``compile`` takes (``ssmcc.options.COMMON_OPTIONS``): the
    command line offers what the API does."""
    from ssmcc.options import COMMON_OPTIONS, COMPILE

    for name, spec in COMMON_OPTIONS.items():
        if COMPILE not in spec.stages or name in _OWN_FLAGS:
            continue
        if name == "pipeline":
            spec = _pipeline_spec()
        suffix = _COMPILE_HELP.get(name, "").format(default=spec.default)
        _add_option(parser, spec, spec.default, suffix)


def _compile_options(args: argparse.Namespace) -> dict:
    """The common options' values from the parsed compile command."""
    from ssmcc.options import COMMON_OPTIONS, COMPILE

    return {
        name: getattr(args, name) for name, spec in COMMON_OPTIONS.items() if COMPILE in spec.stages
    }


def _check_out_parent(out: str) -> str | None:
    """Why ``out`` cannot be written (its parent folder is missing), or None."""
    import os

    parent = os.path.dirname(os.path.abspath(out))
    if os.path.isdir(parent):
        return None
    return (
        f"the folder {parent} (where {out} would go) does not exist; create it first "
        "(ssmcc compile does not create parent folders)"
    )


def build_parser() -> argparse.ArgumentParser:
    from ssmcc.lowering.registry import target_names
    from ssmcc.options import COMMON_OPTIONS as OPTIONS
    from ssmcc.options import COMPILE, DEFAULT_TARGET, LOAD

    parser = argparse.ArgumentParser(
        prog="ssmcc",
        description="ssmcc compiles state-space language models (Mamba family): torch.export "
        "capture with dynamic batch/sequence dims, graph passes, lowering to backends.",
        epilog="Example: ssmcc inspect mamba-tiny",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also show third-party warnings and log lines (torch.export, transformers), "
        "which are hidden by default, and give each [ssmcc] phase line the seconds since the "
        "first and the resident memory now and at its peak",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    commands.required = True

    inspect = commands.add_parser(
        "inspect",
        help="capture a model and print what ssmcc found",
        description="Capture MODEL with torch.export (SSM layers routed to ssmcc ops), run the "
        "pass pipeline and print the report: SSM layers, dynamic dims, node and op counts, rule "
        "hits, and every scan-like structure that was not rewritten, with where and why. MODEL "
        "is a local Hugging Face model directory, a preset (see 'ssmcc presets') or a .pt2 "
        "program saved with torch.export.save.",
    )
    inspect.add_argument(
        "model",
        metavar="MODEL",
        help="model directory, preset name, or a .pt2 file saved with torch.export.save (your "
        "own model: the passes run on it, and scans they do not rewrite are listed with why)",
    )
    inspect.add_argument(
        "--no-route",
        dest="route",
        action="store_false",
        help="capture the model's own scan code instead of routing known SSM layers to ssmcc "
        "ops (a Python loop over time is unrolled at --seq-len); detect_selective_scan then "
        "re-rolls the scans it recognises",
    )
    inspect.add_argument(
        "--seq-len",
        type=int,
        default=16,
        help="example sequence length used for tracing (default 16); the "
        "captured program runs at any length",
    )
    _add_option(inspect, _pipeline_spec(), OPTIONS["pipeline"].default, " (default default)")
    _add_option(
        inspect,
        OPTIONS["quantize"],
        OPTIONS["quantize"].default,
        " (default none; the report then gives the logit cosine and top-1 agreement vs float)",
    )
    inspect.add_argument("--graph", action="store_true", help="also print the program")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument(
        "--verify", action="store_true", help="run the IR verifier after every pass"
    )
    inspect.add_argument(
        "--memory",
        action="store_true",
        help="also print the memory plan: SSM state bytes per sequence and K/V bytes per token "
        "per layer kind, the total at --context/--batch as ssmcc stores it, and what a paged "
        "hybrid cache (vLLM's rule: an attention page holds one Mamba state) would take",
    )
    inspect.add_argument(
        "--context", type=int, default=4096, help="tokens per sequence for --memory (4096)"
    )
    inspect.add_argument("--batch", type=int, default=1, help="sequences for --memory (1)")
    inspect.set_defaults(run=_cmd_inspect)

    comp = commands.add_parser(
        "compile",
        help="compile a model into a deployable artifact directory",
        description="Capture MODEL, run the passes, lower to TARGET and write DIR atomically: the "
        "model files and manifest.json (inputs/outputs with symbolic dims, opset, versions, file "
        "hashes). Nothing is left behind on failure; an existing DIR is kept unless --overwrite. "
        "Load it back with ssmcc.load(DIR).",
    )
    comp.add_argument(
        "model",
        metavar="MODEL",
        help="model directory, preset name, or a .pt2 file saved with torch.export.save",
    )
    comp.add_argument(
        "--no-route",
        dest="route",
        action="store_false",
        help="capture the model's own scan code (see 'inspect --no-route'); the artifact then "
        "runs at --seq-len tokens only, without step graphs",
    )
    comp.add_argument(
        "--target",
        default=DEFAULT_TARGET,
        choices=target_names(),
        help=f"where the artifact runs (default {DEFAULT_TARGET}); 'ssmcc coverage' lists what "
        "each target runs natively",
    )
    comp.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,  # 'ssmcc -v compile' and 'ssmcc compile -v' alike
        help="as 'ssmcc -v': phase lines with time and memory, and third-party log lines",
    )
    comp.add_argument("--out", required=True, metavar="DIR", help="artifact directory to write")
    comp.add_argument("--overwrite", action="store_true", help="replace DIR if it exists")
    comp.add_argument(
        "--seq-len", type=int, default=16, help="example length used for tracing (default 16)"
    )
    _add_compile_options(comp)
    _add_target_options(comp, COMPILE)
    comp.set_defaults(run=_cmd_compile)

    run = commands.add_parser(
        "run",
        help="generate tokens, streaming them as they come",
        description="Prefill the prompt, then decode one token at a time with the recurrent step "
        "graph, printing each token (as text with --prompt, as ids with --prompt-ids) as soon as "
        "it is chosen. DIR is an artifact written by 'ssmcc compile'; a preset or model "
        "directory is compiled first (for --target, torch by default, with --dtype, "
        "--pipeline and --quantize as 'ssmcc compile' takes them).",
    )
    run.add_argument("model", metavar="DIR|MODEL", help="artifact directory, preset or model dir")
    prompt = run.add_mutually_exclusive_group(required=True)
    prompt.add_argument(
        "--prompt",
        metavar="TEXT",
        help="prompt text, encoded with the model's tokenizer (kept in the artifact when the "
        "model folder holds one); the text is printed as it is generated, up to the "
        "tokenizer's end-of-sequence token",
    )
    prompt.add_argument(
        "--prompt-ids",
        type=_token_list,
        metavar="IDS",
        help="comma-separated prompt token ids, e.g. 1,2,3 (token ids are printed back)",
    )
    run.add_argument("--max-new-tokens", type=int, default=32, help="tokens to generate (>= 1)")
    run.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0 (default): greedy; > 0: sample at this temperature",
    )
    run.add_argument("--top-k", type=int, help="sample among the k most likely tokens")
    run.add_argument("--top-p", type=float, help="nucleus sampling: smallest set with mass p")
    run.add_argument("--seed", type=int, help="random seed for sampling")
    run.add_argument(
        "--eos-id",
        type=int,
        nargs="+",
        metavar="ID",
        help="stop at this token, or at any of these tokens (default with --prompt: the "
        "tokenizer's end-of-sequence token)",
    )
    _add_option(
        run,
        OPTIONS["chunk_size"],
        None,
        f" (default: the artifact's; {OPTIONS['chunk_size'].default} when compiling MODEL)",
    )
    _add_option(run, OPTIONS["kernels"], OPTIONS["kernels"].default, " (default auto)")
    run.add_argument(
        "--target",
        choices=target_names(),
        help=f"the target MODEL is compiled for first (default {DEFAULT_TARGET}); an artifact "
        "runs on the one it was compiled for",
    )
    for name in _RUN_COMPILE_OPTIONS:
        spec = _pipeline_spec() if name == "pipeline" else OPTIONS[name]
        _add_option(run, spec, None, " (when MODEL is compiled first; an artifact keeps its own)")
    _add_target_options(run, LOAD)
    run.set_defaults(run=_cmd_run)

    presets = commands.add_parser(
        "presets", help="list the built-in models", description="List the built-in model presets."
    )
    presets.set_defaults(run=_cmd_presets)

    cov = commands.add_parser(
        "coverage",
        help="which backend supports which ssmcc op",
        description="Print the op x backend coverage table.",
    )
    cov.add_argument("--json", action="store_true", help="print as JSON")
    cov.set_defaults(run=_cmd_coverage)

    from ssmcc.cli_kernels import add_kernels_command

    add_kernels_command(commands)
    from ssmcc.cli_serving import add_serving_commands

    add_serving_commands(commands)
    from ssmcc.cli_tensorrt import add_tensorrt_command

    add_tensorrt_command(commands)
    return parser


def _quiet_third_parties() -> None:
    """Without ``-v``: no Python warnings (torch.export's deprecation notes, ...) and only
    errors from transformers' logger (its "falling back to the PyTorch implementation" lines)."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    for name in ("transformers", "torch", "onnxscript"):
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    except ImportError:
        pass


def main(argv: list[str] | None = None) -> int:
    from ssmcc.progress import show_phases

    args = build_parser().parse_args(argv)
    show_phases(timed=args.verbose)
    if not args.verbose:
        _quiet_third_parties()
    if getattr(args, "seq_len", 16) < 1:
        print("ssmcc: error: --seq-len must be >= 1", file=sys.stderr)
        return 2
    try:
        return args.run(args)
    except SSMCCError as error:
        print(f"ssmcc: error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
