"""An ssmcc artifact as a Triton Inference Server model repository (``ssmcc export-serving``).

One model serves prefill chunks and decode steps through one interface. A request is one
sequence's ``input_ids`` (a prompt, a chunk of it, or one token) with the sequence batcher's
``START`` / ``END`` / ``CORRID`` controls; the response is the last position's ``logits`` (and,
from the Python backend, the greedy ``next_token``). Requests of different sequences are batched
together (``max_batch_size``, the batcher's ``oldest`` strategy); each sequence's per-layer state
is carried between its requests. Two flavours from one artifact::

    python       REPO/<name>/config.pbtxt      backend "python", sequence batcher with controls
                 REPO/<name>/1/model.py        ssmcc.serving.triton_model: ssmcc's runtime, the
                                               states kept per CORRID (the Python backend has no
                                               implicit state), freed at END or when idle
                 REPO/<name>/1/artifact/       the ssmcc artifact (any target)
    onnxruntime  REPO/<name>/config.pbtxt      backend "onnxruntime", implicit state: every state
                                               input/output pair of the graph, zeros at START
                 REPO/<name>/1/model.onnx      the artifact's chunk graph (input_ids + states ->
                 REPO/<name>/1/weights.bin     last logits + next states), portable bodies; the
                                               ssmcc ORT library named in model_operations when
                                               given (``ort_library``)

plus ``REPO/README.md`` (how to launch it, how clients talk to it). The repository is written
into a temporary folder beside ``out`` and moved into place at the end: nothing half-written is
left after an error. The ``onnxruntime`` flavour needs an ONNX artifact whose states keep their
shape (no K/V cache: Triton's implicit state is not given a growing dim here).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import sys
import tempfile

from ssmcc.errors import OptionError, ServingError
from ssmcc.runtime.artifact import read_manifest

FLAVOURS = ("python", "onnxruntime")
_DTYPES = {"float32": "TYPE_FP32", "int64": "TYPE_INT64", "bfloat16": "TYPE_BF16"}
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _manifest(artifact: str) -> dict:
    path = os.path.join(artifact, "manifest.json")
    if not os.path.isfile(path):
        raise ServingError(
            f"{artifact} is not an ssmcc artifact (no manifest.json): compile and "
            "save a model first (ssmcc compile MODEL --out DIR)"
        )
    manifest = read_manifest(artifact)  # schema-checked, within size and depth limits
    if not manifest.get("streaming"):
        raise ServingError(
            f"{artifact} has no prefill/step programs "
            f"({manifest.get('streaming_refusal') or 'not a streaming language model'}): "
            "serving needs a model compiled with its states"
        )
    return manifest


@dataclasses.dataclass(frozen=True)
class ServingOptions:
    """What ``export_triton`` writes into ``config.pbtxt`` (its keyword arguments)."""

    name: str = "ssmcc"
    flavour: str = "python"
    max_batch_size: int = 8
    batch_delay_ms: float = 1.0
    instances: int = 1
    threads: int = 0
    idle_timeout_s: float = 60.0
    python_path: str | None = None
    ort_library: str | None = None
    max_request_tokens: int = 4096

    def check(self) -> None:
        if self.flavour not in FLAVOURS:
            raise OptionError(f"flavour must be one of {', '.join(FLAVOURS)}, got {self.flavour!r}")
        if not _NAME.match(self.name):
            raise OptionError(f"model name {self.name!r} must be letters, digits, '_', '.' or '-'")
        integers = (("max_batch_size", 1), ("instances", 1), ("threads", 0))
        for option, least in (*integers, ("max_request_tokens", 1)):
            value = getattr(self, option)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise OptionError(f"{option} must be an integer >= {least}, got {value!r}")
        for option, least in (("idle_timeout_s", 1e-3), ("batch_delay_ms", 0.0)):
            value = getattr(self, option)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < least:
                raise OptionError(f"{option} must be a number >= {least:g}, got {value!r}")


def _dims(dims: list) -> str:
    return "[ " + ", ".join(str(d if isinstance(d, int) else -1) for d in dims) + " ]"


def _parameters(values: dict[str, str]) -> str:
    return "".join(
        f'parameters {{ key: "{k}" value: {{ string_value: "{v}" }} }}\n' for k, v in values.items()
    )


def _batcher(options: ServingOptions, controls: bool, states: str) -> str:
    """Requests of up to ``max_batch_size`` sequences per execution; a request waits up to
    ``batch_delay_ms`` for the others (without a wait, sequences that fall out of step at their
    prompts keep running in small groups: the server is never idle long enough to merge them)."""
    controls_text = ""
    if controls:
        kinds = (
            ("START", "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ]"),
            ("END", "CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ]"),
            ("CORRID", "CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64"),
        )
        entries = ",\n".join(f'    {{ name: "{n}" control [ {{ kind: {k} }} ] }}' for n, k in kinds)
        controls_text = f"  control_input [\n{entries}\n  ]\n"
    return (
        "sequence_batching {\n"
        f"  max_sequence_idle_microseconds: {int(options.idle_timeout_s * 1e6)}\n"
        f"{controls_text}{states}"
        f"  oldest {{ max_candidate_sequences: {options.max_batch_size} "
        f"preferred_batch_size: [ {options.max_batch_size} ] "
        f"max_queue_delay_microseconds: {int(options.batch_delay_ms * 1000)} }}\n"
        "}\n"
    )


def python_config(options: ServingOptions, vocab: int) -> str:
    parameters = {
        "threads": str(options.threads),
        "idle_timeout_s": f"{options.idle_timeout_s:g}",
        "max_request_tokens": str(options.max_request_tokens),
    }
    if options.python_path:
        parameters["python_path"] = options.python_path
    return (
        f'name: "{options.name}"\nbackend: "python"\nmax_batch_size: {options.max_batch_size}\n'
        'input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
        "output [\n"
        f'  {{ name: "logits" data_type: TYPE_FP32 dims: [ {vocab} ] }},\n'
        '  { name: "next_token" data_type: TYPE_INT64 dims: [ 1 ] }\n'
        "]\n"
        + _batcher(options, True, "")
        + f"instance_group [ {{ kind: KIND_CPU count: {options.instances} }} ]\n"
        + _parameters(parameters)
    )


def onnxruntime_config(options: ServingOptions, graph: dict) -> str:
    """The ONNX Runtime backend's config: the chunk graph's ``input_ids`` and ``logits`` as the
    request and response, every (state, state.next) pair as implicit state with zeros at START."""
    inputs = {i["name"]: i for i in graph["inputs"]}
    outputs = {o["name"]: o for o in graph["outputs"]}
    states = ""
    for state in [n for n in inputs if n != "input_ids"]:
        spec = inputs[state]
        if f"{state}.next" not in outputs:
            raise ServingError(f"the chunk graph has state input {state!r} but no {state}.next")
        dims = spec["dims"][1:]  # the batch dim is Triton's
        if not all(isinstance(d, int) for d in dims):
            raise ServingError(
                f"state {state!r} has dims {spec['dims']}: a growing state (a K/V cache) cannot "
                "be Triton implicit state here; export the python flavour for this model"
            )
        dtype = _DTYPES[spec["dtype"]]
        states += (
            f'  state {{ input_name: "{state}" output_name: "{state}.next" data_type: {dtype} '
            f"dims: {_dims(dims)} initial_state {{ data_type: {dtype} dims: {_dims(dims)} "
            'zero_data: true name: "zeros" } }\n'
        )
    vocab = outputs["logits"]["dims"][-1]
    library, threads = options.ort_library, options.threads
    operations = f'model_operations {{ op_library_filename: [ "{library}" ] }}\n' if library else ""
    return (
        f'name: "{options.name}"\nbackend: "onnxruntime"\n'
        f"max_batch_size: {options.max_batch_size}\n"
        'input [ { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] } ]\n'
        f'output [ {{ name: "logits" data_type: TYPE_FP32 dims: [ {vocab} ] }} ]\n'
        + _batcher(options, False, states)
        + f"instance_group [ {{ kind: KIND_CPU count: {options.instances} }} ]\n"
        + operations
        + (
            'parameters { key: "intra_op_thread_count" value: { string_value: '
            f'"{threads}" }} }}\n'
            if threads
            else ""
        )
    )


_README = """# Triton Inference Server model repository for `{name}` (written by ssmcc {version})

