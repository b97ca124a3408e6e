"""``torch.compile(model, backend="ssmcc")``: Hugging Face Mamba-1, FalconMamba and Mamba-2 models
with ssmcc's routes on (``ssmcc.enable_routes``), against the same model run eagerly without them
(1e-4, fp32): no recompile across lengths 7..2048 (dynamic shapes, Dynamo's own counters), one
scan op per layer in the ATen graph the backend produced, HF ``generate`` after
``model.compile(backend="ssmcc")``; hand-written scans (a loop, torch's ``scan`` op) found by the
detection passes in the backend's graph; the entry point in a fresh interpreter; the errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import ssmcc
import ssmcc.dynamo
from ssmcc.errors import OptionError
from ssmcc.presets import build_preset

TOLERANCE = 1e-4
SHAPES = [(1, 7), (3, 64), (1, 300), (3, 2048)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    ssmcc.dynamo.GRAPHS.clear()
    yield
    torch._dynamo.reset()


def _eager_logits(model, shapes):
    inputs = {
        shape: torch.randint(
            0, model.config.vocab_size, shape, generator=torch.Generator().manual_seed(shape[1])
        )
        for shape in shapes
    }
    with torch.no_grad():
        return inputs, {s: model(ids, use_cache=False).logits for s, ids in inputs.items()}


@pytest.mark.parametrize(
    "name, scan, inner, fuse",
    [
        ("mamba-tiny", "mamba_mixer", "inductor", True),
        ("mamba-tiny", "selective_scan", "eager", False),
        ("falcon-mamba-tiny", "mamba_mixer", "eager", True),
        ("falcon-mamba-tiny", "selective_scan", "eager", False),
        ("mamba2-tiny", "ssd_scan", "eager", True),
    ],
)
def test_logits_match_eager_at_every_length_with_one_graph(name, scan, inner, fuse):
    """With ``fuse`` (the default) a Mamba-1 mixer is one ``mamba_mixer`` op, which holds the
    selective scan; ``fuse=False`` keeps the scan as its own op."""
    model = build_preset(name).eval()
    inputs, expected = _eager_logits(model, SHAPES)
    backend = "ssmcc" if inner == "inductor" else ssmcc.dynamo_backend(inner=inner)
    with ssmcc.routes_enabled(model, fuse=fuse):
        compiled = torch.compile(model, backend=backend, dynamic=True)
        for shape, ids in inputs.items():
            with torch.no_grad():
                logits = compiled(ids, use_cache=False).logits
            assert (logits - expected[shape]).abs().max() <= TOLERANCE, shape
    # Lengths never recompile; batch 1 is a second graph (Dynamo specialises sizes 0 and 1).
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] <= 2
    graphs = list(ssmcc.dynamo.GRAPHS)
    assert len(graphs) == torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for graph in graphs:
        assert graph.inner == inner
        assert graph.ssmcc_ops[scan] == model.config.num_hidden_layers
    assert "on ssmcc's kernels" in ssmcc.dynamo.explain()


@pytest.mark.parametrize(
    "form, rule, inner",
    [
        ("loop", "unrolled_loop", "inductor"),
        ("scan_op", "scan_op", "inductor"),
        ("pscan", "parallel_scan", "eager"),
    ],
)
def test_hand_written_scans_are_detected_in_the_backends_graph(form, rule, inner):
    """A Python loop over time (unrolled by Dynamo: one graph per length), torch's ``scan``
    op and mamba.py's Blelloch ``pscan`` (its in-place sweeps functionalized by AOT autograd,
    its readout a batched matmul folded back) become one ``selective_scan`` per layer, the same
    rules as on an exported program. Lengths 16 and 20 (pscan pads 20 to 32): the same rules as
    at 33 (padded to 64), in shorter traces."""
    from benchmarks.handwritten_mamba import build

    model = build(form, layers=2).eval()
    compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner=inner))
    for length in (16, 20):
        ids = torch.randint(0, 64, (2, length), generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            assert (compiled(ids) - model(ids)).abs().max() <= TOLERANCE, length
    for graph in ssmcc.dynamo.GRAPHS:
        assert graph.ssmcc_ops["selective_scan"] == 2
        assert graph.rule_hits[rule] == 2 and graph.rule_hits["fold_gate"] == 2
    assert "detected: " in ssmcc.dynamo.explain()


def test_mamba_py_model_is_one_scan_per_layer():
    """mamba.py's own ``Mamba`` (``mambapy.mamba``, pscan on): its parallel scans are found in
    the backend's graph at lengths 7, 16 and 20 (pscan pads to a power of two: one graph per
    length, the second and third with symbolic sizes) and the outputs match eager within 1e-4.
    20 pads to 32: the same rules as 33 (padded to 64), in a shorter symbolic trace. Inductor
    compiles the rest of the graph; the same rules with the eager inner backend are the
    hand-written pscan case above (one variant here since 2026-12-06: each costs ~45 s of
    Dynamo tracing in CI)."""
    inner = "inductor"
    from mambapy.mamba import Mamba, MambaConfig

    torch.manual_seed(0)
    model = Mamba(MambaConfig(d_model=32, n_layers=2, d_state=8, pscan=True)).eval()
    compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner=inner))
    for batch, length in ((1, 7), (3, 16), (2, 20)):
        x = torch.randn(batch, length, 32, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            assert (compiled(x) - model(x)).abs().max() <= TOLERANCE, length
    assert ssmcc.dynamo.GRAPHS
    for graph in ssmcc.dynamo.GRAPHS:
        assert graph.ssmcc_ops == {"selective_scan": 2}, graph.summary()
        assert graph.rule_hits["parallel_scan"] == 2


def test_generate_after_model_compile_gives_eager_tokens():
    model = build_preset("mamba-tiny").eval()
    prompt = torch.randint(0, model.config.vocab_size, (2, 7), generator=torch.Generator())
    settings = dict(max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    expected = model.generate(prompt, **settings)
    before = sum(ssmcc.dynamo.CALLS.values())
    with ssmcc.routes_enabled(model):
        model.compile(backend=ssmcc.dynamo_backend(inner="eager"))
        try:
            tokens = model.generate(prompt, **settings)
        finally:
            model._compiled_call_impl = None  # the module's forward back to eager
    assert torch.equal(tokens, expected)
    assert sum(ssmcc.dynamo.CALLS.values()) > before
    # the prefill with a cache and the cached steps run Hugging Face's forward with the op routes
    prefill = [g for g in ssmcc.dynamo.GRAPHS if g.ssmcc_ops]
    assert prefill and prefill[0].ssmcc_ops["selective_scan"] == model.config.num_hidden_layers


def test_without_routes_the_backend_compiles_hf_code_and_says_why_no_scan(capsys):
    """Without routes the backend still computes the model, and says once on stderr which mixer
    classes ran unrouted and what to call; with the routes on it says nothing."""
    ssmcc.dynamo.HINTED.clear()
    model = build_preset("mamba-tiny").eval()
    inputs, expected = _eager_logits(model, [(2, 9)])
    compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner="eager"))
    with torch.no_grad():
        logits = compiled(inputs[2, 9], use_cache=False).logits
        compiled(inputs[2, 9][:, :5], use_cache=False)  # another graph: not said again
    assert (logits - expected[2, 9]).abs().max() <= TOLERANCE
    assert "ssmcc.enable_routes(model)" in ssmcc.dynamo.explain()
    err = capsys.readouterr().err
    hint = "the model's MambaMixer layers are not routed to ssmcc's ops"
    assert err.count(hint) == 1 and "ssmcc.enable_routes(model) before" in err, err
    ssmcc.dynamo.HINTED.clear()
    torch._dynamo.reset()
    with ssmcc.routes_enabled(model), torch.no_grad():
        routed = torch.compile(model, backend=ssmcc.dynamo_backend(inner="eager"))
        routed(inputs[2, 9], use_cache=False)
    assert hint not in capsys.readouterr().err


HYBRIDS = ["bamba-tiny", "jamba-tiny", "granite-hybrid-tiny", "nemotron-h-tiny", "zamba-tiny"]
HYBRIDS += ["zamba2-tiny", "falcon-h1-tiny"]


@pytest.mark.parametrize("name", HYBRIDS)
def test_every_routed_hybrid_compiles_into_one_graph_on_the_ssmcc_ops(name):
    """Attention, MoE and SSM layers of every hybrid family: one Dynamo graph (no fallback to
    eager at a nested compile region), one scan op per SSM layer, logits as eager's."""
    model = build_preset(name).eval()
    inputs, expected = _eager_logits(model, [(2, 37)])
    with ssmcc.routes_enabled(model) as routes:
        with torch.no_grad():
            model(inputs[2, 37], use_cache=False)  # eagerly: the routes count their calls
        compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner="eager"), dynamic=True)
        with torch.no_grad():
            logits = compiled(inputs[2, 37], use_cache=False).logits
    assert (logits - expected[2, 37]).abs().max() <= TOLERANCE
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    (graph,) = ssmcc.dynamo.GRAPHS
    scans = graph.ssmcc_ops["selective_scan"] + graph.ssmcc_ops["ssd_scan"]
    # one per SSM layer (Zamba's Mamba layers scan once per Mamba head)
    assert scans == routes.record.calls["selective_scan"] + routes.record.calls["ssd_scan"]
    assert scans >= len(routes.record.layers) > 0
    assert "mamba_mixer" not in graph.ssmcc_ops  # the hybrids' Mamba-1 mixers are not fused


