"""The TensorRT target's graphs and PTX where TensorRT cannot run: the ONNX lowering's portable
graphs with every ssmcc node bound to its plugin pass ``onnx.checker``, hold one plugin node per
ssmcc op with the attributes TensorRT's parser reads, still run in stock ONNX Runtime through
their function bodies (equal to the ONNX target), and every plugin kernel they need compiles for
each architecture (PTX, and a cubin from ptxas)."""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch

import ssmcc
from ssmcc.errors import LoweringError
from ssmcc.lowering.onnx.target import write_graphs
from ssmcc.lowering.tensorrt.graphs import bind_plugins, plugin_nodes
from ssmcc.lowering.tensorrt.specs import NAMESPACE, PLUGIN_VERSION, SPECS
from ssmcc.passes.program_set import ProgramSet
from ssmcc.presets import build_preset

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import aot  # noqa: E402
from ssmcc.lowering.tensorrt.kernels_aot import graph_specializations  # noqa: E402


@functools.cache
def _compiled(name: str):
    model = build_preset(name).eval()
    return ssmcc.compile(model, target="onnx", pipeline="unfused")


def _bound_graphs(name: str, folder) -> dict:
    programs = ProgramSet(_compiled(name).program, token_model=True)
    os.makedirs(folder, exist_ok=True)
    return write_graphs(programs, str(folder), "portable", bind_plugins)


def _load(folder, graphs) -> dict[str, onnx.ModelProto]:
    return {
        name: onnx.load(os.path.join(folder, entry["file"]), load_external_data=False)
        for name, entry in graphs.items()
    }


def test_every_ssmcc_node_is_bound_to_its_plugin(tmp_path):
    graphs = _bound_graphs("mamba-tiny", tmp_path)
    models = _load(tmp_path, graphs)
    compiled = _compiled("mamba-tiny")
    layers = compiled.info["ssmcc_ops"]
    assert set(models) == {"prefill", "chunk", "step"}
    for name, model in models.items():
        nodes = plugin_nodes(model)
        assert nodes and all(n.op_type in SPECS for n in nodes)
        for node in nodes:
            attributes = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            assert attributes["plugin_namespace"] == NAMESPACE.encode()
            assert attributes["plugin_version"] == PLUGIN_VERSION.encode()
            assert len(node.input) == len(SPECS[node.op_type].inputs)
            assert len(node.output) == len(SPECS[node.op_type].outputs)
        if name == "prefill":  # one node per ssmcc op of the program, and per RMSNorm
            counts = {}
            for node in nodes:
                op = SPECS[node.op_type].op
                counts[op] = counts.get(op, 0) + 1
            norms = counts.pop("rmsnorm_gated")
            assert counts == layers
            assert norms == layers["selective_scan"] + 1  # each block's and the final one


def _feeds(session, ids: torch.Tensor, state: dict | None) -> dict:
    feeds = {"input_ids": ids.numpy()}
    for value in session.get_inputs()[1:]:
        if state is not None:
            feeds[value.name] = state[value.name].numpy().astype(np.float32)
        else:
            dims = [ids.shape[0] if isinstance(d, str) else d for d in value.shape]
            feeds[value.name] = np.zeros(dims, np.float32)
    return feeds


def test_bound_graphs_run_in_stock_onnxruntime_through_their_bodies(tmp_path):
    """ONNX Runtime without ssmcc's library expands the functions the plugin nodes call: the
    graphs TensorRT gets compute what the ONNX target computes."""
    graphs = _bound_graphs("mamba-tiny", tmp_path)
    compiled = _compiled("mamba-tiny")
    ids = torch.randint(0, compiled.vocab_size, (3, 37), generator=torch.Generator().manual_seed(0))
    logits, state = compiled.prefill(ids)
    prefill = ort.InferenceSession(str(tmp_path / graphs["prefill"]["file"]))
    got = prefill.run(None, _feeds(prefill, ids, None))
    np.testing.assert_allclose(got[0], logits.numpy(), atol=1e-5, rtol=1e-5)
    names = [o.name for o in prefill.get_outputs()[1:]]
    after = {
        name.removesuffix(".next"): torch.from_numpy(v)
        for name, v in zip(names, got[1:], strict=True)
    }
    token = ids[:, -1:]
    step_logits, _ = compiled.step(token[:, 0], state)
    step = ort.InferenceSession(str(tmp_path / graphs["step"]["file"]))
    got = step.run(None, _feeds(step, token, after))
    np.testing.assert_allclose(
        got[0].reshape(step_logits.shape), step_logits.numpy(), atol=1e-5, rtol=1e-5
    )


def test_the_plugins_read_the_onnx_targets_domain():
    from ssmcc.lowering.onnx.schemas import DOMAIN
    from ssmcc.lowering.tensorrt.specs import ONNX_DOMAIN

    assert ONNX_DOMAIN == DOMAIN


def test_a_node_without_a_plugin_is_refused_by_name(tmp_path):
    with pytest.raises(LoweringError, match=r"ssmcc\.SsdScan, which has no TensorRT plugin yet"):
        _bound_graphs("mamba2-tiny", tmp_path / "m2")


def test_every_plugin_kernel_compiles_for_four_archs(tmp_path):
    """Each specialisation the graphs need builds to PTX and (ptxas) a cubin per architecture;
    the PTX entry takes the node's inputs, the extras and the outputs (+ Triton's 2 scratch
    pointers)."""
    graphs = _bound_graphs("mamba-tiny", tmp_path / "g")
    specs = graph_specializations(_load(tmp_path / "g", graphs))
    assert {s.kernel for s in specs.values()} == {spec.kernel for spec in SPECS.values()}
    manifest = aot.build(list(specs.values()), aot.DEFAULT_ARCHS, str(tmp_path / "k"))
    assert len(manifest["kernels"]) == len(specs) * 4
    by_kernel = {spec.kernel: spec for spec in SPECS.values()}
    for entry in manifest["kernels"]:
        spec = by_kernel[entry["kernel"]]
        ptx = (tmp_path / "k" / entry["ptx"]).read_text()
        cubin = (tmp_path / "k" / entry["cubin"]).read_bytes()
        assert f".target {entry['arch']}" in ptx and cubin[:4] == b"\x7fELF"
        params = ptx.split(f".entry {entry['entry']}(")[1].split(")")[0].count(".param")
        assert params == len(spec.inputs) + len(spec.extras) + len(spec.outputs) + 2
