"""The TensorRT target's SSD scan as a chain of five plugin nodes (``lowering/tensorrt/
ssd_chain.py``): the shape rules against the op's fake implementation and the Triton target's
intermediates, the chain's kernels launched node by node as TensorRT's AOT plugins launch them
(Triton's interpreter) against ``ssd_scan``'s reference at ``tests/fuzzing.py``'s tolerances, the
chain's ONNX function bodies against the ``SsdScan`` body in ONNX Runtime, and every kernel of
the chain compiled for sm_90 (the AOT path of ``kernels_aot.py``) with no register spills."""

from __future__ import annotations

import math
import random

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto, helper
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton")

from ssmcc.errors import LoweringError  # noqa: E402
from ssmcc.lowering.tensorrt.plugin_launch import launch_plugin, output_shapes  # noqa: E402
from ssmcc.lowering.tensorrt.specs import CHAINS, FLOAT32, SPECS  # noqa: E402
from ssmcc.lowering.tensorrt.ssd_chain import CHAIN, split_ssd_scans  # noqa: E402
from ssmcc.ops import SSMCC_OPS, ssd_scan_ref  # noqa: E402
from tests.fuzzing import TOLERANCES  # noqa: E402
from tests.graph_feeds import random_feeds  # noqa: E402

SCAN_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")


def _inputs(b, length, h, p, g, n, make) -> dict:
    shapes = dict(
        x=(b, length, h, p), dt=(b, length, h), A=(h,), B=(b, length, g, n), C=(b, length, g, n),
        D=(h, p), z=(b, length, h, p), dt_bias=(h,), initial_state=(b, h, p, n),
    )
    return {name: make(shape, name) for name, shape in shapes.items()}


def _run_chain(inputs: dict, attributes: dict) -> dict:
    """Every value of the chain: the node's inputs, then each node's outputs, as its plugin
    kernel computes them from the values before it."""
    values = dict(inputs)
    for op_type, names, outputs, attribute_names in CHAIN:
        given = {a: attributes[a] for a in attribute_names}
        got = launch_plugin(SPECS[op_type], {k: values[k] for k in names}, given)
        assert len(got) == len(outputs)
        values.update(zip(outputs, got, strict=True))
    return values


def test_the_chain_table_and_the_specs_agree():
    assert CHAINS["SsdScan"] == tuple(c[0] for c in CHAIN)
    for op_type, inputs, outputs, attributes in CHAIN:
        spec = SPECS[op_type]
        assert spec.inputs == inputs and spec.outputs == outputs and spec.part_of == "SsdScan"
        assert tuple(name for name, _ in spec.attributes) == attributes