@pytest.mark.parametrize("name, ops", [("mamba-tiny", {"causal_conv1d": 1, "selective_scan": 1})])
def test_unfused_mixers_are_traced_once_and_stamped_out_per_layer(name, ops):
    """A routed mixer that is not fused is a nested compile region while the routes are on: the
    graph calls one shared subgraph per layer (what keeps a 24-layer cold compile short). A
    fused Mamba-1 mixer is inlined instead (a few lines to trace, faster code)."""
    from ssmcc.dynamo import subgraph_modules

    model = build_preset(name).eval()
    inputs, _ = _eager_logits(model, [(1, 9)])
    for fuse in (False, True):
        ssmcc.dynamo.GRAPHS.clear()
        torch._dynamo.reset()
        with ssmcc.routes_enabled(model, fuse=fuse):
            compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner="eager"))
            with torch.no_grad():
                compiled(inputs[1, 9], use_cache=False)
        (graph,) = ssmcc.dynamo.GRAPHS
        calls = [
            n
            for n in graph.graph_module.graph.nodes
            if n.target is torch.ops.higher_order.invoke_subgraph
        ]
        modules = subgraph_modules(graph.graph_module)
        if fuse:
            assert not calls and len(modules) == 1
            continue
        assert len(calls) == model.config.num_hidden_layers
        assert len(modules) == 2  # the model's graph and the one mixer subgraph
        assert ssmcc.dynamo.ssmcc_ops_in(modules[1]) == ops
        layers = model.config.num_hidden_layers
        assert ssmcc.dynamo.ssmcc_ops_in(graph.graph_module) == {
            op: n * layers for op, n in ops.items()
        }


