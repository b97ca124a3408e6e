"""``ssmcc export-serving`` and ``ssmcc serve``: a saved artifact as a Triton Inference Server
model repository (``ssmcc.serving.triton_repository``), and a local server on one."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def _cmd_export_serving(args: argparse.Namespace) -> int:
    from ssmcc.serving import export_triton

    out = export_triton(
        args.artifact,
        args.out,
        name=args.name,
        flavour=args.flavour,
        max_batch_size=args.max_batch_size,
        batch_delay_ms=args.batch_delay,
        instances=args.instances,
        threads=args.threads,
        idle_timeout_s=args.idle_timeout,
        python_path=None if args.no_python_path else "auto",
        ort_library=args.ort_library,
        max_request_tokens=args.max_request_tokens,
        overwrite=args.overwrite,
    )
    print(f"wrote {out} (model {args.name!r}, {args.flavour} backend); see {out}/README.md")
    return 0


def _cmd_serve(args: argparse.Namespace) -> int:
    """Run the server until SIGINT (Ctrl-C) or SIGTERM. The signals only set an event that the
    main loop waits on: a ``KeyboardInterrupt`` raised at an arbitrary point could land inside
    ``Popen.poll`` while it holds the process's wait lock, and the stop's ``wait`` would then
    block forever on that lock with the server still running."""
    from ssmcc.serving import TritonServer

    server = TritonServer(args.repository, http_port=args.http_port, grpc_port=args.grpc_port)
    stop = threading.Event()
    handlers = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    print(f"[ssmcc] starting tritonserver on {args.repository}", file=sys.stderr, flush=True)
    try:
        server.start(interrupt=stop)
        if not stop.is_set():
            print(f"serving at http://{server.url} (gRPC {server.grpc_url}); Ctrl-C stops it")
            sys.stdout.flush()
        while not stop.is_set() and server.process.poll() is None:
            stop.wait(0.5)
    finally:
        server.stop()
        for number, handler in handlers.items():
            signal.signal(number, handler)
    if stop.is_set():
        return 0
    print(
        f"ssmcc: error: tritonserver exited with code {server.process.returncode}", file=sys.stderr
    )
    return 1


def add_serving_commands(commands) -> None:
    from ssmcc.serving.triton_repository import FLAVOURS

    export = commands.add_parser(
        "export-serving",
        help="write a Triton Inference Server model repository for a saved artifact",
        description="Write a Triton Inference Server model repository serving the ARTIFACT's "
        "prefill chunks and decode steps through one model: requests carry one sequence's "
        "token ids with the sequence batcher's START/END/CORRID controls, the server keeps each "
        "sequence's state between its requests and batches requests of different sequences, "
        "responses are the last position's logits. Flavours: python (Triton's Python backend "
        "running ssmcc's runtime, any target; the one that runs with the tritonserver of "
        "nvidia-pytriton) and onnxruntime (ONNX Runtime backend with implicit state, ONNX "
        "artifacts without K/V caches). The repository has a README on launching and clients.",
        epilog="Example: ssmcc compile mamba-130m --out art && ssmcc export-serving art "
        "--engine triton --out repo && ssmcc serve repo",
    )
    export.add_argument("artifact", metavar="ARTIFACT", help="a saved ssmcc artifact directory")
    export.add_argument("--engine", choices=["triton"], default="triton", help="serving engine")
    export.add_argument("--out", required=True, metavar="REPO", help="repository to write")
    export.add_argument("--name", default="ssmcc", help="model name in the repository")
    export.add_argument("--flavour", choices=FLAVOURS, default="python", help="Triton backend")
    export.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="requests of different sequences batched together (default 8)",
    )
    export.add_argument(
        "--batch-delay",
        type=float,
        default=1.0,
        metavar="MS",
        help="how long a request may wait for requests of other sequences to batch with "
        "(default 1 ms; a few ms, about one step's time, keep concurrent sequences in one batch)",
    )
    export.add_argument("--instances", type=int, default=1, help="model instances (default 1)")
    export.add_argument(
        "--threads", type=int, default=0, help="intra-op threads per instance (0: the default)"
    )
    export.add_argument(
        "--idle-timeout",
        type=float,
        default=60.0,
        metavar="SECONDS",
        help="free a sequence's state after this long without a request (default 60)",
    )
    export.add_argument(
        "--max-request-tokens",
        type=int,
        default=4096,
        metavar="N",
        help="python flavour: the most tokens one request may hold (default 4096); a longer "
        "request is refused, ssmcc's Client sends longer prompts in pieces",
    )
    export.add_argument(
        "--no-python-path",
        action="store_true",
        help="python flavour: do not record this interpreter's sys.path in config.pbtxt (the "
        "server's environment must then import ssmcc)",
    )
    export.add_argument(
        "--ort-library",
        metavar="PATH",
        help="onnxruntime flavour: the ssmcc ORT custom-op library on the server, named in "
        "model_operations (default: none, the graph's portable bodies run)",
    )
    export.add_argument("--overwrite", action="store_true", help="replace REPO if it exists")
    export.set_defaults(run=_cmd_export_serving)

    serve = commands.add_parser(
        "serve",
        help="run a local Triton Inference Server on a model repository",
        description="Start the tritonserver of the installed nvidia-pytriton wheel (pip install "
        "'ssmcc[serving]') on REPOSITORY, bound to 127.0.0.1, with this Python environment "
        "for its Python backend; print its address and run until Ctrl-C or SIGTERM (either stops "
        "the server and exits 0; a server that exits by itself makes the command exit 1).",
    )
    serve.add_argument("repository", metavar="REPOSITORY", help="a model repository")
    serve.add_argument("--http-port", type=int, default=None, help="default: a free port")
    serve.add_argument("--grpc-port", type=int, default=None, help="default: a free port")
    serve.set_defaults(run=_cmd_serve)
