"""The TensorRT target's graphs and PTX where TensorRT cannot run: the ONNX lowering's portable
graphs with every ssmcc node bound to its plugin pass ``onnx.checker`` and hold one plugin node
per ssmcc op with the attributes TensorRT's parser reads, and every plugin kernel they need
compiles for each architecture (PTX, and a cubin from ptxas). That the bound graphs compute what
the ONNX target does: ``test_tensorrt_target.py``."""

from __future__ import annotations

import functools
import os

import onnx
import pytest

import ssmcc
from ssmcc.errors import LoweringError
from ssmcc.lowering.onnx.target import write_graphs
from ssmcc.lowering.tensorrt.graphs import bind_plugins, plugin_nodes
from ssmcc.lowering.tensorrt.specs import CHAINS, NAMESPACE, PLUGIN_VERSION, SPECS
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
        if name == "prefill":  # one node (or chain) per ssmcc op of the program, and per RMSNorm
            counts = {}
            for node in nodes:
                spec = SPECS[node.op_type]
                if spec.part_of and node.op_type != CHAINS[spec.part_of][0]:
                    continue  # a chain counts once, at its first node
                counts[spec.op] = counts.get(spec.op, 0) + 1
            norms = counts.pop("rmsnorm_gated")
            assert counts == layers
            assert norms == layers["selective_scan"] + 1  # each block's and the final one


def test_the_plugins_read_the_onnx_targets_domain():
    from ssmcc.lowering.onnx.schemas import DOMAIN
    from ssmcc.lowering.tensorrt.specs import ONNX_DOMAIN

    assert ONNX_DOMAIN == DOMAIN


def test_a_node_without_a_plugin_is_refused_by_name(tmp_path):
    """The ONNX Runtime form's nodes (products reading their weights in place) have no plugin."""
    programs = ProgramSet(_compiled("mamba-tiny").program, token_model=True)
    with pytest.raises(LoweringError, match=r"ssmcc\.Linear, which has no TensorRT plugin yet"):
        write_graphs(programs, str(tmp_path), "runtime", bind_plugins)


def test_every_plugin_kernel_compiles_for_four_archs(tmp_path):
    """Each specialisation the graphs of a Mamba-1 and a Mamba-2 model need builds to PTX and
    (ptxas) a cubin per architecture;
    the PTX entry takes the node's inputs, the extras and the outputs (+ Triton's 2 scratch
    pointers)."""
    specs = {}
    for name in ("mamba-tiny", "mamba2-tiny"):  # between them, every plugin
        graphs = _bound_graphs(name, tmp_path / name)
        models = _load(tmp_path / name, graphs)
        specs.update(graph_specializations({f"{name}.{g}": m for g, m in models.items()}))
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
