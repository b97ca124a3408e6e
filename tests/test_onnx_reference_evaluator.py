"""The portable ONNX graphs run in ONNX's own reference evaluator (``onnx.reference``), a third
implementation of the standard ops beside ONNX Runtime's and OpenVINO's (``test_openvino.py``).

Every graph ``write_graphs(..., "portable")`` writes (prefill, chunk and step of a streaming
model; forward of a plain module) gives, in ``onnx.reference.ReferenceEvaluator``, the outputs
ONNX Runtime gives on the same file within 1e-4: logits and every next state, batch 2, lengths
1, 7 and 37 (not a multiple of the Mamba-2 presets' chunk size, 16), from non-zero states and a
K/V cache of 5 positions. ONNX Runtime runs the file twice: with ssmcc's custom-op library (its
kernels run the ssmcc nodes) and stock (it inlines the same function bodies the evaluator runs).
The evaluator runs each graph as written and with its functions inlined (``inline_functions``,
what an ``onnx_functions="inline"`` artifact holds).
The MoE experts' node, which only ONNX Runtime's graphs hold (a decode step's), is checked alone.

The evaluator runs ``Scan`` along axis 0 only, so the bodies scan position-major inputs, and
builds each model-local function from those listed before it, so callees come first. It is
numpy, op by op and position by position: the lengths stay short.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import ssmcc
from ssmcc.lowering.onnx.runtime import custom_op_library, make_session
from ssmcc.lowering.onnx.target import inline_functions, write_graphs
from ssmcc.lowering.registry import get_target
from ssmcc.ops.moe_experts import ACTIVATIONS
from ssmcc.passes.program_set import ProgramSet
from ssmcc.presets import build_preset
from tests.graph_feeds import token_feeds
from tests.test_moe_experts_node import _inputs as _moe_inputs
from tests.test_moe_experts_node import _model as _moe_model
from tests.test_moe_experts_node import _run as _run_moe
from tests.test_moe_experts_node import stored
from tests.test_ops_reference import scan_case

TOLERANCE = 1e-4
LENGTHS = (1, 7, 37)
BATCH = 2
FAST = ["mamba-tiny", "mamba2-tiny", "granite-hybrid-tiny"]
SLOW = [
    "falcon-mamba-tiny",
    "bamba-tiny",
    "jamba-tiny",
    "nemotron-h-tiny",
    "zamba-tiny",
    "zamba2-tiny",
    "falcon-h1-tiny",
]


def _portable_graphs(model, folder, token_model: bool, **options) -> dict[str, str]:
    """The model's portable graphs written into ``folder``: graph name -> path.

    The program comes from compiling for the torch target, which runs the same pipeline as the
    onnx target (the fusion pass's only target input is the ops a target cannot run: none for
    either), so the graphs are exported once, not also in the onnx target's runtime form."""
    for target in ("torch", "onnx"):
        assert get_target(target).module().unsupported_ops() == {}
    compiled = ssmcc.compile(model, target="torch", **options)
    programs = ProgramSet(compiled.program, token_model=token_model)
    graphs = write_graphs(programs, str(folder), "portable")
    return {name: os.path.join(folder, entry["file"]) for name, entry in graphs.items()}


def _assert_matches_onnx_runtime(path: str, feeds_at, lengths) -> None:
    """Every output of the evaluator within ``TOLERANCE`` of ONNX Runtime's, with and without
    ssmcc's library, at each length; ``feeds_at(model, length)`` makes the inputs."""
    model = onnx.load(path)  # with its weights: the evaluator reads no external data itself
    inlined = inline_functions(model, os.path.basename(path).removesuffix(".onnx"))  # standard ops
    evaluators = {"functions": ReferenceEvaluator(model), "inlined": ReferenceEvaluator(inlined)}
    sessions = {kernels: make_session(path, kernels) for kernels in ("auto", "reference")}
    assert sessions["auto"].ssmcc_kernels == "ssmcc ORT library"
    assert sessions["reference"].ssmcc_kernels == "portable function bodies"
    names = [value.name for value in model.graph.output]
    for length in lengths:
        feeds = feeds_at(model, length)
        expected = {kernels: session.run(None, feeds) for kernels, session in sessions.items()}
        for form, evaluator in evaluators.items():
            got = evaluator.run(None, feeds)
            assert np.abs(got[0]).max() > 0.1, "first output all but zero: nothing compared"
            for kernels, outputs in expected.items():
                for name, value, want in zip(names, got, outputs, strict=True):
                    np.testing.assert_allclose(
                        value,
                        want,
                        rtol=TOLERANCE,
                        atol=TOLERANCE,
                        err_msg=f"{os.path.basename(path)} ({form}) {name} length {length}, "
                        f"ORT {kernels}",
                    )


