"""The ``onnx`` target end to end: program -> ONNX artifact -> ONNX Runtime session; ``load``."""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import onnx
import torch

import ssmcc
from ssmcc.artifact import ArtifactError, read_manifest, write_artifact
from ssmcc.errors import InputError

MODEL_FILE = "model.onnx"
EXTERNAL_DATA_FILE = "model.onnx.data"
EXTERNAL_DATA_THRESHOLD = 64 * 1024 * 1024  # weights above this go to model.onnx.data


def _symbol_names(program, axis_names: dict[str, tuple[str, ...]]) -> dict[str, str]:
    names = {}
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in axis_names:
            for axis, size in enumerate(node.meta["val"].shape):
                if isinstance(size, torch.SymInt):
                    names[str(size.node.expr)] = axis_names[node.name][axis]
    return names


def _describe_values(values) -> list[dict]:
    type_names = {
        onnx.TensorProto.INT64: "int64",
        onnx.TensorProto.FLOAT: "float32",
        onnx.TensorProto.FLOAT16: "float16",
        onnx.TensorProto.BFLOAT16: "bfloat16",
    }
    described = []
    for value in values:
        tensor_type = value.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in tensor_type.shape.dim]
        described.append(
            {
                "name": value.name,
                "dtype": type_names.get(tensor_type.elem_type, str(tensor_type.elem_type)),
                "dims": dims,
            }
        )
    return described


def _write_model(model: onnx.ModelProto, folder: str) -> None:
    weight_bytes = sum(len(t.raw_data) for t in model.graph.initializer)
    path = os.path.join(folder, MODEL_FILE)
    if weight_bytes > EXTERNAL_DATA_THRESHOLD:
        onnx.save_model(
            model,
            path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=EXTERNAL_DATA_FILE,
            size_threshold=1024,
        )
    else:
        onnx.save_model(model, path)


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


def build_onnx_artifact(program, out_dir: str, manifest_extra: dict, overwrite: bool) -> dict:
    """Lower ``program`` and write the artifact directory; returns the manifest."""
    from ssmcc.lowering.onnx import OPSET, lower_to_onnx
    from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

    token_model = manifest_extra.get("vocab_size") is not None
    model = lower_to_onnx(
        program,
        input_names=["input_ids"] if token_model else None,
        output_names=["logits"] if token_model else None,
        dim_names=_symbol_names(program, {"input_ids": ("batch", "seq")}) if token_model else None,
    )
    onnx.checker.check_model(model, full_check=True)
    manifest = {
        "target": "onnx",
        **manifest_extra,
        "model_file": MODEL_FILE,
        "opset": {"": OPSET, DOMAIN: VERSION},
        "inputs": _describe_values(model.graph.input),
        "outputs": _describe_values(model.graph.output),
        "ssmcc_nodes": sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN}),
        "onnx_nodes": len(model.graph.node),
        "versions": _versions(),
    }
    return write_artifact(out_dir, lambda folder: _write_model(model, folder), manifest, overwrite)


def compile_to_onnx(program, manifest_extra: dict, kernels: str = "auto"):
    """Build the artifact in a private temporary directory and open a session on it."""
    from ssmcc.lowering.onnx.runtime import OnnxRunner, make_session

    workdir = tempfile.mkdtemp(prefix="ssmcc-onnx-")
    artifact = os.path.join(workdir, "artifact")
    manifest = build_onnx_artifact(program, artifact, manifest_extra, overwrite=False)
    session = make_session(os.path.join(artifact, MODEL_FILE), kernels)
    runner = OnnxRunner(session, manifest["inputs"][0]["name"])
    return runner, manifest, artifact, workdir


def copy_artifact(source: str, out_dir: str, overwrite: bool) -> None:
    """Copy a finished artifact directory to ``out_dir`` (atomically)."""
    manifest = read_manifest(source, verify_hashes=False)
    extra = {k: v for k, v in manifest.items() if k not in ("format", "format_version", "files")}

    def write_files(folder: str) -> None:
        for name in manifest["files"]:
            shutil.copy2(os.path.join(source, name), os.path.join(folder, name))

    write_artifact(out_dir, write_files, extra, overwrite)


def load(artifact_dir: str, verify: bool = True, kernels: str = "auto", threads: int | None = None):
    """Open an artifact written by ``CompiledModel.save`` / ``ssmcc compile``.

    ``kernels="auto"`` registers the ssmcc ONNX Runtime library when it can be built here;
    ``"reference"`` runs the portable function bodies. ``verify`` checks every file's SHA-256.
    """
    from ssmcc.compiled import CompiledModel
    from ssmcc.lowering.onnx.runtime import OnnxRunner, make_session

    manifest = read_manifest(artifact_dir, verify_hashes=verify)
    if manifest["target"] != "onnx":
        raise ArtifactError(
            f"{artifact_dir}: target {manifest['target']!r} cannot be loaded "
            "(loadable targets: onnx)"
        )
    path = os.path.join(artifact_dir, manifest["model_file"])
    try:
        session = make_session(path, kernels, threads)
    except Exception as error:  # onnxruntime's own exception types
        raise ArtifactError(
            f"{path} could not be loaded by onnxruntime: {str(error).strip().splitlines()[0]}"
        ) from error
    runner = OnnxRunner(session, manifest["inputs"][0]["name"])
    return CompiledModel.from_artifact(runner, manifest, artifact_dir)


def keep_workdir_until_collected(owner, workdir: str) -> None:
    weakref.finalize(owner, shutil.rmtree, workdir, True)


__all__ = ["ArtifactError", "InputError", "build_onnx_artifact", "compile_to_onnx", "load"]
