"""The torch target's saved form: weight-less programs plus one memory-mapped safetensors file,
loaded back with prefill/step/generate; the command line's compile and run on it."""

from __future__ import annotations

import json
import os

import pytest
import torch

import ssmcc
from ssmcc.cli import main
from ssmcc.errors import ArtifactError

from .conftest import make_hf_model

TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    model = make_hf_model("falcon_mamba")
    compiled = ssmcc.compile(model, target="torch")
    folder = str(tmp_path_factory.mktemp("torch") / "artifact")
    manifest = compiled.save(folder)
    return model, compiled, folder, manifest


def test_artifact_holds_programs_and_one_weights_file(saved):
    _, _, folder, manifest = saved
    assert manifest["target"] == "torch" and manifest["streaming"] is True
    assert sorted(manifest["files"]) == [
        "chunk.pt2",
        "prefill.pt2",
        "step.pt2",
        "weights.safetensors",
    ]
    assert [s["name"] for s in manifest["states"]][:2] == [
        "layers.0.conv_state",
        "layers.0.ssm_state",
    ]
    step = manifest["graphs"]["step"]
    assert step["ssmcc_nodes"] == ["mamba_mixer_step", "rmsnorm_gated"]
    assert step["inputs"][0] == {"name": "input_ids", "dtype": "int64", "dims": ["batch", 1]}


def test_weights_are_stored_once(tmp_path):
    model = make_hf_model(
        "mamba", vocab_size=4096, hidden_size=256, num_hidden_layers=2, time_step_rank=16
    )
    manifest = ssmcc.compile(model, target="torch").save(str(tmp_path / "big"))
    weights = sum({id(p): p.numel() * p.element_size() for p in model.parameters()}.values())
    stored = manifest["files"]["weights.safetensors"]["bytes"]
    assert abs(stored - weights) <= 0.02 * weights, (stored, weights)
    programs = sum(e["bytes"] for n, e in manifest["files"].items() if n.endswith(".pt2"))
    assert programs < 0.2 * weights  # three graphs, no weights in them


def test_loaded_model_matches_and_holds_its_verified_weights(saved):
    model, compiled, folder, _ = saved
    loaded = ssmcc.load(folder)
    assert loaded.target == "torch"
    with open("/proc/self/maps") as maps:  # a copy in memory, not a mapping of the file
        assert os.path.join(os.path.abspath(folder), "weights.safetensors") not in maps.read()
    ids = torch.randint(0, model.config.vocab_size, (2, 13))
    with torch.no_grad():
        expected = model(ids).logits
    assert (loaded(ids) - expected).abs().max() <= TOLERANCE
    logits, state = loaded.prefill(ids, chunk_size=5)
    assert (logits - expected).abs().max() <= TOLERANCE
    expected_tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
    assert torch.equal(loaded.generate(ids, 6), expected_tokens)
    assert torch.equal(compiled.generate(ids, 6), expected_tokens)


def test_two_loads_share_an_identity_and_resave(saved, tmp_path):
    _, _, folder, manifest = saved
    first, second = ssmcc.load(folder), ssmcc.load(folder)
    assert first.model_id == second.model_id
    again = first.save(str(tmp_path / "again"))
    assert again["files"]["weights.safetensors"] == manifest["files"]["weights.safetensors"]


def test_plain_module_saves_its_forward(tmp_path):
    module = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 3))
    example = torch.randn(5, 4)
    compiled = ssmcc.compile(module, example_inputs=(example,))
    manifest = compiled.save(str(tmp_path / "plain"))
    assert sorted(manifest["graphs"]) == ["forward"] and manifest["states"] == []
    loaded = ssmcc.load(str(tmp_path / "plain"))
    x = torch.randn(7, 4)
    with torch.no_grad():
        assert torch.allclose(loaded(x), module(x), atol=1e-6)


def test_a_program_loads_as_torch_export_loads_it(saved):
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from ssmcc.lowering.torch.program_load import load_program

    path = os.path.join(saved[2], "chunk.pt2")
    before = ShapeEnv.__dict__["_get_sloc"]
    with open(path, "rb") as f:
        ours, extra = load_program(f.read(), path, ("ssmcc_states.json",))
    theirs = torch.export.load(path)
    assert [s["name"] for s in json.loads(extra["ssmcc_states.json"])] == [
        s["name"] for s in saved[3]["states"]
    ]
    assert ShapeEnv.__dict__["_get_sloc"] is before  # put back after reading
    assert ours.graph_module.code == theirs.graph_module.code
    assert {str(s): (r.lower, r.upper) for s, r in ours.range_constraints.items()} == {
        str(s): (r.lower, r.upper) for s, r in theirs.range_constraints.items()
    }
    assert [str(spec) for spec in ours.graph_signature.input_specs] == [
        str(spec) for spec in theirs.graph_signature.input_specs
    ]


def test_loading_an_artifact_imports_no_tracing_stack(saved):
    """ssmcc.load of a torch artifact in a fresh process: the programs run, and neither torch's
    tracer (which load_program keeps the deserializer from importing) nor the pattern passes'
    networkx is imported."""
    import subprocess
    import sys

    script = (
        "import sys, torch, ssmcc\n"
        f"model = ssmcc.load({saved[2]!r})\n"
        "model.generate(torch.tensor([[1, 2, 3]]), 2)\n"
        "print(sorted(m for m in ('networkx', 'torch.export._trace', 'torch._inductor.codecache')"
        " if m in sys.modules))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"


def test_unreadable_program_is_named(saved, tmp_path):
    import shutil

    folder = shutil.copytree(saved[2], tmp_path / "broken")
    path = folder / "step.pt2"
    path.write_bytes(b"\0" * path.stat().st_size)
    loaded_error = r"step\.pt2 is not a readable torch\.export archive"
    with pytest.raises(ArtifactError, match=loaded_error):
        ssmcc.load(str(folder), verify=False)


@pytest.mark.slow
def test_cli_torch_and_onnx_artifacts_print_the_same_tokens(tmp_path, capsys):
    runs = {}
    for target in ("torch", "onnx"):
        out = str(tmp_path / target)
        assert main(["compile", "mamba-tiny", "--target", target, "--out", out]) == 0
        capsys.readouterr()
        assert main(["run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "8"]) == 0
        runs[target] = [int(t) for t in capsys.readouterr().out.split()]
    assert len(runs["torch"]) == 8 and runs["torch"] == runs["onnx"]
    for target in ("torch", "onnx"):
        loaded = ssmcc.load(str(tmp_path / target))
        assert loaded.target == target
        assert loaded.generate(torch.tensor([[1, 2, 3]]), 8)[0, 3:].tolist() == runs["torch"]