Flavour: **{flavour}** (`{name}/config.pbtxt`). Launch (the `tritonserver` of PyPI's
`nvidia-pytriton`, as `ssmcc serve` does, or any Triton 2.x with the {backend} backend):

    ssmcc serve {repo_hint}                     # prints the HTTP/gRPC ports; Ctrl-C stops it
    tritonserver --model-repository=/path/to/repo

{python_note}
## Talking to it

Each request is one sequence's token ids as `input_ids` (INT64, shape [1, L]: the prompt, a
chunk of it, or one generated token) with the sequence id (`sequence_id`, a uint64 CORRID),
`sequence_start=True` on its first request and `sequence_end=True` on its last. The response's
`logits` (FP32 [1, {vocab}]) are the last position's{next_token}. Requests of different sequences
are batched (up to {max_batch_size}); each sequence's per-layer state stays on the server between
its requests and is freed at END or after {idle:g} s idle. A request for an unknown or expired
sequence without `sequence_start` is answered with an error.{checks_note}

    from ssmcc.serving import Client
    client = Client("127.0.0.1:8000", "{name}")
    tokens = client.generate(prompt_ids, max_new_tokens=32, sequence_id=1)    # greedy
    tokens = client.generate(prompt_ids, 32, sequence_id=2, do_sample=True, seed=0, top_p=0.9)
