"""Artifact directories: atomic writes, refusal to overwrite, and errors that name the file."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ssmcc
from ssmcc.cli import main
from ssmcc.errors import ArtifactError, InputError
from ssmcc.runtime.artifact import write_artifact

from .conftest import make_hf_model


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = make_hf_model("mamba", num_hidden_layers=1)
    folder = tmp_path_factory.mktemp("saved") / "art"
    ssmcc.compile(model, target="onnx").save(str(folder))
    return model, str(folder)


def _copy(src: str, dst) -> str:
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def test_failed_write_leaves_nothing(tmp_path):
    def write_then_fail(folder):
        with open(os.path.join(folder, "prefill.onnx"), "wb") as f:
            f.write(b"partial")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        write_artifact(str(tmp_path / "out"), write_then_fail, {"target": "onnx"})
    assert os.listdir(tmp_path) == []  # neither out/ nor a temporary sibling


def test_existing_directory_is_kept_unless_overwrite(saved, tmp_path):
    model, folder = saved
    target = _copy(folder, tmp_path / "existing")
    compiled = ssmcc.compile(model, target="onnx")
    with pytest.raises(ArtifactError, match="already exists; pass overwrite=True"):
        compiled.save(target)
    compiled.save(target, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["existing"]
    ssmcc.load(target)


def test_missing_model_file_is_named(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "a")
    os.remove(os.path.join(folder, "prefill.onnx"))
    with pytest.raises(ArtifactError, match=r"prefill\.onnx is missing"):
        ssmcc.load(folder)


def test_corrupt_model_file_is_named(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "b")
    path = os.path.join(folder, "prefill.onnx")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))
    with pytest.raises(ArtifactError, match=r"prefill\.onnx does not match its SHA-256"):
        ssmcc.load(folder)


def test_truncated_file_is_named(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "c")
    path = os.path.join(folder, "prefill.onnx")
    open(path, "r+b").truncate(100)
    with pytest.raises(ArtifactError, match=r"prefill\.onnx has 100 bytes"):
        ssmcc.load(folder)


def test_unverified_unreadable_graph_is_named_on_load(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "f")
    path = os.path.join(folder, "step.onnx")
    size = os.path.getsize(path)
    open(path, "wb").write(b"\xff" * size)
    with pytest.raises(ArtifactError, match=r"step\.onnx is not a readable ONNX model"):
        ssmcc.load(folder, verify=False)


def test_unverified_graph_ort_refuses_is_named_when_first_used(saved, tmp_path):
    """Sessions open on first use; a well-formed graph ORT cannot run is named then."""
    import onnx

    folder = _copy(saved[1], tmp_path / "g")
    path = os.path.join(folder, "step.onnx")
    model = onnx.load(path, load_external_data=False)
    model.graph.node[0].op_type = "NoSuchOp"
    onnx.save(model, path)
    manifest_path = os.path.join(folder, "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["files"]["step.onnx"]["bytes"] = os.path.getsize(path)  # sizes are always checked
    json.dump(manifest, open(manifest_path, "w"))
    loaded = ssmcc.load(folder, verify=False)
    logits, state = loaded.prefill(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ArtifactError, match=r"step\.onnx could not be loaded by onnxruntime"):
        loaded.step(torch.zeros(1, dtype=torch.long), state)


def test_corrupt_or_missing_manifest_is_named(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "d")
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        f.write("{not json")
    with pytest.raises(ArtifactError, match=r"manifest\.json is corrupt"):
        ssmcc.load(folder)
    os.remove(os.path.join(folder, "manifest.json"))
    with pytest.raises(ArtifactError, match=r"manifest\.json is missing"):
        ssmcc.load(folder)
    with pytest.raises(ArtifactError, match="is not a directory"):
        ssmcc.load(str(tmp_path / "nowhere"))


def test_manifest_hash_mismatch_is_named(saved, tmp_path):
    folder = _copy(saved[1], tmp_path / "e")
    path = os.path.join(folder, "manifest.json")
    manifest = json.load(open(path))
    manifest["files"]["prefill.onnx"]["sha256"] = "0" * 64
    json.dump(manifest, open(path, "w"))
    with pytest.raises(ArtifactError, match=r"prefill\.onnx does not match its SHA-256"):
        ssmcc.load(folder)


@pytest.mark.parametrize(
    "ids,message",
    [
        (torch.rand(1, 4), "must hold integer token ids"),
        (torch.zeros(4, dtype=torch.long), "must have shape \\(batch, length\\), got rank 1"),
        (torch.full((1, 2), 101), "token id 101, outside the vocabulary"),
        (torch.zeros(1, 0, dtype=torch.long), "empty sequence"),
    ],
)
def test_loaded_model_checks_inputs_before_onnxruntime(saved, ids, message):
    loaded = ssmcc.load(saved[1])
    with pytest.raises(InputError, match=message):
        loaded(ids)


def test_cli_compile_writes_and_refuses_to_overwrite(tmp_path, capsys):
    out = str(tmp_path / "cli")
    assert main(["compile", "mamba-tiny", "--target", "onnx", "--out", out]) == 0
    assert (
        "ssmcc nodes ['MambaMixer', 'RmsNormGated'], "
        "inputs input_ids['batch', 'seq']" in capsys.readouterr().out
    )
    assert main(["compile", "mamba-tiny", "--out", out]) == 1
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert main(["compile", "mamba-tiny", "--out", out, "--overwrite"]) == 0
    ids = torch.randint(0, 512, (2, 5))
    from ssmcc.presets import build_preset

    with torch.no_grad():
        expected = build_preset("mamba-tiny")(ids).logits
    assert (ssmcc.load(out)(ids) - expected).abs().max() <= 1e-4
