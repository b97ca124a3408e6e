"""What ``ssmcc.load`` trusts and what ``save`` may touch: a manifest cannot reach outside its
directory, graph files must be hashed files, program archives must hold no pickle, the manifest's
states must be the graphs', ``overwrite`` replaces only ssmcc artifacts, and killed saves leave
nothing behind that a later save does not remove."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import zipfile

import pytest

import ssmcc
from ssmcc.errors import ArtifactError
from ssmcc.runtime.artifact import remove_stale_temporaries, sha256_of

from .conftest import make_hf_model

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module", params=["onnx", "torch"])
def saved(request, tmp_path_factory):
    model = make_hf_model("mamba", num_hidden_layers=1)
    folder = tmp_path_factory.mktemp(f"saved_{request.param}") / "art"
    ssmcc.compile(model, target=request.param).save(str(folder))
    return str(folder)


@pytest.fixture(scope="module")
def saved_onnx(tmp_path_factory):
    """One small artifact for the killed-save runs (the writer is the same for every target)."""
    folder = tmp_path_factory.mktemp("saved_for_kills") / "art"
    ssmcc.compile(make_hf_model("mamba", num_hidden_layers=1), target="onnx").save(str(folder))
    return str(folder)


def _copy(src: str, dst) -> str:
    shutil.copytree(src, dst)
    return str(dst)


def _edit(folder: str, change) -> None:
    path = os.path.join(folder, "manifest.json")
    manifest = json.load(open(path))
    change(manifest)
    json.dump(manifest, open(path, "w"))


def _graph(manifest) -> str:
    return "step" if "step" in manifest["graphs"] else "forward"


@pytest.mark.parametrize(
    "name", ["../../../../etc/passwd", "/etc/passwd", "sub/x.bin", "..", "manifest.json"]
)
def test_a_file_entry_outside_the_directory_is_refused(saved, tmp_path, name):
    folder = _copy(saved, tmp_path / "a")

    def change(manifest):
        manifest["files"][name] = {"bytes": 1, "sha256": "0" * 64}

    _edit(folder, change)
    with pytest.raises(ArtifactError, match=r"files\[.*\] must be a plain file name"):
        ssmcc.load(folder)


def test_a_graph_file_outside_the_hashed_files_is_refused(saved, tmp_path):
    """``graphs.step.file`` pointing at another model's graph used to load and run it."""
    other = _copy(saved, tmp_path / "other")
    folder = _copy(saved, tmp_path / "b")
    target = os.path.join(
        other, json.load(open(os.path.join(other, "manifest.json")))["graphs"]["step"]["file"]
    )

    def change(manifest):
        manifest["graphs"]["step"]["file"] = os.path.relpath(target, folder)

    _edit(folder, change)
    with pytest.raises(ArtifactError, match=r"graphs\['step'\]\.file must be one of the artifact"):
        ssmcc.load(folder)


def test_a_symlinked_file_is_refused(saved, tmp_path):
    folder = _copy(saved, tmp_path / "c")
    manifest = json.load(open(os.path.join(folder, "manifest.json")))
    name = manifest["graphs"]["step"]["file"]
    outside = tmp_path / "outside"
    shutil.copy(os.path.join(folder, name), outside)
    os.remove(os.path.join(folder, name))
    os.symlink(outside, os.path.join(folder, name))
    with pytest.raises(ArtifactError, match="is a symbolic link"):
        ssmcc.load(folder)


@pytest.mark.parametrize(
    "change,field",
    [
        (lambda m: m.update(graphs={}), "graphs must be a streaming model's graphs"),
        (lambda m: m.pop("vocab_size"), "no 'vocab_size' entry"),
        (lambda m: m.update(vocab_size=None), "vocab_size must be an integer >= 1"),
        (lambda m: m.update(chunk_size=True), "chunk_size must be an integer"),
        (lambda m: m["states"][0].update(shape=[3, 4]), r"states\[0\]\.shape must be"),
        (lambda m: m["states"][0].update(dtype="complex64"), r"states\[0\]\.dtype must be"),
        (lambda m: m["files"][next(iter(m["files"]))].update(sha256="x"), "sha256 must be"),
        (lambda m: m.update(streaming="yes"), "streaming must be true or false"),
    ],
)
def test_manifest_schema_names_the_field(saved, tmp_path, change, field):
    folder = _copy(saved, tmp_path / "d")
    _edit(folder, change)
    with pytest.raises(ArtifactError, match=field):
        ssmcc.load(folder)


def test_edited_state_shape_is_refused_before_a_runtime_sees_it(saved, tmp_path):
    folder = _copy(saved, tmp_path / "e")

    def change(manifest):
        manifest["states"][1]["shape"][2] += 1

    _edit(folder, change)
    with pytest.raises(
        ArtifactError, match=r"state layers\.0\.ssm_state is float32 .* the manifest"
    ):
        ssmcc.load(folder)


