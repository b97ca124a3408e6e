"""The TensorRT target's Mamba-1 scan as a chain of three plugin nodes (``lowering/tensorrt/
scan_chain.py``): the shape rules against the op's fake implementation, the chain's kernels
launched node by node as TensorRT's AOT plugins launch them (Triton's interpreter) against
``selective_scan``'s reference at ``tests/fuzzing.py``'s tolerances and against the triton
target's chunked launches, the chain's ONNX function bodies against the ``SelectiveScan`` body in
ONNX Runtime, and every kernel of the chain compiled for sm_90 (the AOT path of
``kernels_aot.py``) with no register spills."""

from __future__ import annotations

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
from ssmcc.lowering.tensorrt.scan_chain import CHAIN, split_selective_scans  # noqa: E402
from ssmcc.lowering.tensorrt.specs import CHAINS, FLOAT32, SPECS  # noqa: E402
from ssmcc.ops import SSMCC_OPS, selective_scan_ref  # noqa: E402
from tests.fuzzing import TOLERANCES  # noqa: E402
from tests.graph_feeds import random_feeds  # noqa: E402

SCAN_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")


def _inputs(b, d, length, g, n, make) -> dict:
    shapes = dict(
        u=(b, d, length), delta=(b, d, length), A=(d, n), B=(b, g, n, length),
        C=(b, g, n, length), D=(d,), z=(b, d, length), delta_bias=(d,), initial_state=(b, d, n),
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
    assert CHAINS["SelectiveScan"] == tuple(c[0] for c in CHAIN)
    for op_type, inputs, outputs, attributes in CHAIN:
        spec = SPECS[op_type]
        assert spec.inputs == inputs and spec.outputs == outputs
        assert spec.part_of == "SelectiveScan" and spec.op == "selective_scan"
        assert tuple(name for name, _ in spec.attributes) == attributes
    assert "SelectiveScan" not in SPECS  # no single-kernel plugin left


def test_shape_rules_equal_the_op_and_the_pieces_on_random_shapes():
    """The chain's last outputs (out, last_state) have the op's fake shapes and dtypes; each
    intermediate's rule gives the triton target's layout ((b, K, n, d), (b, K, d)), K =
    cdiv(l, chunk), for 200 random shapes and chunks."""
    rng = random.Random("trt-scan-chain")
    for _ in range(200):
        g = rng.choice([1, 1, 2, 4])
        b, length = rng.randint(1, 9), rng.choice([1, 2, rng.randint(3, 700)])
        d, n = g * rng.randint(1, 40), rng.randint(1, 24)
        chunk = rng.choice([1, 16, 37, 128])
        attributes = dict(delta_softplus=rng.randint(0, 1), has_z=rng.randint(0, 1), chunk=chunk)
        dtype = rng.choice([torch.float32, torch.float16])
        with FakeTensorMode():
            make = lambda s, _, t=dtype: torch.empty(s, dtype=t)  # noqa: E731
            fake = _inputs(b, d, length, g, n, make)
            ref = SSMCC_OPS["selective_scan"](
                *[fake[k] for k in SCAN_INPUTS[:-1]], bool(attributes["delta_softplus"]),
                fake["initial_state"],
            )
        dims = {name: tuple(t.shape) for name, t in fake.items()}
        K = -(-length // chunk)
        dims["chunk_ends"] = dims["chunk_starts"] = (b, K, n, d)
        dims["dt_sums"] = (b, K, d)
        expected = {"out": tuple(ref[0].shape), "last_state": tuple(ref[1].shape)}
        expected.update({k: dims[k] for k in ("chunk_ends", "dt_sums", "chunk_starts")})
        for op_type, inputs, outputs, names in CHAIN:
            spec = SPECS[op_type]
            given = {a: attributes[a] for a in names}
            got = output_shapes(spec, {k: dims[k] for k in inputs}, given)
            assert got == [expected[o] for o in outputs], (op_type, dims)
            for output, rule in zip(outputs, spec.output_dtypes, strict=True):
                kind = torch.float32 if rule == FLOAT32 else dtype
                assert kind == (ref[0].dtype if output == "out" else torch.float32), output


# (b, d, l, g, n, chunk, softplus, has_z, h0): one position, a length not a multiple of the chunk,
# several chunks, grouped B and C, a chunk longer than the sequence
CASES = [
    (1, 5, 1, 1, 3, 16, 1, 0, True),
    (2, 24, 37, 2, 5, 16, 1, 1, True),
    (2, 40, 50, 4, 16, 8, 0, 1, False),
    (1, 18, 20, 1, 7, 64, 1, 1, True),
    (3, 33, 45, 1, 4, 5, 1, 0, True),
]


def _case(case, dtype):
    b, d, length, g, n, chunk, softplus, has_z, h0 = case
    generator = torch.Generator().manual_seed(length * 7 + d)

    def make(shape, name):
        value = torch.randn(shape, generator=generator)
        if name == "A":
            return (-torch.exp(0.7 * value)).to(dtype)
        if name == "delta":  # around softplus's bend, else a positive step as after it
            value = value - 1.0 if softplus else 0.5 * value.abs()
        if name == "delta_bias" and not softplus:
            value = 0.1 * value.abs()
        if name == "initial_state" and not h0:
            value = torch.zeros(shape)  # the emitters' zeros for an absent state
        return value.to(dtype)

    inputs = _inputs(b, d, length, g, n, make)
    return inputs, dict(delta_softplus=softplus, has_z=has_z, chunk=chunk)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
@pytest.mark.parametrize(
    "case", CASES, ids=lambda c: f"b{c[0]}-d{c[1]}-L{c[2]}-g{c[3]}-n{c[4]}-Q{c[5]}"
)
def test_the_chain_equals_the_reference(case, dtype):
    """The three kernels, each given what TensorRT gives its node, compute ``selective_scan``:
    out and last state against ``selective_scan_ref`` on the inputs widened to float32, at the
    scan tolerances of ``tests/fuzzing.py``."""
    inputs, attributes = _case(case, dtype)
    values = _run_chain(inputs, attributes)
    w = {k: v.float() for k, v in inputs.items()}
    out, last = selective_scan_ref(
        w["u"], w["delta"], w["A"], w["B"], w["C"], w["D"],
        w["z"] if attributes["has_z"] else None, w["delta_bias"],
        bool(attributes["delta_softplus"]), w["initial_state"],
    )
    rtol, atol = TOLERANCES["scan", dtype]
    assert values["out"].dtype == dtype and values["last_state"].dtype == torch.float32
    torch.testing.assert_close(values["out"].double(), out.double(), rtol=rtol, atol=atol)
    torch.testing.assert_close(values["last_state"].double(), last.double(), rtol=rtol, atol=atol)


def test_the_chain_equals_the_triton_targets_launches():
    """Float32, the same chunk: the chain's outputs and the states entering each chunk equal
    what ``selective_scan_fwd`` (the triton target's three launches) makes (1e-5)."""
    from ssmcc.kernels.triton.selective_scan import selective_scan_fwd

    inputs, attributes = _case(CASES[1], torch.float32)
    values = _run_chain(inputs, attributes)
    t = inputs
    out, last = selective_scan_fwd(
        t["u"], t["delta"], t["A"], t["B"], t["C"], t["D"],
        t["z"] if attributes["has_z"] else None, t["delta_bias"],
        bool(attributes["delta_softplus"]), t["initial_state"], attributes["chunk"],
    )
    close = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values["out"], out, **close)
    torch.testing.assert_close(values["last_state"], last, **close)
    # the chunk state's sums of dt: the whole-chunk sums of softplus(delta + bias)
    dt = torch.nn.functional.softplus(t["delta"] + t["delta_bias"][:, None])
    sums = torch.stack([c.sum(-1) for c in dt.split(attributes["chunk"], dim=-1)], dim=1)
    torch.testing.assert_close(values["dt_sums"], sums, **close)


def test_a_chunk_below_one_is_refused():
    with pytest.raises(LoweringError, match="chunk attribute is 0; it must be >= 1"):
        SPECS["SelectiveScanChunkScan"].constexprs(
            {"delta_softplus": 1, "has_z": 1, "chunk": 0}, {("A", 1): 4}, {}
        )


def _scan_model() -> onnx.ModelProto:
    from ssmcc.lowering.onnx.functions import selective_scan_function
    from ssmcc.lowering.onnx.schemas import register_schemas

    register_schemas()
    b, d, g, n = 2, 6, 2, 3
    shapes = dict(
        u=[b, d, "L"], delta=[b, d, "L"], A=[d, n], B=[b, g, n, "L"], C=[b, g, n, "L"], D=[d],
        z=[b, d, "L"], delta_bias=[d], initial_state=[b, d, n],
    )
    node = helper.make_node(
        "SelectiveScan", list(shapes), ["out", "last"], name="scan0", domain="ssmcc",
        delta_softplus=1, has_z=1,
    )
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(k, TensorProto.FLOAT, v) for k, v in shapes.items()],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [b, d, "L"]),
            helper.make_tensor_value_info("last", TensorProto.FLOAT, [b, d, n]),
        ],
    )
    return helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ssmcc", 1)],
        functions=[selective_scan_function(20)],
    )