def test_routes_are_removed_by_disable():
    import transformers.models.mamba.modeling_mamba as modeling

    model = build_preset("mamba-tiny").eval()
    before = dict(vars(modeling))
    forward = modeling.MambaMixer.forward
    specialize_float = torch._dynamo.config.specialize_float
    routes = ssmcc.enable_routes(model)
    assert any(vars(modeling)[k] is not v for k, v in before.items())
    assert modeling.MambaMixer.forward.__wrapped__ is forward  # the fused forward
    assert torch._dynamo.config.specialize_float
    routes.disable()
    routes.disable()  # a second disable does nothing
    assert all(vars(modeling)[k] is v for k, v in before.items())
    assert modeling.MambaMixer.forward is forward
    assert torch._dynamo.config.specialize_float == specialize_float
    assert routes not in ssmcc.dynamo.ENABLED
    # two handles on models of one class: the mixer is fused once, and restored after both
    outer = ssmcc.enable_routes(model)
    inner = ssmcc.enable_routes(build_preset("mamba-tiny"))
    assert modeling.MambaMixer.forward.__wrapped__ is forward
    inner.disable()
    outer.disable()
    assert modeling.MambaMixer.forward is forward
    assert all(vars(modeling)[k] is v for k, v in before.items())


def test_routes_stay_when_the_handle_is_dropped():
    """``ssmcc.enable_routes(model)`` without keeping the handle: the routes stay on (they once
    went with the handle's garbage collection, and Dynamo traced Hugging Face's code)."""
    import gc

    model = build_preset("mamba-tiny").eval()
    inputs, expected = _eager_logits(model, [(1, 9)])
    ssmcc.enable_routes(model)
    gc.collect()
    try:
        compiled = torch.compile(model, backend=ssmcc.dynamo_backend(inner="eager"))
        with torch.no_grad():
            logits = compiled(inputs[1, 9], use_cache=False).logits
    finally:
        for routes in list(ssmcc.dynamo.ENABLED):
            routes.disable()
    assert (logits - expected[1, 9]).abs().max() <= TOLERANCE
    assert ssmcc.dynamo.GRAPHS[-1].ssmcc_ops["mamba_mixer"] == 2


def test_errors():
    with pytest.raises(OptionError, match="inner must be one of"):
        ssmcc.dynamo_backend(inner="tensorrt")
    with pytest.raises(OptionError, match="no ssmcc route knows"):
        ssmcc.enable_routes(torch.nn.Linear(2, 2))


def test_backend_is_found_without_importing_ssmcc():
    """The ``torch_dynamo_backends`` entry point (pyproject.toml), in a fresh interpreter."""
    code = (
        "import sys, torch\n"
        "model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.SiLU())\n"
        "x = torch.randn(2, 4)\n"
        "out = torch.compile(model, backend='ssmcc')(x)\n"
        "assert torch.allclose(out, model(x), atol=1e-6)\n"
        "assert 'ssmcc' in torch._dynamo.list_backends()\n"
        "print('ssmcc imported by torch:', 'ssmcc.dynamo' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd="/"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ssmcc imported by torch: True" in result.stdout
