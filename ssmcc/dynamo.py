"""``torch.compile(model, backend="ssmcc")``: a Dynamo backend that keeps ssmcc's scan kernels.

Dynamo hands the backend an FX graph of torch calls. The backend lowers it to ATen inside
inductor's ``compile_fx`` (AOT autograd, inference) and reads the ATen graph there before
inductor generates code for it: every ``torch.ops.ssmcc.*`` node stays an opaque call that runs
the op's registered kernel (C++ on the CPU), and inductor fuses and generates code for the ATen
remainder. ``inner="eager"`` runs the ATen graph eagerly instead (no code generation: seconds to
compile, for debugging).

Where the scans come from. Hugging Face's Mamba mixers trace, under Dynamo, into their own
whole-sequence code (Mamba-1's ``associative_scan`` becomes vmapped slicing, no scan op survives);
``enable_routes(model)`` installs ssmcc's routes for the model's classes (the same replacements
capture uses) so the mixers call the ssmcc ops and Dynamo records those. The routes stay installed
until ``disable()`` (or the end of a ``with`` block): Dynamo guards on the functions it traced,
so removing them recompiles the model back to Hugging Face's code.

The backend's own record: ``CALLS`` counts the graphs it compiled, and ``GRAPHS`` keeps the last
ATen graphs it produced (with the ssmcc ops found in each) for inspection; ``explain()`` says, in
one line per graph, what was found; the ``ssmcc.dynamo`` logger says it at INFO.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging

import torch
from torch import nn

import ssmcc.kernels.cpu.registration  # noqa: F401  (their C++ kernels on the CPU)
import ssmcc.ops  # noqa: F401  (torch.ops.ssmcc.* registered before a graph reaches us)
from ssmcc.errors import OptionError
from ssmcc.ops import is_ssmcc_op

LOG = logging.getLogger("ssmcc.dynamo")
KEEP_GRAPHS = 16
# Inductor decomposes these; the detection passes read them whole (Δ = softplus(δ + bias), the
# gate silu(z), the stacked outputs of an unrolled loop, the readout's batched product), so they
# are decomposed after the passes ran.
HELD_BACK = (
    torch.ops.aten.softplus.default,
    torch.ops.aten.silu.default,
    torch.ops.aten.stack.default,
    torch.ops.aten.bmm.default,
)


@dataclasses.dataclass
class CompiledGraph:
    """One ATen graph the backend produced: the ssmcc ops in it and who runs the rest."""

    graph_module: torch.fx.GraphModule
    ssmcc_ops: collections.Counter
    inner: str
    routed: bool  # ssmcc's routes were installed when the graph was traced
    rule_hits: collections.Counter  # the detection passes' rewrites in this graph, by rule
    diagnostics: dict  # rule -> why a candidate was not rewritten

    def summary(self) -> str:
        if not self.ssmcc_ops:
            hint = (
                " (routes were on: a path they do not cover, such as Hugging Face's cached "
                "decode step)"
                if self.routed
                else " (for a Hugging Face model, ssmcc.enable_routes(model) before the first "
                "call routes its mixers to the ssmcc ops)"
            )
            return (
                f"no ssmcc op in this graph ({len(self.graph_module.graph.nodes)} nodes): "
                f"{self.inner} runs all of it{hint}"
            )
        ops = ", ".join(f"{n} {op}" for op, n in sorted(self.ssmcc_ops.items()))
        found = ", ".join(f"{rule} {n}" for rule, n in sorted(self.rule_hits.items()))
        found = f" (detected: {found})" if found else " (routed)"
        return f"{ops} on ssmcc's kernels{found}; {self.inner} runs the rest"


CALLS: collections.Counter = collections.Counter()  # "graphs" compiled, by inner compiler
GRAPHS: collections.deque = collections.deque(maxlen=KEEP_GRAPHS)


def ssmcc_ops_in(graph_module: torch.fx.GraphModule) -> collections.Counter:
    return collections.Counter(
        node.target._opname
        for node in graph_module.graph.nodes
        if node.op == "call_function" and is_ssmcc_op(node.target)
    )


def _record(graph_module, inner: str, hits: collections.Counter, diagnostics: dict) -> None:
    from ssmcc.frontend.route import ACTIVE_ROUTINGS

    compiled = CompiledGraph(
        graph_module,
        ssmcc_ops_in(graph_module),
        inner,
        routed=bool(ACTIVE_ROUTINGS),
        rule_hits=hits,
        diagnostics=diagnostics,
    )
    CALLS["graphs", inner] += 1
    GRAPHS.append(compiled)
    LOG.info("ssmcc backend: %s", compiled.summary())


def explain() -> str:
    """One line per graph the backend compiled (the last ``KEEP_GRAPHS``)."""
    if not GRAPHS:
        return "the ssmcc backend has compiled no graph in this process"
    return "\n".join(f"graph {i}: {g.summary()}" for i, g in enumerate(GRAPHS))


def rewrite_graph(aten_graph: torch.fx.GraphModule) -> tuple[collections.Counter, dict]:
    """ssmcc's detection passes on a functional ATen graph, in place: padded causal convs ->
    ``causal_conv1d``, selective scans in the forms ``detect_selective_scan`` reads (a Python
    loop Dynamo unrolled, torch's ``scan`` op; mamba.py's ``pscan`` is not found in Dynamo's
    form yet) -> ``selective_scan`` / ``ssd_scan``. Returns the hits by rule and why
    candidates were not rewritten."""
    from ssmcc.passes.detect_causal_conv1d import rewrite_causal_conv1d
    from ssmcc.passes.detect_selective_scan import rewrite_scans

    diagnostics: dict = {}
    hits = rewrite_causal_conv1d(aten_graph, diagnostics)
    hits += rewrite_scans(aten_graph, diagnostics)
    if hits:
        aten_graph.recompile()
    return hits, diagnostics


def _run_eagerly(aten_graph, _inputs):
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(aten_graph.forward)


def _inductor(aten_graph, inputs):
    """Inductor on the rewritten graph, after the decompositions held back for the detection
    passes (re-traced with the graph's own fake inputs: symbolic sizes stay symbolic)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    table = select_decomp_table()
    held_back = {op: table[op] for op in HELD_BACK if op in table}
    if any(node.target in held_back for node in aten_graph.graph.nodes):
        with detect_fake_mode(inputs):
            aten_graph = make_fx(aten_graph, decomposition_table=held_back)(*inputs)
    return compile_fx_inner(aten_graph, inputs)


def _inductor_decompositions() -> dict:
    """Inductor's decompositions (its code generator needs them), but for ``HELD_BACK``."""
    from torch._inductor.decomposition import select_decomp_table

    return {op: fn for op, fn in select_decomp_table().items() if op not in HELD_BACK}


# inner -> (compiler of the rewritten ATen graph, decompositions AOT autograd applies first)
INNER = {
    "inductor": (_inductor, _inductor_decompositions),
    "eager": (_run_eagerly, lambda: None),  # ATen as ``torch.export`` writes it
}


def dynamo_backend(inner: str = "inductor"):
    """The backend with options: ``torch.compile(model, backend=ssmcc.dynamo_backend(...))``.

    ``inner``: what runs the ATen graph around the ssmcc ops, ``"inductor"`` (generated code)
    or ``"eager"`` (ATen ops one by one: compiles in seconds). The graph Dynamo hands over goes
    through AOT autograd (inference) to a functional ATen graph, ``rewrite_graph``, then that
    compiler."""
    if inner not in INNER:
        raise OptionError(f"inner must be one of {', '.join(INNER)}, got {inner!r}")
    compile_aten, decompositions = INNER[inner]

    def forward_compiler(aten_graph, inputs):
        hits, diagnostics = rewrite_graph(aten_graph)
        _record(aten_graph, inner, hits, diagnostics)
        return compile_aten(aten_graph, inputs)

    def backend(graph_module: torch.fx.GraphModule, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        # AOT autograd's cache would hand back a compiled graph without showing it to us.
        with torch._functorch.config.patch(enable_autograd_cache=False):
            return aot_module_simplified(
                graph_module,
                example_inputs,
                fw_compiler=forward_compiler,
                decompositions=decompositions(),
            )

    backend.__name__ = f"ssmcc_{inner}"
    return backend


# The backend registered as "ssmcc" (entry point ``torch_dynamo_backends`` in pyproject.toml).
ssmcc_backend = dynamo_backend()


class Routes:
    """ssmcc's routes installed for a model's classes until ``disable()`` (see the module
    docstring); also a context manager."""

    def __init__(self, model: nn.Module):
        from ssmcc.frontend.routes import routed

        self._context = routed(model)
        self.record = self._context.__enter__()
        self.active = True

    def disable(self) -> None:
        if self.active:
            self.active = False
            self._context.__exit__(None, None, None)

    def __enter__(self) -> Routes:
        return self

    def __exit__(self, *exc) -> None:
        self.disable()


def enable_routes(model: nn.Module) -> Routes:
    """Have ``model``'s Hugging Face mixers call the ssmcc ops (for ``torch.compile``): returns
    the handle whose ``disable()`` restores the library. Raises if no route knows the model."""
    from ssmcc.frontend.routes import routes_for

    if not routes_for(model):
        raise OptionError(
            f"no ssmcc route knows the classes of {type(model).__name__} (routes exist for the "
            "Hugging Face Mamba, Mamba-2 and hybrid families); a hand-written model needs none: "
            "torch.compile(model, backend='ssmcc') reads its graph as it is"
        )
    return Routes(model)


@contextlib.contextmanager
def routes_enabled(model: nn.Module):
    """``with ssmcc.routes_enabled(model): ...``: ``enable_routes`` for the block."""
    routes = enable_routes(model)
    try:
        yield routes
    finally:
        routes.disable()
