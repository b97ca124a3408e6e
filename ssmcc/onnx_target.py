"""The ``onnx`` target end to end: programs -> ONNX artifact -> ONNX Runtime sessions; ``load``.

An artifact holds ``prefill.onnx`` (``input_ids`` + states -> logits + next states),
``chunk.onnx`` (the same, with the last position's logits only: what chunked prefill and
``generate`` run), ``step.onnx`` (one token + states -> last logits + next states),
``weights.bin`` (every initializer of the graphs stored once, by content) and ``manifest.json``.
A model without SSM layers has only ``prefill.onnx`` and no states.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import weakref

import onnx
import torch
from onnx import numpy_helper

import ssmcc
from ssmcc.artifact import ArtifactError, read_manifest, write_artifact
from ssmcc.passes.chunk_state_passing import DEFAULT_CHUNK_SIZE

WEIGHTS_FILE = "weights.bin"
INLINE_BYTES = 1024  # initializers smaller than this stay inside the graph file
ALIGN = 64


def _dim_names(program) -> dict[str, str]:
    """``input_ids`` dims -> batch, seq; every other user input's dim 0 -> batch."""
    names = {}
    user_inputs = list(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        axes = ("batch", "seq") if node.name == user_inputs[0] else ("batch",)
        for axis, size in enumerate(node.meta["val"].shape[: len(axes)]):
            if isinstance(size, torch.SymInt):
                names[str(size.node.expr)] = axes[axis]
    return names


def _describe_values(values) -> list[dict]:
    type_names = {
        onnx.TensorProto.INT64: "int64",
        onnx.TensorProto.FLOAT: "float32",
        onnx.TensorProto.FLOAT16: "float16",
        onnx.TensorProto.BFLOAT16: "bfloat16",
    }
    return [
        {
            "name": v.name,
            "dtype": type_names.get(
                v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type)
            ),
            "dims": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
        }
        for v in values
    ]


def _externalize(models: dict[str, onnx.ModelProto], folder: str) -> None:
    """Move every initializer of every model into one ``weights.bin``, each distinct content
    stored once (the prefill and step graphs share the weights)."""
    stored: dict[bytes, tuple[int, int]] = {}
    with open(os.path.join(folder, WEIGHTS_FILE), "wb") as weights:
        for model in models.values():
            for tensor in model.graph.initializer:
                if not tensor.HasField("raw_data"):
                    tensor.CopyFrom(
                        numpy_helper.from_array(numpy_helper.to_array(tensor), tensor.name)
                    )
                raw = tensor.raw_data
                if len(raw) < INLINE_BYTES:
                    continue
                key = hashlib.sha256(raw).digest() + bytes(str(tensor.data_type), "ascii")
                if key not in stored:
                    weights.write(b"\0" * (-weights.tell() % ALIGN))
                    stored[key] = (weights.tell(), len(raw))
                    weights.write(raw)
                offset, length = stored[key]
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for k, v in (("location", WEIGHTS_FILE), ("offset", offset), ("length", length)):
                    tensor.external_data.add(key=k, value=str(v))
    for name, model in models.items():
        onnx.save_model(model, os.path.join(folder, f"{name}.onnx"))


def _versions() -> dict[str, str]:
    import onnxruntime
    import transformers

    return {
        "ssmcc": ssmcc.__version__,
        "torch": torch.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": onnxruntime.__version__,
        "transformers": transformers.__version__,
    }


def _graph_entry(name: str, model: onnx.ModelProto) -> dict:
    from ssmcc.lowering.onnx.schemas import DOMAIN

    return {
        "file": f"{name}.onnx",
        "inputs": _describe_values(model.graph.input),
        "outputs": _describe_values(model.graph.output),
        "onnx_nodes": len(model.graph.node),
        "ssmcc_nodes": sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN}),
    }