def _check_preset(preset: str, folder, **options) -> None:
    model = build_preset(preset)
    paths = _portable_graphs(model, folder, token_model=True, **options)
    assert sorted(paths) == ["chunk", "prefill", "step"]
    vocab = model.config.vocab_size
    for graph, path in paths.items():
        _assert_matches_onnx_runtime(
            path,
            lambda proto, length: token_feeds(proto, BATCH, length, vocab, seed=length),
            (1,) if graph == "step" else LENGTHS,
        )


@pytest.mark.parametrize(
    "preset", FAST + [pytest.param(name, marks=pytest.mark.slow) for name in SLOW]
)
def test_portable_graphs_run_in_the_reference_evaluator(preset, tmp_path):
    _check_preset(preset, tmp_path)


@pytest.mark.parametrize(
    "scheme", ["int8", *(pytest.param(s, marks=pytest.mark.slow) for s in ("bf16", "fp16"))]
)
def test_quantized_portable_graphs_run_in_the_reference_evaluator(scheme, tmp_path):
    """int8: DequantizeLinear products, QuantizedLinear and the QuantizedMambaMixer bodies
    calling Widen; bf16: HalfLinear and Widen's Cast of bfloat16."""
    _check_preset("mamba-tiny", tmp_path, quantize=scheme)


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["mamba-tiny", "mamba2-tiny"])
def test_unfused_portable_graphs_run_in_the_reference_evaluator(preset, tmp_path):
    """The scan, conv, state-update and norm bodies as top-level nodes, not called by a mixer."""
    _check_preset(preset, tmp_path, pipeline="unfused")


class Scans(torch.nn.Module):
    """A plain module (no token ids: a forward graph only): Mamba-1's scan with B and C in 3
    groups, Mamba-2's with 2 groups of 2 heads, dt clipped."""

    def forward(self, u, delta, A, B, C, D, z, delta_bias, h0, x, dt, A2, B2, C2, D2, dt_bias):
        y, last = torch.ops.ssmcc.selective_scan(u, delta, A, B, C, D, z, delta_bias, True, h0)
        y2, last2 = torch.ops.ssmcc.ssd_scan(
            x, dt, A2, B2, C2, D2, None, dt_bias, True, 0.0, 0.5, None
        )
        return y, last, y2, last2


def _scan_args(length: int) -> tuple[torch.Tensor, ...]:
    case = scan_case(BATCH, 12, 4, length, 3, True, True, True, True, seed=length)
    names = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
    generator = torch.Generator().manual_seed(length)
    rand = lambda *s: torch.randn(*s, generator=generator)  # noqa: E731
    heads, head_dim, groups, n = 4, 5, 2, 3
    return tuple(case[k] for k in names) + (
        rand(BATCH, length, heads, head_dim),
        rand(BATCH, length, heads),
        -torch.exp(0.7 * rand(heads)),
        rand(BATCH, length, groups, n),
        rand(BATCH, length, groups, n),
        rand(heads),
        rand(heads),
    )


def test_a_plain_modules_forward_graph_runs_in_the_reference_evaluator(tmp_path):
    paths = _portable_graphs(Scans(), tmp_path, token_model=False, example_inputs=_scan_args(7))
    assert list(paths) == ["forward"]

    def feeds(proto, length):
        values = zip(proto.graph.input, _scan_args(length), strict=True)
        return {value.name: tensor.numpy() for value, tensor in values}

    _assert_matches_onnx_runtime(paths["forward"], feeds, LENGTHS)


def _moe_feeds(hidden, index, weights) -> dict[str, np.ndarray]:
    return {
        "hidden": hidden.numpy(),
        "top_k_index": index.numpy(),
        "top_k_weights": weights.numpy(),
    }


def _assert_moe_matches_onnx_runtime(model, hidden, index, weights) -> None:
    got = ReferenceEvaluator(model).run(None, _moe_feeds(hidden, index, weights))[0]
    for library in (custom_op_library("auto"), None):
        want = _run_moe(model, hidden, index, weights, library).numpy()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("gated", [True, False])
def test_the_moe_experts_body_runs_in_the_reference_evaluator(activation, gated):
    """5 tokens choosing 3 of 6 experts, one index outside the experts (adds nothing)."""
    hidden, index, weights, up, down = _moe_inputs(5, 6, 3, 37, 19, gated, seed=len(activation))
    index[1, 2] = -1
    model = _moe_model(activation, gated, up, down)
    _assert_moe_matches_onnx_runtime(model, hidden, index, weights)


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
def test_the_quantized_moe_experts_body_runs_in_the_reference_evaluator(scheme):
    hidden, index, weights, up, down = _moe_inputs(3, 4, 2, 64, 32, True, seed=7)
    (up_q, up_s, _), (down_q, down_s, _) = stored(up, scheme), stored(down, scheme)
    model = _moe_model("silu", True, up_q, down_q, up_s, down_s)
    _assert_moe_matches_onnx_runtime(model, hidden, index, weights)
