"""ssmcc.compile(target="onnx"): HF Mamba / FalconMamba through ONNX Runtime, with the ssmcc
custom-op library and with the portable function bodies only."""

from __future__ import annotations

import os

import onnx
import pytest
import torch

import ssmcc
from ssmcc.kernels.cpu import build_ort_library

from .conftest import FAMILIES, make_hf_model

TOLERANCE = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def model_and_artifact(request, tmp_path_factory):
    model = make_hf_model(request.param)
    compiled = ssmcc.compile(model, target="onnx")
    folder = tmp_path_factory.mktemp(request.param) / "artifact"
    compiled.save(str(folder))
    return model, compiled, str(folder)


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("length", [1, 7, 64, 300])
def test_onnx_matches_eager(model_and_artifact, kernels, batch, length):
    model, _, folder = model_and_artifact
    loaded = ssmcc.load(folder, kernels=kernels, verify=False)
    expected_kernels = "ssmcc ORT library" if kernels == "auto" else "portable function bodies"
    for graph in ("prefill", "chunk", "step"):
        assert loaded.executable.session(graph).ssmcc_kernels == expected_kernels
    ids = torch.randint(
        0, model.config.vocab_size, (batch, length), generator=torch.Generator().manual_seed(length)
    )
    with torch.no_grad():
        expected = model(ids).logits
    got = loaded(ids)
    assert got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOLERANCE


def test_the_ort_library_builds_here():
    """CI fetches the ORT headers: the library must build (not silently fall back)."""
    assert build_ort_library() is not None


def test_one_custom_node_per_op_per_layer_and_full_check(model_and_artifact):
    model, compiled, folder = model_and_artifact
    proto = onnx.load(os.path.join(folder, "prefill.onnx"))
    onnx.checker.check_model(proto, full_check=True)
    custom = [n.op_type for n in proto.graph.node if n.domain == "ssmcc"]
    layers = model.config.num_hidden_layers
    assert sorted(custom) == ["MambaMixer"] * layers + ["RmsNormGated"] * (layers + 1)
    # the fused mixer's portable body calls the conv and scan bodies
    assert sorted((f.domain, f.name) for f in proto.functions) == [
        ("ssmcc", "CausalConv1d"),
        ("ssmcc", "MambaMixer"),
        ("ssmcc", "RmsNormGated"),
        ("ssmcc", "SelectiveScan"),
    ]
    # Nothing outside the functions uses a loop: the recurrence is inside the ssmcc nodes.
    assert not {"Scan", "Loop"} & {n.op_type for n in proto.graph.node}
    dims = [
        [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]
        for i in proto.graph.input
    ]
    assert dims[0] == ["batch", "seq"]
    assert all(d[0] == "batch" for d in dims[1:]) and len(dims) == 1 + 2 * layers


@pytest.mark.parametrize("family", FAMILIES)
def test_artifact_size_is_the_weights(family, tmp_path):
    """Every graph shares one weights.bin: the files add up to the weights (within 5%). A_log
    (512 x 32, above onnxscript's default folding size) is stored folded as A = -exp(A_log):
    no graph computes it per call, and it takes A_log's place."""
    model = make_hf_model(
        family,
        vocab_size=4096,
        hidden_size=256,
        num_hidden_layers=2,
        state_size=32,
        time_step_rank=16,
    )
    compiled = ssmcc.compile(model, target="onnx")
    weights = sum({id(p): p.numel() * p.element_size() for p in model.parameters()}.values())
    folder = tmp_path / "artifact"
    manifest = compiled.save(str(folder))
    total = sum(entry["bytes"] for entry in manifest["files"].values())
    assert abs(total - weights) <= 0.05 * weights, (total, weights)
    for name in manifest["graphs"]:
        graph = onnx.load(str(folder / f"{name}.onnx"), load_external_data=False).graph
        assert not [n.name for n in graph.node if n.op_type == "Exp"], name


def test_manifest_describes_the_model(model_and_artifact):
    model, compiled, folder = model_and_artifact
    manifest = ssmcc.load(folder).manifest
    assert manifest["target"] == "onnx" and manifest["opset"] == {
        "": 20,
        "ssmcc": 1,
        "com.microsoft": 1,  # FusedMatMul: prefill products on the weights as stored
    }
    prefill = manifest["graphs"]["prefill"]
    assert prefill["inputs"][0] == {"name": "input_ids", "dtype": "int64", "dims": ["batch", "seq"]}
    assert prefill["outputs"][0]["dims"] == ["batch", "seq", model.config.vocab_size]
    for graph in ("chunk", "step"):  # the last position's logits only
        assert manifest["graphs"][graph]["outputs"][0]["dims"] == [
            "batch",
            model.config.vocab_size,
        ]
    assert manifest["graphs"]["chunk"]["inputs"][0]["dims"] == ["batch", "seq"]
    assert sorted(manifest["files"]) == ["chunk.onnx", "prefill.onnx", "step.onnx", "weights.bin"]
    assert set(manifest["versions"]) >= {"ssmcc", "torch", "onnx", "onnxruntime"}
    assert all(len(entry["sha256"]) == 64 for entry in manifest["files"].values())


def test_portable_body_is_what_runs_without_library(tmp_path):
    """Replace the SelectiveScan function body by a wrong one: the library's kernel must take
    precedence (right logits), and without the library the (wrong) body must run."""
    import shutil

    import numpy as np
    from onnx import helper

    from ssmcc.lowering.onnx.runtime import make_session

    model = make_hf_model("mamba", num_hidden_layers=1)
    compiled = ssmcc.compile(model, target="onnx")
    folder = shutil.copytree(compiled.executable.folder, tmp_path / "copy")
    proto = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
    index = next(i for i, f in enumerate(proto.functions) if f.name == "SelectiveScan")
    wrong = helper.make_function(
        "ssmcc",
        "SelectiveScan",
        list(proto.functions[index].input),
        ["out", "last_state"],
        [
            helper.make_node("Identity", ["u"], ["out"]),
            helper.make_node("Identity", ["initial_state"], ["last_state"]),
        ],
        list(proto.functions[index].opset_import),
        attributes=["delta_softplus", "has_z"],
    )
    proto.functions[index].CopyFrom(wrong)
    path = str(folder / "wrong_body.onnx")
    onnx.save(proto, path)  # next to weights.bin, which it references

    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    feed = {"input_ids": ids.numpy()}
    for spec in compiled.state_specs:
        feed[spec.name] = np.zeros((2, *spec.shape), dtype=np.float32)

    def run(kernels):
        return torch.from_numpy(make_session(path, kernels).run(["logits"], feed)[0])

    assert (run("auto") - expected).abs().max() <= TOLERANCE
    assert (run("reference") - expected).abs().max() > 1e-2