def test_save_of_a_tampered_artifact_writes_nothing_outside(saved, tmp_path):
    """A manifest that names files outside is refused on load, so nothing is ever saved from
    it; a valid artifact saves only into its destination."""
    folder = _copy(saved, tmp_path / "f")
    _edit(folder, lambda m: m["graphs"]["step"].update(file="../escape.bin"))
    with pytest.raises(ArtifactError):
        ssmcc.load(folder)
    loaded = ssmcc.load(saved)
    before = set(os.listdir(tmp_path))
    loaded.save(str(tmp_path / "copy"))
    assert set(os.listdir(tmp_path)) == before | {"copy"}
    assert sorted(os.listdir(tmp_path / "copy")) == sorted(os.listdir(saved))


def test_overwrite_replaces_only_an_artifact(saved, tmp_path):
    compiled = ssmcc.load(saved)
    user_dir = tmp_path / "mine"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("keep me")
    user_file = tmp_path / "report.txt"
    user_file.write_text("keep me too")
    for path in (user_dir, user_file):
        with pytest.raises(ArtifactError, match="not an ssmcc artifact.*nothing was deleted"):
            compiled.save(str(path), overwrite=True)
    assert (user_dir / "notes.txt").read_text() == "keep me"
    assert user_file.read_text() == "keep me too"
    assert sorted(os.listdir(tmp_path)) == ["mine", "report.txt"]
    artifact = tmp_path / "artifact"
    compiled.save(str(artifact))
    compiled.save(str(artifact), overwrite=True)
    assert sorted(os.listdir(tmp_path)) == ["artifact", "mine", "report.txt"]
    ssmcc.load(str(artifact))


def test_pickled_payload_in_a_program_archive_is_refused(tmp_path):
    model = make_hf_model("mamba", num_hidden_layers=1)
    folder = str(tmp_path / "t")
    ssmcc.compile(model, target="torch").save(folder)
    path = os.path.join(folder, "step.pt2")
    rewritten = str(tmp_path / "step.pt2")
    with zipfile.ZipFile(path) as source, zipfile.ZipFile(rewritten, "w") as out:
        for item in source.infolist():
            data = source.read(item.filename)
            if item.filename.endswith("model_weights_config.json"):
                config = json.loads(data)
                next(iter(config["config"].values()))["use_pickle"] = True
                data = json.dumps(config).encode()
            out.writestr(item, data)
    shutil.move(rewritten, path)
    size, digest = os.path.getsize(path), sha256_of(path)
    _edit(folder, lambda m: m["files"]["step.pt2"].update(bytes=size, sha256=digest))
    with pytest.raises(ArtifactError, match="holds entries ssmcc never writes.*pickled"):
        ssmcc.load(folder)


def test_stale_temporaries_of_gone_writers_are_removed(saved, tmp_path):
    """A temporary named for a process that has exited goes; one of a live process stays."""
    out = tmp_path / "art"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    ).stdout.strip()
    from ssmcc.runtime.temporaries import host, start_time

    gone = tmp_path / f".art.tmp-{host()}-{dead}-1-abcd"
    live = tmp_path / f".art.tmp-{host()}-{os.getpid()}-{start_time(os.getpid())}-abcd"
    other_host = tmp_path / f".art.tmp-ffffffff-{dead}-1-abcd"
    for folder in (gone, live, other_host):
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"x" * 100)
    ssmcc.load(saved).save(str(out))
    assert not gone.exists() and live.exists() and other_host.exists()
    assert remove_stale_temporaries(str(out)) == []


_SAVER = """
import sys, ssmcc
model = ssmcc.load(sys.argv[1])
print("ready", flush=True)
while True:
    model.save(sys.argv[2], overwrite=True)
"""


def _killed_saves(saved: str, tmp_path, kills: int) -> None:
    out = str(tmp_path / "dest")
    rng = random.Random(0)
    for _ in range(kills):
        child = subprocess.Popen(
            [sys.executable, "-c", _SAVER, saved, out],
            cwd=REPO,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout.readline().strip() == "ready"
        time.sleep(rng.uniform(0.0, 0.3))
        child.send_signal(signal.SIGKILL)
        child.wait()
        if os.path.exists(out):  # whatever is there is complete: old or new, never half
            ssmcc.load(out)
    ssmcc.load(saved).save(out, overwrite=True)
    assert os.listdir(tmp_path) == ["dest"]  # no temporary of any killed save remains
    ssmcc.load(out)


@pytest.mark.slow
def test_killed_saves_leave_nothing_behind(saved_onnx, tmp_path):
    _killed_saves(saved_onnx, tmp_path, kills=2)


@pytest.mark.slow
def test_eight_killed_saves_leave_nothing_behind(saved_onnx, tmp_path):
    _killed_saves(saved_onnx, tmp_path, kills=8)  # each kill starts a Python: 5 s of CI