def build_onnx_artifact(program, out_dir: str, manifest_extra: dict, overwrite: bool) -> dict:
    """Lower ``program`` (and its stateful forms) and write the artifact; returns the manifest."""
    from ssmcc.lowering.onnx import OPSET, lower_to_onnx
    from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION
    from ssmcc.passes.scan_to_recurrent_step import state_specs
    from ssmcc.stateful import derive_stateful_programs

    token_model = manifest_extra.get("vocab_size") is not None
    models, specs = {}, []
    streaming = manifest_extra.get("static_length") is None  # a static length cannot stream
    if token_model and streaming and state_specs(program):
        programs = derive_stateful_programs(program)
        specs = programs.specs
        names = [s["name"] for s in specs]
        inputs = ["input_ids", *names]
        outputs = ["logits", *[f"{n}.next" for n in names]]
        for graph in ("prefill", "chunk", "step"):
            graph_program = getattr(programs, graph)
            models[graph] = lower_to_onnx(graph_program, inputs, outputs, _dim_names(graph_program))
    else:
        models["prefill"] = lower_to_onnx(
            program,
            ["input_ids"] if token_model else None,
            ["logits"] if token_model else None,
            _dim_names(program) if token_model else None,
        )
    for model in models.values():
        onnx.checker.check_model(model, full_check=True)
    manifest = {
        "target": "onnx",
        **manifest_extra,
        "opset": {"": OPSET, DOMAIN: VERSION},
        "graphs": {name: _graph_entry(name, model) for name, model in models.items()},
        "states": specs,
        "versions": _versions(),
    }
    return write_artifact(out_dir, lambda folder: _externalize(models, folder), manifest, overwrite)


def _session_opener(artifact_dir: str, manifest: dict, kernels: str, threads: int | None):
    """Opens one graph's ORT session when a runner first needs it (each session holds its own
    copy of the weights, so a program that only generates never opens the full-logits graph)."""
    from ssmcc.lowering.onnx.runtime import make_session

    def open_session(name: str):
        path = os.path.join(artifact_dir, manifest["graphs"][name]["file"])
        try:
            return make_session(path, kernels, threads)
        except Exception as error:  # onnxruntime's own exception types
            raise ArtifactError(
                f"{path} could not be loaded by onnxruntime: {str(error).strip().splitlines()[0]}"
            ) from error

    return open_session


def compile_to_onnx(program, manifest_extra: dict, kernels: str = "auto"):
    """Build the artifact in a private temporary directory and open sessions on it."""
    from ssmcc.runners import OnnxRunner

    workdir = tempfile.mkdtemp(prefix="ssmcc-onnx-")
    artifact = os.path.join(workdir, "artifact")
    manifest = build_onnx_artifact(program, artifact, manifest_extra, overwrite=False)
    runner = OnnxRunner(_session_opener(artifact, manifest, kernels, None), manifest)
    return runner, manifest, artifact, workdir


def copy_artifact(source: str, out_dir: str, overwrite: bool) -> None:
    """Copy a finished artifact directory to ``out_dir`` (atomically)."""
    manifest = read_manifest(source, verify_hashes=False)
    extra = {k: v for k, v in manifest.items() if k not in ("format", "format_version", "files")}

    def write_files(folder: str) -> None:
        for name in manifest["files"]:
            shutil.copy2(os.path.join(source, name), os.path.join(folder, name))

    write_artifact(out_dir, write_files, extra, overwrite)


def load(
    artifact_dir: str,
    verify: bool = True,
    kernels: str = "auto",
    threads: int | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
):
    """Open an artifact written by ``CompiledModel.save`` / ``ssmcc compile``.

    ``kernels="auto"`` registers the ssmcc ONNX Runtime library when it can be built here;
    ``"reference"`` runs the portable function bodies. ``verify`` checks every file's SHA-256.
    ``chunk_size``: tokens per prefill chunk (see ``ssmcc.compile``).
    """
    from ssmcc.compiled import CompiledModel
    from ssmcc.runners import OnnxRunner

    manifest = read_manifest(artifact_dir, verify_hashes=verify)
    if manifest["target"] != "onnx":
        raise ArtifactError(
            f"{artifact_dir}: target {manifest['target']!r} cannot be loaded "
            "(loadable targets: onnx)"
        )
    runner = OnnxRunner(_session_opener(artifact_dir, manifest, kernels, threads), manifest)
    return CompiledModel.from_artifact(runner, manifest, artifact_dir, chunk_size)


def keep_workdir_until_collected(owner, workdir: str) -> None:
    weakref.finalize(owner, shutil.rmtree, workdir, True)
