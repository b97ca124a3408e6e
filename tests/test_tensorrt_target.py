"""The tensorrt target where TensorRT cannot run: ``ssmcc compile --target tensorrt`` writes a
data-only artifact (plugin-bound graphs, weights, PTX for four architectures, kernel manifest,
profiles, the build command), every file its manifest names is there, each plugin node finds its
binary by the key its ``aot_impl`` computes, running says what is missing, and a refused model
leaves nothing on disk.

Default: mamba-tiny. Slow: mamba-130m (the acceptance's model)."""

from __future__ import annotations

import functools
import glob
import json
import os
import tempfile

import onnx
import pytest
import torch

import ssmcc
from ssmcc.cli import main
from ssmcc.errors import LoweringError, OptionError
from ssmcc.presets import build_preset
from ssmcc.runtime.artifact import sha256_of

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton.aot import DEFAULT_ARCHS  # noqa: E402
from ssmcc.lowering.tensorrt.graphs import node_attributes, plugin_nodes  # noqa: E402
from ssmcc.lowering.tensorrt.kernels_aot import (  # noqa: E402
    KERNELS_FILE,
    _value_shapes,
    launch_description,
)
from ssmcc.lowering.tensorrt.plugin_launch import launch_plugin  # noqa: E402
from ssmcc.lowering.tensorrt.specs import CHAINS, INT_OPS, SPECS  # noqa: E402
from ssmcc.lowering.tensorrt.target import tensorrt_missing  # noqa: E402

DATA_SUFFIXES = (".onnx", ".json", ".ptx", ".bin")


@functools.cache
def _artifact(name: str) -> str:
    folder = os.path.join(tempfile.mkdtemp(prefix="ssmcc-test-trt-"), name)
    assert main(["compile", name, "--target", "tensorrt", "--out", folder]) == 0
    return folder


def _check_artifact(folder: str) -> dict:
    manifest = json.loads(open(os.path.join(folder, "manifest.json")).read())
    assert manifest["target"] == "tensorrt"
    listed = manifest["files"]
    assert set(os.listdir(folder)) == set(listed) | {"manifest.json"}
    for name, entry in listed.items():  # every file it names, as it names it
        path = os.path.join(folder, name)
        assert os.path.getsize(path) == entry["bytes"] and sha256_of(path) == entry["sha256"]
        assert name.endswith(DATA_SUFFIXES), f"{name}: the artifact holds data only"
    kernels = json.loads(open(os.path.join(folder, KERNELS_FILE)).read())
    assert kernels["archs"] == list(DEFAULT_ARCHS) == manifest["plugins"]["archs"]
    keys = {e["specialization"] for e in kernels["kernels"]}
    for key in keys:  # each specialisation for each architecture
        archs = sorted(e["arch"] for e in kernels["kernels"] if e["specialization"] == key)
        assert archs == sorted(DEFAULT_ARCHS)
    for entry in kernels["kernels"]:
        ptx = open(os.path.join(folder, entry["ptx"])).read()
        assert f".entry {entry['entry']}(" in ptx and f".target {entry['arch']}" in ptx
    for graph, entry in manifest["graphs"].items():
        assert entry["file"] in listed
        profile = manifest["profiles"][graph]
        assert [v["name"] for v in entry["inputs"]] == list(profile)
        for ranges in profile.values():
            assert all(a <= b <= c for a, b, c in zip(*ranges.values(), strict=True))
        assert f"--onnx=DIR/{graph}.onnx" in manifest["build"]["trtexec"][graph]
    assert manifest["build"]["command"] == "ssmcc trt-build DIR"
    return manifest


def test_compile_writes_a_data_only_artifact_whose_manifest_names_every_file():
    manifest = _check_artifact(_artifact("mamba-tiny"))
    assert set(manifest["graphs"]) == {"prefill", "chunk", "step"}
    assert manifest["plugins"] == {
        **manifest["plugins"],
        "namespace": "ssmcc",
        "version": "1",
        "kernels": KERNELS_FILE,
    }


def test_the_stateful_graphs_hold_only_ops_with_a_plugin():
    """prefill, chunk and step are derived under the compile's gates (the fused mixers have no
    plugin): each holds a plugin node per ssmcc op, the unfused scan (as its chain of plugins)
    and conv among them."""
    folder = _artifact("mamba-tiny")
    scan = set(CHAINS["SelectiveScan"])
    expected = {
        "prefill": {"CausalConv1d", *scan, "RmsNormGated"},
        "chunk": {"CausalConv1d", *scan, "RmsNormGated"},
        "step": {"CausalConv1dUpdate", "SelectiveStateUpdate", "RmsNormGated"},
    }
    for graph, op_types in expected.items():
        model = onnx.load(os.path.join(folder, f"{graph}.onnx"), load_external_data=False)
        ssmcc_nodes = {n.op_type for n in model.graph.node if n.domain == "ssmcc"}
        assert ssmcc_nodes == op_types and ssmcc_nodes <= set(SPECS), graph


