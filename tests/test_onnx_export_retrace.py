"""The ONNX lowering's export without torch.onnx's decomposition retrace
(``lowering/onnx/export.py``: ``_export``): where a program needs no decomposition (every node
has an ONNX translation as it stands, nothing mutates, ``aten.to`` written as the decomposition
would write it) it is translated directly, else exported through ``torch.onnx``'s whole path.
Both paths must give the same model: logits and greedy tokens bit-identical, the same nodes.
"""

from __future__ import annotations

import collections

import onnx
import pytest
import torch

import ssmcc
import ssmcc.lowering.onnx.export as onnx_export
from ssmcc.lowering.onnx.export import (
    _functional_casts,
    _graph_copy,
    _needs_decomposition,
    _registry_with,
    _translation_table,
)
from ssmcc.passes.program_set import ProgramSet

from .conftest import make_hf_model


def _whole_path(monkeypatch):
    monkeypatch.setattr(onnx_export, "_needs_decomposition", lambda program, registry: ["test"])


def _nodes(compiled) -> dict[str, collections.Counter]:
    paths = compiled.executable.file_paths()
    found = {}
    for graph, entry in compiled.executable.graph_entries.items():
        model = onnx.load(paths[entry["file"]], load_external_data=False)
        found[graph] = collections.Counter((n.domain, n.op_type) for n in model.graph.node)
    return found


def _direct_and_whole(model, monkeypatch, **options):
    ids = torch.randint(
        0, model.config.vocab_size, (2, 19), generator=torch.Generator().manual_seed(1)
    )
    direct = ssmcc.compile(model, target="onnx", **options)
    with monkeypatch.context() as patch:
        _whole_path(patch)
        whole = ssmcc.compile(model, target="onnx", **options)
    return direct, whole, ids


@pytest.mark.parametrize(
    "quantize",
    [pytest.param(q, marks=pytest.mark.slow) for q in ("none", "int8")],  # 7-15 s each
)
def test_mamba_programs_need_no_decomposition_and_export_the_same(monkeypatch, quantize):
    model = make_hf_model("mamba")
    compiled = ssmcc.compile(model, target="torch", quantize=quantize)
    programs = ProgramSet(compiled.program, token_model=True)
    for graph in ("forward", "prefill", "chunk", "step"):
        program = _graph_copy(programs.program(graph))
        _functional_casts(program.graph)
        registry = _registry_with(_translation_table(program, True))
        assert _needs_decomposition(program, registry) == [], graph
    direct, whole, ids = _direct_and_whole(model, monkeypatch, quantize=quantize)
    assert torch.equal(direct(ids), whole(ids))
    assert torch.equal(
        direct.generate(ids, max_new_tokens=4), whole.generate(ids, max_new_tokens=4)
    )
    assert _nodes(direct) == _nodes(whole)


def test_casts_become_what_the_decomposition_writes():
    class Casts(torch.nn.Module):
        def forward(self, ids, x):
            position = ids.to(torch.float32)  # a real cast: _to_copy
            same = x.to(device=x.device, dtype=torch.float32)  # nothing changes: x itself
            return position * same

    program = torch.export.export(
        Casts(), (torch.arange(6).reshape(2, 3), torch.ones(2, 3)), strict=False
    )
    copied = _graph_copy(program)
    _functional_casts(copied.graph)
    targets = [n.target for n in copied.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.to.dtype not in targets and torch.ops.aten.to.device not in targets
    assert targets.count(torch.ops.aten._to_copy.default) == 1
    # the compiled model keeps its program as it was
    kept = [n.target for n in program.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.to.dtype in kept


def test_a_mutating_op_takes_the_whole_path():
    class InPlace(torch.nn.Module):
        def forward(self, x):
            y = x * 2
            y.div_(3.0)
            return y

    program = torch.export.export(InPlace(), (torch.ones(2, 3),), strict=False)
    needs = _needs_decomposition(program, _registry_with({}))
    assert needs == ["aten.div_.Tensor"]


@pytest.mark.slow
def test_a_hybrid_exports_the_same_either_way(monkeypatch):
    """granite-hybrid-tiny takes the direct path, its rotary embedding's casts rewritten.
    (nemotron-h-tiny's router divides in place: it takes the whole path, as every program did.)"""
    from .test_hybrids import hybrid

    model = hybrid("granite-hybrid-tiny")
    direct, whole, ids = _direct_and_whole(model, monkeypatch)
    assert torch.equal(direct(ids), whole(ids))
    assert torch.equal(
        direct.generate(ids, max_new_tokens=4), whole.generate(ids, max_new_tokens=4)
    )
    # the direct path computes one reshape's shape in the graph (a Concat of shape pieces)
    # where the retrace had folded it
    direct_nodes, whole_nodes = _nodes(direct), _nodes(whole)
    for graph, counts in direct_nodes.items():
        extra = counts - whole_nodes[graph]
        assert not whole_nodes[graph] - counts, graph
        assert set(extra) <= {("", "Concat")} and sum(extra.values()) <= 1, (graph, extra)


def test_a_cast_that_is_an_output_is_exported():
    """A cast the signature names as an output is left to torch.onnx's whole path."""
    import onnxruntime

    from ssmcc.lowering.onnx.export import lower_to_onnx

    class CastOut(torch.nn.Module):
        def forward(self, ids):
            return ids.to(torch.float32), ids.to(device=ids.device, dtype=torch.float32) * 2

    program = torch.export.export(CastOut(), (torch.arange(6).reshape(2, 3),), strict=False)
    model = lower_to_onnx(program, ["ids"], ["as_float", "doubled"])
    session = onnxruntime.InferenceSession(model.SerializeToString())
    ids = torch.arange(6).reshape(2, 3).numpy()
    as_float, doubled = session.run(None, {"ids": ids})
    assert as_float.dtype.name == "float32" and (as_float == ids).all()
    assert (doubled == 2 * ids).all()
