"""``ssmcc kernels build``: ahead-of-time PTX and cubin of the Triton kernels a model needs.

Compiles each MODEL for the triton target (interpreted, on the CPU: no GPU is needed), records
the kernel launches of its prefill, chunk and step programs under the GPU's meta-parameters, and
compiles each distinct specialisation for every ``--arch`` (``kernels/triton/aot.py``), writing
``DIR/manifest.json`` and the binaries. DIR is written whole or not at all. Each binary's registers
and spills (``ptxas -v``) are in the manifest and the summary names every binary that spills.
"""

from __future__ import annotations

import argparse
import sys


def _progress(message: str) -> None:
    print(f"[ssmcc] {message}", file=sys.stderr, flush=True)


def _cmd_kernels_build(args: argparse.Namespace) -> int:
    import ssmcc
    from ssmcc.kernels.triton import aot
    from ssmcc.kernels.triton.runtime import require_triton
    from ssmcc.presets import load_model

    require_triton("ssmcc kernels build")
    archs = [a.strip() for a in args.arch.split(",") if a.strip()]
    unknown = [a for a in archs if a not in aot.ARCHS]
    if unknown or not archs:
        known = ", ".join(aot.ARCHS)
        print(
            f"ssmcc: error: --arch {args.arch!r}: unknown {unknown}; known: {known}",
            file=sys.stderr,
        )
        return 2
    options = {"dtype": args.dtype, "quantize": args.quantize}
    found: dict = {}
    for spec in args.models:
        _progress(f"compiling {spec} for the triton target (interpreted, to record its launches)")
        model = load_model(spec).eval()
        compiled = ssmcc.compile(model, target="triton", interpret=True, **options)
        specs = aot.model_specializations(compiled)
        _progress(f"{spec}: {len(specs)} kernel specialisations")
        for s in specs:
            found.setdefault(s.key, s)
    ordered = sorted(found.values(), key=lambda s: (s.kernel, s.key))
    _progress(f"compiling {len(ordered)} specialisations for {', '.join(archs)} into {args.out}")
    manifest = aot.build(ordered, archs, args.out, progress=_progress, models=args.models)
    print(
        f"{args.out}: {len(manifest['kernels'])} binaries ({len(ordered)} specialisations x "
        f"{len(archs)} architectures), manifest.json; {aot.describe_resources(manifest['kernels'])}"
    )
    return 0


def add_kernels_command(commands) -> None:
    from ssmcc.options import COMMON_OPTIONS

    kernels = commands.add_parser(
        "kernels",
        help="ahead-of-time builds of the Triton kernels",
        description="Work with ssmcc's Triton kernels ahead of time.",
    )
    actions = kernels.add_subparsers(dest="action", metavar="ACTION")
    actions.required = True
    build = actions.add_parser(
        "build",
        help="compile the kernels MODEL needs to PTX and cubin",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="Example: ssmcc kernels build mamba-130m mamba2-130m --arch sm_80,sm_90 --out k/",
    )
    build.add_argument("models", nargs="+", metavar="MODEL", help="preset or model directory")
    build.add_argument(
        "--arch",
        default="sm_80,sm_86,sm_89,sm_90",
        help="comma-separated GPU architectures (default sm_80,sm_86,sm_89,sm_90; also sm_100, "
        "sm_120)",
    )
    build.add_argument("--out", required=True, metavar="DIR", help="directory to write")
    build.add_argument(
        "--dtype",
        choices=COMMON_OPTIONS["dtype"].choices,
        default=None,
        help="compute dtype of the model (default: as the model is)",
    )
    build.add_argument(
        "--quantize",
        choices=COMMON_OPTIONS["quantize"].choices,
        default="none",
        help="weight storage (default none)",
    )
    build.set_defaults(run=_cmd_kernels_build)