def test_each_plugin_node_finds_its_binary_by_the_aot_impl_key():
    """What each node's ``aot_impl`` computes (over ints here: batch 3, 37 positions) names a
    binary of the artifact, and its grid and extras are what the kernel is launched with (a
    chain's intermediates' dims named ``cdiv(seq,Q)`` evaluated too)."""
    folder = _artifact("mamba-tiny")
    kernels = json.loads(open(os.path.join(folder, KERNELS_FILE)).read())
    built = {e["specialization"] for e in kernels["kernels"]}
    sizes = {"batch": 3, "seq": 37}

    def size(d):
        if isinstance(d, str) and d.startswith("cdiv("):
            name, chunk = d[len("cdiv("):-1].split(",")
            return INT_OPS.cdiv(sizes[name], int(chunk))
        return sizes.get(d, d) if isinstance(d, str) else d
    for graph in ("prefill", "chunk", "step"):
        model = onnx.load(os.path.join(folder, f"{graph}.onnx"), load_external_data=False)
        shapes = _value_shapes(model)
        nodes = plugin_nodes(model)
        assert nodes
        for node in nodes:
            spec = SPECS[node.op_type]
            values = dict(zip(spec.inputs, node.input, strict=True))
            dims = {
                n: tuple(size(d) for d in shapes[v][0])
                for n, v in values.items()
            }
            static = {key: dims[key[0]][key[1]] for key in spec.static_dims}
            types = dict.fromkeys(spec.inputs, "*fp32")
            attributes = node_attributes(node)
            key, grid, extras = launch_description(spec, dims, attributes, types, static, INT_OPS)
            assert key in built, (graph, node.name)
            assert all(isinstance(g, int) and g >= 1 for g in grid)
            assert all(isinstance(e, int) and 0 < e < 2**31 for e in extras)


