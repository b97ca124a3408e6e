"""``chunk.onnx`` derived from ``prefill.onnx`` (``lowering/onnx/chunk_graph.py``) against the
chunk program exported on its own (``chunk_state_passing`` then ``torch.onnx``): the same last
logits and next states bit for bit, for prompts of one token and of many, from zero and from
carried states; the head runs on one position (no (b, l, v) value in the graph); a graph whose
logits are not a head through position-wise ops is not derived."""

from __future__ import annotations

import onnx
import pytest
import torch
from onnx import helper

import ssmcc
import ssmcc.lowering.onnx.target as onnx_target
from ssmcc.lowering.onnx.chunk_graph import chunk_from_prefill

from .conftest import make_hf_model


def _exported_chunk(monkeypatch, model, **options):
    with monkeypatch.context() as patch:
        patch.setattr(onnx_target, "chunk_from_prefill", lambda prefill: None)
        return ssmcc.compile(model, target="onnx", **options)


def _states(compiled, batch: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    states = []
    for spec in compiled.executable.specs:
        shape = [batch, *(3 if axis in spec.grows else n for axis, n in enumerate(spec.shape))]
        states.append(torch.randn(shape, generator=generator).to(getattr(torch, spec.dtype)))
    return states


def _same_chunks(derived, exported, vocab: int):
    for batch, length, seed in ((1, 1, 0), (2, 9, 1), (3, 33, 2)):
        ids = torch.randint(
            0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)
        )
        zeros = [torch.zeros_like(s) for s in _states(derived, batch, seed)]
        for states in (zeros, _states(derived, batch, seed)):
            got = derived.executable.run("chunk", ids, *states)
            want = exported.executable.run("chunk", ids, *states)
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert a.shape == b.shape and torch.equal(a, b)


def _derived_in(compiled) -> bool:
    path = compiled.executable.file_paths()["chunk.onnx"]
    names = {n.name for n in onnx.load(path, load_external_data=False).graph.node}
    return "chunk.last_position.slice" in names


@pytest.mark.parametrize("family", ["mamba", "mamba2"])
def test_derived_chunk_equals_the_exported_one(monkeypatch, family):
    model = make_hf_model(family)
    derived = ssmcc.compile(model, target="onnx")
    assert _derived_in(derived)
    _same_chunks(derived, _exported_chunk(monkeypatch, model), 101)


@pytest.mark.parametrize("quantize", ["int8", "bf16"])
def test_a_head_on_weights_stored_small_is_exported(quantize):
    """The prefill graph widens such a head's weights for its many rows; the chunk program's
    export reads them small on one row (QuantizedLinear, HalfLinear), so it is kept."""
    compiled = ssmcc.compile(make_hf_model("mamba"), target="onnx", quantize=quantize)
    assert not _derived_in(compiled)
    path = compiled.executable.file_paths()["chunk.onnx"]
    heads = {n.op_type for n in onnx.load(path, load_external_data=False).graph.node}
    assert heads & {"QuantizedLinear", "HalfLinear"}


@pytest.mark.slow
def test_a_hybrid_chunk_equals_the_exported_one(monkeypatch):
    """granite-hybrid-tiny: logits scaled after the head (a Div), attention K/V states, MoE.
    (Every family's chunked prefill is checked against its prefill in test_hybrids.)"""
    from .test_hybrids import hybrid

    model = hybrid("granite-hybrid-tiny")
    derived = ssmcc.compile(model, target="onnx")
    assert _derived_in(derived)
    _same_chunks(derived, _exported_chunk(monkeypatch, model), model.config.vocab_size)


def test_the_head_runs_on_the_last_position_only():
    compiled = ssmcc.compile(make_hf_model("mamba"), target="onnx", onnx_functions="inline")
    path = compiled.executable.file_paths()["chunk.onnx"]
    inferred = onnx.shape_inference.infer_shapes(onnx.load(path, load_external_data=False))
    shapes = [
        [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in [*inferred.graph.value_info, *inferred.graph.output]
    ]
    assert ["batch", 101] in shapes
    assert not any(len(s) == 3 and s[1] == "seq" and s[2] == 101 for s in shapes), shapes


def _graph_with_logits(*nodes, initializers=()):
    hidden = helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, ["b", "l", 4])
    weight = helper.make_tensor("w", onnx.TensorProto.FLOAT, [4, 5], [0.0] * 20)
    logits = helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, ["b", "l", 5])
    graph = helper.make_graph(
        list(nodes), "g", [hidden], [logits], [weight, *initializers], value_info=[hidden]
    )
    return helper.make_model(graph)


def test_logits_not_reached_through_position_wise_ops_are_not_derived():
    cumulative = _graph_with_logits(
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("CumSum", ["p", "axis"], ["logits"]),
        initializers=[helper.make_tensor("axis", onnx.TensorProto.INT64, [], [1])],
    )
    assert chunk_from_prefill(cumulative) is None
    per_position_scale = _graph_with_logits(
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Mul", ["p", "scale"], ["logits"]),
        initializers=[helper.make_tensor("scale", onnx.TensorProto.FLOAT, [1, 3, 5], [1.0] * 15)],
    )
    assert chunk_from_prefill(per_position_scale) is None
    scaled = _graph_with_logits(
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Div", ["p", "scale"], ["logits"]),
        initializers=[helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [2.0])],
    )
    chunk = chunk_from_prefill(scaled)
    assert [n.op_type for n in chunk.graph.node] == ["Slice", "MatMul", "Div", "Gather"]
    assert [
        d.dim_param or d.dim_value for d in chunk.graph.output[0].type.tensor_type.shape.dim
    ] == [
        "b",
        5,
    ]
    assert [n.op_type for n in scaled.graph.node] == ["MatMul", "Div"]  # the prefill is kept


def test_a_head_output_read_elsewhere_is_not_derived():
    shared = _graph_with_logits(
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Div", ["p", "scale"], ["logits"]),
        helper.make_node("ReduceSum", ["p"], ["total"]),
        initializers=[helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [2.0])],
    )
    assert chunk_from_prefill(shared) is None


def test_a_head_output_read_inside_a_subgraph_is_not_derived():
    """A value on the head path read by a node of an If branch (an outer-scope read) counts."""
    branch = helper.make_graph(
        [helper.make_node("Identity", ["p"], ["seen"])],
        "branch",
        [],
        [helper.make_tensor_value_info("seen", onnx.TensorProto.FLOAT, None)],
    )
    read_in_branch = _graph_with_logits(
        helper.make_node("MatMul", ["h", "w"], ["p"]),
        helper.make_node("Div", ["p", "scale"], ["logits"]),
        helper.make_node("If", ["flag"], ["chosen"], then_branch=branch, else_branch=branch),
        initializers=[
            helper.make_tensor("scale", onnx.TensorProto.FLOAT, [], [2.0]),
            helper.make_tensor("flag", onnx.TensorProto.BOOL, [], [True]),
        ],
    )
    assert chunk_from_prefill(read_in_branch) is None
