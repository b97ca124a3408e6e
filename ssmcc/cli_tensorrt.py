"""``ssmcc trt-build DIR``: build the TensorRT engines of a tensorrt artifact and check them.

On a machine with TensorRT (>= 10.8, with ``tensorrt.plugin``) and an NVIDIA GPU: registers
ssmcc's plugins with the artifact's PTX, builds ``prefill.engine``, ``chunk.engine`` and
``step.engine`` beside the graphs (one optimisation profile each, from the manifest), then, with
``--check``, runs the prefill engine on random ids and compares its logits with the same graph
in ONNX Runtime (its function bodies, on the CPU). It prints the equivalent ``trtexec`` lines
(shapes only: trtexec cannot load plugins defined in Python). Without TensorRT it says what is
missing and exits 1.
"""

from __future__ import annotations

import argparse
import sys


def _progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _check_prefill(folder: str, manifest: dict, compiled) -> float:
    """Largest |difference| of the prefill engine's logits from ONNX Runtime's on the same
    graph (batch 2, 37 random ids, zero states)."""
    import numpy as np
    import onnxruntime as ort
    import torch

    session = ort.InferenceSession(f"{folder}/prefill.onnx")
    ids = torch.randint(0, manifest.get("vocab_size") or 2, (2, 37))
    states = [torch.zeros(2, *s.shape) for s in compiled._executable.specs]
    feeds = {"input_ids": ids.numpy()}
    for value, state in zip(session.get_inputs()[1:], states, strict=True):
        feeds[value.name] = state.numpy().astype(np.float32)
    expected = session.run(None, feeds)[0]
    got = compiled._executable.run("prefill", ids, *states)[0].numpy()
    return float(np.abs(got - expected).max())


def _cmd_trt_build(args: argparse.Namespace) -> int:
    import ssmcc
    from ssmcc.lowering.tensorrt.target import INSTALL_HINT, tensorrt_missing

    compiled = ssmcc.load(args.artifact)
    manifest = compiled.manifest
    if manifest["target"] != "tensorrt":
        print(
            f"ssmcc: error: {args.artifact} is a {manifest['target']!r} artifact; compile with "
            "--target tensorrt",
            file=sys.stderr,
        )
        return 2
    for graph, line in manifest["build"]["trtexec"].items():
        print(f"# {graph}, equivalent shapes: {line.replace('DIR', args.artifact)}")
    missing = tensorrt_missing()
    if missing is not None:
        print(f"ssmcc: error: building engines needs TensorRT, and {missing} ({INSTALL_HINT})",
              file=sys.stderr)
        return 1
    from ssmcc.lowering.tensorrt.engines import build_engines

    for path in build_engines(args.artifact, manifest, _progress):
        print(path)
    if args.check:
        difference = _check_prefill(args.artifact, manifest, compiled)
        print(f"prefill logits vs ONNX Runtime: max |difference| {difference:.2e}")
        if difference > args.atol:
            print(f"ssmcc: error: above --atol {args.atol}", file=sys.stderr)
            return 1
    return 0


def add_tensorrt_command(commands) -> None:
    build = commands.add_parser(
        "trt-build",
        help="build and check the TensorRT engines of a tensorrt artifact",
        description=__doc__.split("\n\n")[1].replace("\n", " "),
        epilog="Example: ssmcc compile mamba-130m --target tensorrt --out m/ && "
        "ssmcc trt-build m/ --check",
    )
    build.add_argument("artifact", metavar="DIR", help="artifact written by ssmcc compile")
    build.add_argument(
        "--check", action="store_true", help="compare the prefill engine's logits with ONNX Runtime"
    )
    build.add_argument(
        "--atol", type=float, default=1e-3, help="largest logit difference --check accepts"
    )
    build.set_defaults(run=_cmd_trt_build)