def test_a_node_of_the_artifact_runs_as_its_plugin_would():
    """One plugin node of mamba-tiny's step graph, given random inputs of its shapes, computed by
    its kernel launched as TensorRT would launch it, equals the op's reference."""
    from tests.test_tensorrt_plugins import call_op

    folder = _artifact("mamba-tiny")
    model = onnx.load(os.path.join(folder, "step.onnx"), load_external_data=False)
    shapes = _value_shapes(model)
    node = next(n for n in plugin_nodes(model) if n.op_type == "SelectiveStateUpdate")
    spec = SPECS[node.op_type]
    generator = torch.Generator().manual_seed(0)
    inputs = {}
    for name, value in zip(spec.inputs, node.input, strict=True):
        dims = [2 if isinstance(d, str) else d for d in shapes[value][0]]
        inputs[name] = torch.randn(dims, generator=generator)
    inputs["A"] = -inputs["A"].abs()
    attributes = node_attributes(node)
    got = launch_plugin(spec, inputs, attributes)
    for g, e in zip(got, call_op(node.op_type, inputs, attributes), strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(tensorrt_missing() is None, reason="TensorRT runs here: nothing is missing")
def test_running_without_tensorrt_fails_with_one_clear_message(capsys):
    compiled = ssmcc.load(_artifact("mamba-tiny"))
    with pytest.raises(OptionError, match="runs on TensorRT, and .*ssmcc trt-build .*mamba"):
        compiled(torch.tensor([[1, 2, 3]]))
    with pytest.raises(OptionError, match="runs on TensorRT"):
        compiled.generate(torch.tensor([[1, 2, 3]]), max_new_tokens=2)
    folder = _artifact("mamba-tiny")
    assert main(["run", folder, "--prompt-ids", "1,2"]) == 1  # a saved artifact: build it next
    err = capsys.readouterr().err
    assert f"run `ssmcc trt-build {os.path.abspath(folder)}`" in err or (
        f"run `ssmcc trt-build {folder}`" in err
    ), err
    assert "save it" not in err
    assert main(["trt-build", folder]) == 1
    captured = capsys.readouterr()
    assert "building engines needs TensorRT" in captured.err
    assert captured.out.count("trtexec --onnx=") == 3 and folder in captured.out


def test_the_plugin_module_registers_where_tensorrt_imports():
    missing = tensorrt_missing()
    if missing is not None:
        pytest.skip(f"tensorrt.plugin cannot register here: {missing}")
    from ssmcc.lowering.tensorrt.plugins import register_plugins

    ids = register_plugins(_artifact("mamba-tiny"))
    assert ids == sorted(spec.plugin_id for spec in SPECS.values())


def test_a_failure_while_writing_leaves_nothing_on_disk(tmp_path, monkeypatch):
    """A failure after the graphs are written (here: the PTX build) leaves neither the artifact
    nor the target's working directory behind."""
    from ssmcc.lowering.tensorrt import target

    def failing(models, folder, archs):
        assert {f"{g}.onnx" for g in models} <= set(os.listdir(folder))  # written by then
        raise LoweringError("ptxas died")

    monkeypatch.setattr(target, "build_plugin_kernels", failing)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ssmcc-tensorrt-*")))
    out = tmp_path / "m"
    assert main(["compile", "mamba-tiny", "--target", "tensorrt", "--out", str(out)]) == 1
    assert os.listdir(tmp_path) == []
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ssmcc-tensorrt-*"))) == before


def test_a_model_that_does_not_stream_is_refused():
    model = torch.nn.Sequential(torch.nn.Linear(4, 4))
    with pytest.raises(LoweringError, match="target 'tensorrt' builds prefill, chunk and step"):
        ssmcc.compile(model, target="tensorrt", example_inputs=(torch.randn(2, 4),))


def test_options_are_checked():
    model = build_preset("mamba-tiny").eval()
    with pytest.raises(OptionError, match="unknown architecture"):
        ssmcc.compile(model, target="tensorrt", archs="sm_42")
    with pytest.raises(OptionError, match="max_batch"):
        ssmcc.compile(model, target="tensorrt", max_batch=0)


def test_coverage_names_the_plugins():
    from ssmcc.lowering.registry import coverage

    rows = {r["op"]: r for r in coverage() if r["backend"] == "tensorrt"}
    for spec in SPECS.values():
        assert rows[spec.op]["status"] == "supported"
        assert f"ssmcc::{spec.op_type}" in rows[spec.op]["detail"]
    assert rows["attention"]["status"] == "supported"  # standard ONNX ops: TensorRT's layers
    assert rows["mamba_mixer"]["status"] == "unsupported"


@pytest.mark.slow
def test_mamba_130m_artifact():
    manifest = _check_artifact(_artifact("mamba-130m"))
    assert manifest["ssmcc_ops"]["selective_scan"] == 24


def _ort_feeds(session, ids: torch.Tensor, states: dict | None) -> dict:
    import numpy as np

    feeds = {"input_ids": ids.numpy()}
    for value in session.get_inputs()[1:]:
        dtype = np.int64 if value.type == "tensor(int64)" else np.float32
        if states is not None:
            feeds[value.name] = states[value.name].numpy().astype(dtype)
            continue
        sizes = {"batch": ids.shape[0], "past": 0}
        feeds[value.name] = np.zeros([sizes.get(d, d) for d in value.shape], dtype)
    return feeds


@pytest.mark.parametrize(
    "name",
    [
        "mamba-tiny",
        "mamba2-tiny",
        "granite-hybrid-tiny",
        pytest.param("jamba-tiny", marks=pytest.mark.slow),  # Mamba-1, attention and MoE
    ],
)
def test_the_artifacts_graphs_compute_what_the_onnx_target_does(name):
    """The TensorRT artifact's prefill and step graphs, run in stock ONNX Runtime (which expands
    each plugin node's function body), equal the ONNX target's programs of the same model:
    logits and next states, batch 2, 7 positions then one step (1e-4)."""
    import onnxruntime as ort

    folder = _artifact(name)
    model = build_preset(name).eval()
    reference = ssmcc.compile(model, target="onnx")
    ids = torch.randint(0, reference.vocab_size, (2, 7), generator=torch.Generator().manual_seed(1))
    logits, state = reference.prefill(ids)
    prefill = ort.InferenceSession(os.path.join(folder, "prefill.onnx"))
    got = prefill.run(None, _ort_feeds(prefill, ids, None))
    torch.testing.assert_close(torch.from_numpy(got[0]), logits, atol=1e-4, rtol=1e-4)
    names = [o.name.removesuffix(".next") for o in prefill.get_outputs()[1:]]
    states = {n: torch.from_numpy(v) for n, v in zip(names, got[1:], strict=True)}
    for key in names:
        torch.testing.assert_close(states[key], state[key], atol=1e-4, rtol=1e-4)
    token = logits[:, -1].argmax(-1)
    step_logits, _ = reference.step(token, state)
    step = ort.InferenceSession(os.path.join(folder, "step.onnx"))
    got = step.run(None, _ort_feeds(step, token[:, None], states))
    torch.testing.assert_close(
        torch.from_numpy(got[0]).reshape(step_logits.shape), step_logits, atol=1e-4, rtol=1e-4
    )
