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
until ``disable()`` (or the end of a ``with`` block), also when the handle is dropped: Dynamo
guards on the functions it traced, so removing them recompiles the model back to Hugging Face's
code.

Compile time and speed. Tracing Hugging Face's mixer code once per layer is what makes a cold
compile of a 24-layer model take minutes. With the routes, a Mamba-1 mixer (HF Mamba,
FalconMamba) runs one fused ``mamba_mixer`` op between its projections (``hf_mamba1_fused``:
a few lines to trace, and no transposed copies between conv, projections and scan); every other
routed mixer class's ``forward`` becomes a nested compile region
(``torch.compiler.nested_compile_region``): Dynamo traces one mixer and stamps it out for every
layer (an ``invoke_subgraph`` call per layer on one shared subgraph). The passes and the op
counts below read inside those subgraphs. While the routes are on, Dynamo specialises Python
floats (see ``Routes``).

A graph that traced a mixer class ssmcc has a route for, with the routes off and no ssmcc op in
its ATen graph, makes the backend say once on stderr which classes and what to call
(``enable_routes``): never a silent plain-inductor compile of a Mamba model.

The backend's own record: ``CALLS`` counts the graphs it compiled, and ``GRAPHS`` keeps the last
ATen graphs it produced (with the ssmcc ops found in each) for inspection; ``explain()`` says, in
one line per graph, what was found; the ``ssmcc.dynamo`` logger says it at INFO.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import logging
import sys

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

# Composite ops rewrite_graph writes (a folded batched matmul, a view that became a reshape):
# the re-trace before inductor decomposes them.
COMPOSITE = (torch.ops.aten.matmul.default, torch.ops.aten.reshape.default)


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


def _invoked_subgraph(graph_module: torch.fx.GraphModule, node: torch.fx.Node):
    """The subgraph module an ``invoke_subgraph`` node calls, else None."""
    if node.op != "call_function" or node.target is not torch.ops.higher_order.invoke_subgraph:
        return None
    return getattr(graph_module, node.args[0].target)


def subgraph_modules(graph_module: torch.fx.GraphModule) -> list[torch.fx.GraphModule]:
    """The graph and, depth first, every distinct subgraph its ``invoke_subgraph`` calls reach."""
    found: list[torch.fx.GraphModule] = []

    def visit(module):
        if any(module is seen for seen in found):
            return
        found.append(module)
        for node in module.graph.nodes:
            if (sub := _invoked_subgraph(module, node)) is not None:
                visit(sub)

    visit(graph_module)
    return found


def ssmcc_ops_in(graph_module: torch.fx.GraphModule) -> collections.Counter:
    """ssmcc op calls as the graph runs them: a subgraph's ops once per ``invoke_subgraph``."""
    counts: collections.Counter = collections.Counter()
    for node in graph_module.graph.nodes:
        if node.op == "call_function" and is_ssmcc_op(node.target):
            counts[node.target._opname] += 1
        elif (sub := _invoked_subgraph(graph_module, node)) is not None:
            counts.update(ssmcc_ops_in(sub))
    return counts


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


def unrouted_mixers(graph_module: torch.fx.GraphModule) -> list[str]:
    """The Hugging Face mixer classes ssmcc has routes for whose code this Dynamo graph traced
    (read from its nodes' module stacks)."""
    from ssmcc.frontend.routes import known_routes

    known = {(route.module, name) for route in known_routes() for name in route.mixer_classes}
    found = set()
    for node in graph_module.graph.nodes:
        for entry in (node.meta.get("nn_module_stack") or {}).values():
            kind = entry[1] if isinstance(entry, tuple) and len(entry) > 1 else None
            if isinstance(kind, type):
                where = (kind.__module__, kind.__name__)
            elif isinstance(kind, str) and "." in kind:
                where = tuple(kind.rsplit(".", 1))
            else:
                continue
            if where in known:
                found.add(where[1])
    return sorted(found)


HINTED: set[str] = set()  # mixer classes the route hint was printed for (once per process)


def hint_routes(mixers: list[str]) -> None:
    """Say once, on stderr, that ``mixers`` ran unrouted and what to call."""
    new = [name for name in mixers if name not in HINTED]
    if not new:
        return
    HINTED.update(new)
    print(
        f"[ssmcc] torch.compile(backend='ssmcc'): the model's {', '.join(new)} layers are not "
        "routed to ssmcc's ops, so their Hugging Face scan code is traced and compiled as it is "
        "(minutes to compile for a large model, and no ssmcc kernel runs). Call "
        "ssmcc.enable_routes(model) before the model's first call (or run it inside "
        "`with ssmcc.routes_enabled(model):`)",
        file=sys.stderr,
        flush=True,
    )