def test_shape_rules_equal_the_op_and_the_pieces_on_random_shapes():
    """The chain's last outputs (out, final_state) have the op's fake shapes and dtypes; each
    intermediate's rule gives the Triton target's layout ((b, h, K, Q), (b, K, h, p, n),
    (b, K, g, Q, Q)), K = cdiv(l, Q), for 200 random shapes and chunks."""
    rng = random.Random("trt-ssd-chain")
    for _ in range(200):
        g = rng.choice([1, 2, 4])
        b, length = rng.randint(1, 9), rng.choice([1, 2, rng.randint(3, 700)])
        h, p, n = g * rng.randint(1, 4), rng.randint(1, 70), rng.randint(1, 130)
        chunk = rng.choice([16, 64, 256])
        attributes = dict(
            dt_softplus=1, has_z=rng.randint(0, 1), dt_min=0.0, dt_max=math.inf, chunk=chunk
        )
        dtype = rng.choice([torch.float32, torch.float16])
        with FakeTensorMode():
            make = lambda s, _, t=dtype: torch.empty(s, dtype=t)  # noqa: E731
            fake_inputs = _inputs(b, length, h, p, g, n, make)
            ref = SSMCC_OPS["ssd_scan"](
                *[fake_inputs[k] for k in SCAN_INPUTS[:-1]], True, 0.0, None,
                fake_inputs["initial_state"],
            )
        dims = {name: tuple(t.shape) for name, t in fake_inputs.items()}
        K = -(-length // chunk)
        dims["dt_chunks"] = dims["dA_cumsum"] = (b, h, K, chunk)
        dims["chunk_states"] = dims["chunk_starts"] = (b, K, h, p, n)
        dims["CB"] = (b, K, g, chunk, chunk)
        expected = {"out": tuple(ref[0].shape), "final_state": tuple(ref[1].shape)}
        expected.update({k: dims[k] for k in ("dt_chunks", "dA_cumsum", "chunk_states", "CB")})
        expected["chunk_starts"] = dims["chunk_starts"]
        for op_type, inputs, outputs, names in CHAIN:
            spec = SPECS[op_type]
            node_dims = {k: dims[k] for k in inputs}
            got = output_shapes(spec, node_dims, {a: attributes[a] for a in names})
            assert got == [expected[o] for o in outputs], (op_type, dims)
            for output, rule in zip(outputs, spec.output_dtypes, strict=True):
                kind = torch.float32 if rule == FLOAT32 else dtype
                assert kind == (ref[0].dtype if output == "out" else torch.float32), output


# (b, l, h, p, g, n, chunk, dt clamp, has_z, h0): odd lengths, one position, several groups
CASES = [
    (2, 37, 4, 5, 2, 3, 16, (0.001, 0.5), 1, True),
    (1, 1, 2, 19, 1, 7, 16, None, 0, True),
    (2, 50, 6, 8, 3, 16, 32, None, 1, False),
]


def _case(case, dtype):
    b, length, h, p, g, n, chunk, clamp, has_z, h0 = case
    generator = torch.Generator().manual_seed(length * 7 + p)

    def make(shape, name):
        value = torch.randn(shape, generator=generator)
        if name == "A":
            return (-torch.exp(0.7 * value)).to(dtype)
        if name == "dt":
            value = value - 1.0
        if name == "initial_state" and not h0:
            value = torch.zeros(shape)  # the emitters' zeros for an absent state
        return value.to(dtype)

    inputs = _inputs(b, length, h, p, g, n, make)
    attributes = dict(
        dt_softplus=1, has_z=has_z, dt_min=clamp[0] if clamp else 0.0,
        dt_max=clamp[1] if clamp else math.inf, chunk=chunk,
    )
    return inputs, attributes


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"L{c[1]}-h{c[2]}-p{c[3]}-g{c[4]}-Q{c[6]}")
def test_the_chain_equals_the_reference(case, dtype):
    """The five kernels, each given what TensorRT gives its node, compute ``ssd_scan``: out and
    final state against ``ssd_scan_ref`` on the inputs widened to float32, at the scan
    tolerances of ``tests/fuzzing.py`` (16-bit products: the float32 state held to the 16-bit
    tolerance too, as there)."""
    inputs, attributes = _case(case, dtype)
    values = _run_chain(inputs, attributes)
    wide = {k: v.float() for k, v in inputs.items()}
    dt_max = attributes["dt_max"]
    out, final = ssd_scan_ref(
        wide["x"], wide["dt"], wide["A"], wide["B"], wide["C"], wide["D"],
        wide["z"] if attributes["has_z"] else None, wide["dt_bias"], True,
        attributes["dt_min"], None if math.isinf(dt_max) else dt_max, wide["initial_state"],
    )
    rtol, atol = TOLERANCES["scan", dtype]
    assert values["out"].dtype == dtype and values["final_state"].dtype == torch.float32
    torch.testing.assert_close(values["out"].double(), out.double(), rtol=rtol, atol=atol)
    torch.testing.assert_close(values["final_state"].double(), final.double(), rtol=rtol, atol=atol)


def test_each_intermediate_equals_the_triton_targets():
    """Node by node, float32: dt and its running sum, the states entering each chunk and the
    causal half of C B^T equal what ``ssd_scan_chunked`` (the triton target's launches) makes
    with the same chunk."""
    from ssmcc.kernels.triton.ssd_scan import ssd_scan_chunked

    inputs, attributes = _case(CASES[0], torch.float32)
    values = _run_chain(inputs, attributes)
    t = inputs
    pieces = ssd_scan_chunked(
        t["x"], t["dt"], t["A"], t["B"], t["C"], t["D"], t["z"], t["dt_bias"], True,
        attributes["dt_min"], attributes["dt_max"], t["initial_state"], attributes["chunk"], None,
        False, None,
    )
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values["dt_chunks"], pieces.dt, **close)
    torch.testing.assert_close(values["dA_cumsum"], pieces.a, **close)
    torch.testing.assert_close(values["chunk_starts"], pieces.starts, **close)
    Q = attributes["chunk"]
    causal = torch.ones(Q, Q, dtype=torch.bool).tril()
    torch.testing.assert_close(values["CB"][..., causal], pieces.cb[..., causal], **close)
    torch.testing.assert_close(values["final_state"], pieces.final, **close)
    torch.testing.assert_close(values["out"], pieces.out, **close)