"""

_CHECKS_NOTE = """ Each request is checked
before it joins a batch, and a bad one (ids outside [0, {vocab}), none, more than {limit} of
them: the `max_request_tokens` parameter) is answered with its own error; the other requests of
its batch are answered as if it had not been sent. `Client` sends a longer prompt in pieces."""


def _readme(options: ServingOptions, vocab: int) -> str:
    from ssmcc.version import __version__

    name, flavour = options.name, options.flavour

    python_note = (
        "The Python backend imports ssmcc, torch and onnxruntime: start the server from the\n"
        "environment ssmcc is installed in (`ssmcc serve` passes its `sys.path` as\n"
        "PYTHONPATH), or set the `python_path` parameter in config.pbtxt.\n"
        if flavour == "python"
        else "The ONNX Runtime backend runs the chunk graph's portable bodies; name the ssmcc ORT\n"
        "library (`--ort-library`) to run its kernels instead.\n"
    )
    return _README.format(
        name=name,
        version=__version__,
        flavour=flavour,
        backend="Python" if flavour == "python" else "ONNX Runtime",
        repo_hint="REPO",
        python_note=python_note,
        vocab=vocab,
        next_token=" and `next_token` (INT64 [1, 1]) the greedy choice"
        if flavour == "python"
        else "",
        max_batch_size=options.max_batch_size,
        idle=options.idle_timeout_s,
        checks_note=_CHECKS_NOTE.format(vocab=vocab, limit=options.max_request_tokens)
        if flavour == "python"
        else "",
    )


def export_triton(
    artifact: str,
    out: str,
    *,
    name: str = "ssmcc",
    flavour: str = "python",
    max_batch_size: int = 8,
    batch_delay_ms: float = 1.0,
    instances: int = 1,
    threads: int = 0,
    idle_timeout_s: float = 60.0,
    python_path: str | None = "auto",
    ort_library: str | None = None,
    max_request_tokens: int = 4096,
    overwrite: bool = False,
) -> str:
    """Write the model repository ``out`` for the saved ssmcc ``artifact`` (module docstring);
    returns ``out``. ``batch_delay_ms``: how long a request may wait for others to batch with.
    ``python_path="auto"`` records this interpreter's ``sys.path`` for the Python backend's stub
    (None: rely on the server's environment). ``max_request_tokens`` (python flavour): the most
    tokens one request may hold; ``Client`` sends longer prompts in pieces of that size, so that
    a long prompt holds the model for one piece at a time and other sequences' steps run between
    its pieces."""
    if python_path == "auto":
        python_path = os.pathsep.join(p for p in sys.path if p)
    options = ServingOptions(
        name,
        flavour,
        max_batch_size,
        batch_delay_ms,
        instances,
        threads,
        idle_timeout_s,
        python_path,
        ort_library,
        max_request_tokens,
    )
    options.check()
    manifest = _manifest(artifact)
    if os.path.lexists(out) and not overwrite:
        raise ServingError(f"{out} already exists; pass overwrite=True (--overwrite) to replace it")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".ssmcc-serving-", dir=parent)
    try:
        version = os.path.join(staging, name, "1")
        os.makedirs(version)
        if flavour == "python":
            config = python_config(options, manifest["vocab_size"])
            here = os.path.dirname(os.path.abspath(__file__))
            shutil.copy2(os.path.join(here, "triton_model.py"), os.path.join(version, "model.py"))
            shutil.copytree(artifact, os.path.join(version, "artifact"))
        else:
            config = _onnxruntime_files(artifact, manifest, version, options)
        with open(os.path.join(staging, name, "config.pbtxt"), "w") as f:
            f.write(config)
        with open(os.path.join(staging, "README.md"), "w") as f:
            f.write(_readme(options, manifest["vocab_size"]))
        if os.path.lexists(out):
            shutil.rmtree(out) if os.path.isdir(out) else os.remove(out)
        os.replace(staging, out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return out


def _onnxruntime_files(artifact, manifest, version, options: ServingOptions) -> str:
    if manifest.get("target") != "onnx":
        raise ServingError(
            f"the onnxruntime flavour needs an ONNX artifact; {artifact} is a "
            f"{manifest.get('target')!r} one (compile with --target onnx, or export the python "
            "flavour)"
        )
    graph = manifest["graphs"].get("chunk")
    if graph is None:
        raise ServingError(f"{artifact} has no chunk graph to serve")
    config = onnxruntime_config(options, graph)
    shutil.copy2(os.path.join(artifact, graph["file"]), os.path.join(version, "model.onnx"))
    for file in manifest["files"]:
        if file.endswith(".bin"):  # the graphs' external weights, at the path they name
            shutil.copy2(os.path.join(artifact, file), os.path.join(version, file))
    return config