def explain() -> str:
    """One line per graph the backend compiled (the last ``KEEP_GRAPHS``)."""
    if not GRAPHS:
        return "the ssmcc backend has compiled no graph in this process"
    return "\n".join(f"graph {i}: {g.summary()}" for i, g in enumerate(GRAPHS))


def rewrite_graph(aten_graph: torch.fx.GraphModule) -> tuple[collections.Counter, dict]:
    """ssmcc's detection passes on a functional ATen graph, in place: padded causal convs ->
    ``causal_conv1d``, selective scans in the forms ``detect_selective_scan`` reads (a Python
    loop Dynamo unrolled, torch's ``scan`` op, a parallel scan such as mamba.py's ``pscan``)
    -> ``selective_scan`` / ``ssd_scan``; AOT autograd's batched matmuls are folded back into
    ``matmul`` first (``fold_batched_matmul``). Returns the hits by rule and why candidates were
    not rewritten."""
    from ssmcc.passes.manager import rewrite_in_place
    from ssmcc.passes.pass_base import PassContext
    from ssmcc.passes.pipelines import dynamo_rewrites

    ctx = PassContext()
    hits: collections.Counter = collections.Counter()
    for module in subgraph_modules(aten_graph):
        by_rewrite = rewrite_in_place(module, dynamo_rewrites(), ctx)
        folded = by_rewrite.pop("fold_batched_matmuls", collections.Counter())
        found = sum(by_rewrite.values(), collections.Counter())
        if found:
            _views_as_reshapes(module.graph)
        if found or folded:
            module.recompile()
        hits += found
    return hits, ctx.diagnostics


def _views_as_reshapes(graph: torch.fx.Graph) -> None:
    """``view`` -> ``reshape``: an op's output may be laid out unlike the values it replaced
    (a scan's (b, d, l) output read as (b, l, d)), and a view of it would fail; a reshape
    copies only where it must (inductor's re-trace writes it as view or clone + view)."""
    for node in graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default


def _run_eagerly(aten_graph, _inputs):
    from torch._functorch.aot_autograd import make_boxed_func

    return make_boxed_func(aten_graph.forward)


def _held_back_decomposed(aten_graph, inputs):
    """The graph with the decompositions held back for the detection passes applied (re-traced
    with the graph's own fake inputs: symbolic sizes stay symbolic)."""
    from torch._guards import detect_fake_mode
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    table = select_decomp_table()
    held_back = {op: table[op] for op in HELD_BACK if op in table}
    # (what rewrite_graph wrote back as matmul or reshape decomposes again in the re-trace)
    if any(
        node.target in held_back or node.target in COMPOSITE
        for module in subgraph_modules(aten_graph)
        for node in module.graph.nodes
    ):
        with detect_fake_mode(inputs):
            aten_graph = make_fx(aten_graph, decomposition_table=held_back)(*inputs)
    return aten_graph