def test_a_chunk_that_is_not_a_power_of_two_is_refused():
    with pytest.raises(LoweringError, match="chunk attribute is 48; it must be a power of two"):
        SPECS["SsdChunkScan"].constexprs({"has_z": 1, "chunk": 48}, {("x", 3): 4}, {})


def _scan_model() -> onnx.ModelProto:
    from ssmcc.lowering.onnx.functions_ssd import ssd_scan_function
    from ssmcc.lowering.onnx.schemas import register_schemas

    register_schemas()
    b, h, p, g, n = 2, 4, 5, 2, 3
    shapes = dict(
        x=[b, "L", h, p], dt=[b, "L", h], A=[h], B=[b, "L", g, n], C=[b, "L", g, n], D=[h, p],
        z=[b, "L", h, p], dt_bias=[h], initial_state=[b, h, p, n],
    )
    node = helper.make_node(
        "SsdScan", list(shapes), ["out", "final"], name="scan0", domain="ssmcc",
        dt_softplus=1, has_z=1, dt_min=0.001, dt_max=math.inf,
    )
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in shapes.items()],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [b, "L", h, p]),
            helper.make_tensor_value_info("final", TensorProto.FLOAT, [b, h, p, n]),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ssmcc", 1)],
        functions=[ssd_scan_function(20)],
    )


@pytest.mark.parametrize("length", [1, 16, 37])
def test_the_chains_onnx_bodies_compute_the_scans(length):
    """The rewritten graph (five nodes, their model-local functions, the intermediates' value
    infos with K = cdiv(L, Q)) passes the full checker, and ONNX Runtime running the chain's
    bodies gives the SsdScan body's outputs (1e-5)."""
    import onnxruntime as ort

    model = _scan_model()
    feeds = random_feeds(model, length, seed=length)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert split_ssd_scans(model, chunk=16) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == list(CHAINS["SsdScan"])
    assert "SsdScan" not in {f.name for f in model.functions}
    infos = {v.name: v for v in model.graph.value_info}
    dims = [d.dim_value or d.dim_param for d in infos["scan0/CB"].type.tensor_type.shape.dim]
    assert dims == [2, "cdiv(L,16)", 2, 16, 16]
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pointer", ["*fp32", "*fp16", "*bf16"])
def test_every_chain_kernel_compiles_for_sm90_without_spills(tmp_path, pointer):
    """Each of the five kernels at mamba2-130m's shapes (head_dim 64, state 128, chunk 256),
    built as the artifact builds it (``kernels_aot.specialization``, ``aot.build``): PTX for
    sm_90 whose entry takes the node's inputs, extras and outputs, no spill (ptxas -v), and
    16-bit products on tensor cores (wgmma)."""
    from ssmcc.kernels.triton import aot
    from ssmcc.lowering.tensorrt.kernels_aot import specialization

    attributes = dict(dt_softplus=1, has_z=1, dt_min=0.0, dt_max=math.inf, chunk=256)
    static = {("x", 3): 64, ("B", 3): 128, ("initial_state", 2): 64, ("initial_state", 3): 128}
    made = []
    for op_type in CHAINS["SsdScan"]:
        spec = SPECS[op_type]
        types = {n: pointer if n in SCAN_INPUTS else "*fp32" for n in spec.inputs}
        made.append(
            specialization(
                op_type,
                {a: attributes[a] for a, _ in spec.attributes},
                {k: v for k, v in static.items() if k in spec.static_dims},
                types,
            )
        )
    manifest = aot.build(made, ("sm_90",), str(tmp_path / "k"))
    by_kernel = {SPECS[t].kernel: SPECS[t] for t in CHAINS["SsdScan"]}
    assert {e["kernel"] for e in manifest["kernels"]} == set(by_kernel)
    for entry in manifest["kernels"]:
        spec = by_kernel[entry["kernel"]]
        ptx = (tmp_path / "k" / entry["ptx"]).read_text()
        params = ptx.split(f".entry {entry['entry']}(")[1].split(")")[0].count(".param")
        assert params == len(spec.inputs) + len(spec.extras) + len(spec.outputs) + 2
        assert entry["spill_store_bytes"] == 0 == entry["spill_load_bytes"], entry
        if pointer != "*fp32" and "DOT" in entry["constexprs"]:
            assert "wgmma.mma_async.sync.aligned.m64n64k16.f32" in ptx, entry["kernel"]