@pytest.mark.parametrize("length", [1, 16, 37])
def test_the_chains_onnx_bodies_compute_the_scan(length):
    """The rewritten graph (three nodes, their model-local functions, the intermediates' value
    infos with K = cdiv(L, Q)) passes the full checker, and ONNX Runtime running the chain's
    bodies gives the SelectiveScan body's outputs (1e-5)."""
    import onnxruntime as ort

    model = _scan_model()
    feeds = random_feeds(model, length, seed=length)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    assert split_selective_scans(model, chunk=16) == 1
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == list(CHAINS["SelectiveScan"])
    assert "SelectiveScan" not in {f.name for f in model.functions}
    infos = {v.name: v for v in model.graph.value_info}
    ends = infos["scan0/chunk_ends"].type.tensor_type.shape.dim
    dims = [d.dim_value or d.dim_param for d in ends]
    assert dims == [2, "cdiv(L,16)", 3, 6]
    got = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, e in zip(got, expected, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("pointer", ["*fp32", "*fp16", "*bf16"])
def test_every_chain_kernel_compiles_for_sm90_without_spills(tmp_path, pointer):
    """Each of the three kernels at mamba-130m's shapes (state 16, the rewrite's chunk), built as
    the artifact builds it (``kernels_aot.specialization``, ``aot.build``): PTX for sm_90 whose
    entry takes the node's inputs, extras and outputs, and no spill (ptxas -v)."""
    from ssmcc.kernels.triton import aot
    from ssmcc.lowering.tensorrt.kernels_aot import specialization
    from ssmcc.lowering.tensorrt.scan_chain import CHUNK

    attributes = dict(delta_softplus=1, has_z=1, chunk=CHUNK)
    made = []
    for op_type in CHAINS["SelectiveScan"]:
        spec = SPECS[op_type]
        types = {n: pointer if n in SCAN_INPUTS else "*fp32" for n in spec.inputs}
        made.append(
            specialization(
                op_type, {a: attributes[a] for a, _ in spec.attributes}, {("A", 1): 16}, types
            )
        )
    manifest = aot.build(made, ("sm_90",), str(tmp_path / "k"))
    by_kernel = {SPECS[t].kernel: SPECS[t] for t in CHAINS["SelectiveScan"]}
    assert {e["kernel"] for e in manifest["kernels"]} == set(by_kernel)
    for entry in manifest["kernels"]:
        spec = by_kernel[entry["kernel"]]
        ptx = (tmp_path / "k" / entry["ptx"]).read_text()
        params = ptx.split(f".entry {entry['entry']}(")[1].split(")")[0].count(".param")
        assert params == len(spec.inputs) + len(spec.extras) + len(spec.outputs) + 2
        assert entry["spill_store_bytes"] == 0 == entry["spill_load_bytes"], entry