def _inductor(aten_graph, inputs):
    """Inductor on the rewritten graph, after the decompositions held back for the passes."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner(_held_back_decomposed(aten_graph, inputs), inputs)


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

    def backend(graph_module: torch.fx.GraphModule, example_inputs):
        from torch._functorch.aot_autograd import aot_module_simplified

        from ssmcc.frontend.route import ACTIVE_ROUTINGS

        mixers = [] if ACTIVE_ROUTINGS else unrouted_mixers(graph_module)

        def forward_compiler(aten_graph, inputs):
            hits, diagnostics = rewrite_graph(aten_graph)
            _record(aten_graph, inner, hits, diagnostics)
            if mixers and not ssmcc_ops_in(aten_graph):
                hint_routes(mixers)
            return compile_aten(aten_graph, inputs)

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


ENABLED: list[Routes] = []  # every handle until its disable(): dropping one changes nothing


@contextlib.contextmanager
def _replaced_forwards(classes, wrap, flag: str):
    """Each class's own ``forward`` replaced by ``wrap(forward)`` (marked ``flag``) for the block;
    a class whose ``forward`` already carries the mark (another handle's) is left as it is.
    Yields the classes whose ``forward`` carries it."""
    saved = []
    try:
        for cls in classes:
            forward = cls.__dict__.get("forward")
            if forward is None:
                continue
            if not getattr(forward, flag, False):
                wrapped = wrap(cls, forward)
                setattr(wrapped, flag, True)
                saved.append((cls, forward))
                cls.forward = wrapped
        yield [cls for cls in classes if getattr(cls.__dict__.get("forward"), flag, False)]
    finally:
        for cls, forward in reversed(saved):
            cls.forward = forward


def compile_regions(classes):
    """Each class's ``forward`` as a nested compile region for the block (module docstring)."""
    return _replaced_forwards(
        classes, lambda _, forward: torch.compiler.nested_compile_region(forward), "_ssmcc_region"
    )


def fused_mixers(classes):
    """The classes among ``hf_mamba1_fused.FUSED_MIXERS`` run one ``mamba_mixer`` op on their
    whole-sequence path for the block, which yields those classes."""
    from ssmcc.frontend.hf_mamba1_fused import FUSED_MIXERS, fused_forward

    known = [c for c in classes if (c.__module__, c.__name__) in FUSED_MIXERS]
    return _replaced_forwards(
        known,
        lambda cls, forward: fused_forward(forward, FUSED_MIXERS[cls.__module__, cls.__name__]),
        "_ssmcc_fused",
    )


class Routes:
    """ssmcc's routes for a model's classes, and its mixers as nested compile regions, installed
    until ``disable()`` (see the module docstring); also a context manager. ``fuse``: the Mamba-1
    mixers run as one ``mamba_mixer`` op (``hf_mamba1_fused``) instead of a ``causal_conv1d`` and
    a ``selective_scan`` with the projections and transposes between them."""

    def __init__(self, model: nn.Module, fuse: bool = True):
        from ssmcc.frontend.routes import routed

        self._stack = contextlib.ExitStack()
        self.record = self._stack.enter_context(routed(model))
        mixers = {type(m) for m in model.modules() if _is_routed_mixer(m, self.record)}
        mixers = sorted(mixers, key=lambda c: c.__qualname__)
        fused = self._stack.enter_context(fused_mixers(mixers)) if fuse else []
        # A fused forward is a few lines to trace; as a region it would cost throughput
        # (mamba-130m at L=2048, AMD EPYC Zen 4, 2 threads: 445 tok/s as regions, 595 inlined,
        # with the same cold compile).
        self._stack.enter_context(compile_regions([c for c in mixers if c not in fused]))
        # Python floats (a mixer's eps) as constants: with dynamic=True Dynamo would lift them as
        # inputs, which AOT autograd cannot read inside an invoke_subgraph (torch 2.13 fails with
        # aten._local_scalar_dense and Dynamo falls back to eager for the whole model).
        self._stack.enter_context(torch._dynamo.config.patch(specialize_float=True))
        self.active = True
        ENABLED.append(self)

    def disable(self) -> None:
        if self.active:
            self.active = False
            ENABLED.remove(self)
            self._stack.close()

    def __enter__(self) -> Routes:
        return self

    def __exit__(self, *exc) -> None:
        self.disable()


@atexit.register  # restored before the interpreter tears modules down
def _disable_all() -> None:
    for routes in reversed(list(ENABLED)):
        routes.disable()


def _is_routed_mixer(module: nn.Module, record) -> bool:
    return any(type(module).__name__ == name for _, name in record.layers)


def enable_routes(model: nn.Module, fuse: bool = True) -> Routes:
    """Have ``model``'s Hugging Face mixers call the ssmcc ops (for ``torch.compile``): returns
    the handle whose ``disable()`` restores the library. Raises if no route knows the model.
    ``fuse=False`` keeps each Mamba-1 mixer as a ``causal_conv1d`` and a ``selective_scan``
    (see ``Routes``)."""
    from ssmcc.frontend.routes import routes_for

    if not routes_for(model):
        raise OptionError(
            f"no ssmcc route knows the classes of {type(model).__name__} (routes exist for the "
            "Hugging Face Mamba, Mamba-2 and hybrid families); a hand-written model needs none: "
            "torch.compile(model, backend='ssmcc') reads its graph as it is"
        )
    return Routes(model, fuse=fuse)


@contextlib.contextmanager
def routes_enabled(model: nn.Module, fuse: bool = True):
    """``with ssmcc.routes_enabled(model): ...``: ``enable_routes`` for the block."""
    routes = enable_routes(model, fuse=fuse)
    try:
        yield routes
    finally:
        routes.disable()
