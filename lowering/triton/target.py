"""The triton target: lower, save and load (see ``lowering/registry.py`` for the contract).

Lowering: the program is unlifted into an ``nn.Module`` (as the torch target does), every ssmcc
op node is pointed at its Triton launcher (``kernels/triton/registry.py``; with ``allow_tf32`` a
launcher that takes that keyword gets it: the SSD scan and mixer), weight-only
expressions are folded once (``lowering/torch/freeze.py``) and the module is moved to the device:
the current CUDA GPU, or the CPU with ``interpret=True`` (Triton's interpreter). The rest of the
graph (the ATen ops: embedding, norms, projections, the LM head) runs eagerly in PyTorch on that
device; ``kernels="reference"`` runs the ssmcc ops' PyTorch references there instead.

``run`` moves its inputs to the device; the states it returns stay there (a decode loop never
copies them back), the logits come back to the CPU, where the runtime samples. ``generate`` and
``stream`` on a CUDA device instead decode through ``decode_session``: the step captured as one
CUDA graph per batch-size bucket over state pools, tokens chosen on the device
(``decode_graph.py``); ``decode_refusal(batch)`` says why a generation decodes eagerly instead
(``cuda_graphs=False``, the CPU, reference kernels, a state read by an op that takes no slot
indices, a batch above 64).

Artifact: the torch target's (``weights.safetensors`` + one ``.pt2`` per program); the kernels
are Triton's to compile (and cache) on first use, or ahead of time with ``ssmcc kernels build``.
"""

from __future__ import annotations

import functools
import inspect
import threading

import torch

from ssmcc.kernels.triton.runtime import device_for, require_triton
from ssmcc.lowering.torch import target as torch_target
from ssmcc.lowering.torch.freeze import flatten_weight_attributes, fold_weight_expressions
from ssmcc.lowering.triton.casts import fold_casts
from ssmcc.lowering.triton.decode_plan import graph_refusal
from ssmcc.ops import SSMCC_OPS, SSMCC_REFERENCES, is_ssmcc_op
from ssmcc.passes.program_set import STATEFUL_GRAPHS, ProgramSet


def lower_to_triton(
    program, kernels: str, device: torch.device, memo: dict | None = None, allow_tf32=False
) -> torch.nn.Module:
    """The program as a module on ``device`` whose ssmcc ops call Triton launchers (weights
    copied there once per ``memo``, see ``moved_without_sharing``; ``allow_tf32`` passed to the
    launchers that take it)."""
    from ssmcc.kernels.triton.registry import TRITON_KERNELS

    table = TRITON_KERNELS if kernels == "auto" else SSMCC_REFERENCES
    module = program.module()
    for node in module.graph.nodes:
        if node.op == "call_function" and is_ssmcc_op(node.target):
            launcher = table.get(node.target._opname)
            if launcher is not None:  # else torch.ops dispatch runs the op's registered kernel
                node.target = with_options(launcher, allow_tf32=allow_tf32)
    module.recompile()
    fold_weight_expressions(module)
    flatten_weight_attributes(module)
    if kernels == "auto":
        module.meta["cast_hits"] = fold_casts(module)
    return moved_without_sharing(module, lambda t: t.to(device), {} if memo is None else memo)


def with_options(launcher, **options):
    """``launcher`` with the ``options`` it takes as keywords bound (itself when none is set or
    it takes none of them), named as it is (the graph's code names its targets)."""
    accepted = inspect.signature(launcher).parameters
    bound = {k: v for k, v in options.items() if v and k in accepted}
    if not bound:
        return launcher

    @functools.wraps(launcher)
    def call(*args, **kwargs):
        return launcher(*args, **kwargs, **bound)

    return call


def moved_without_sharing(module: torch.nn.Module, convert, memo: dict) -> torch.nn.Module:
    """``module`` with every parameter and buffer replaced by ``convert(tensor)``, a new object.

    ``program.module()`` shares its parameters with the captured program (and so with the
    user's model); ``module.to(device)`` moves a parameter in place (``param.data = ...``) when
    the two tensor types allow it, as CPU -> CUDA does, which would move the program's own
    weights and break every program derived from it later (the stateful graphs are derived on
    first use). ``memo`` (source tensor id -> converted) lets the graphs of one executable share
    one copy of each weight on the device."""
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for name, tensor in table.items():
                if tensor is None:
                    continue
                if id(tensor) not in memo:
                    converted = convert(tensor.detach())
                    if isinstance(tensor, torch.nn.Parameter):
                        converted = torch.nn.Parameter(converted, requires_grad=False)
                    memo[id(tensor)] = (tensor, converted)  # the source kept: its id stays unique
                table[name] = memo[id(tensor)][1]
    return module


class TritonExecutable:
    """Lowered modules of a ``ProgramSet`` on one device, one per graph, made on first use, and
    the captured decode over its step (``capture``: ``decode_graph.CudaGraphs`` on a CUDA
    device unless ``cuda_graphs`` is off, else None; ``use_capture`` sets another strategy)."""

    def __init__(
        self,
        programs: ProgramSet,
        kernels: str,
        device: torch.device,
        allow_tf32: bool = False,
        cuda_graphs: bool = True,
    ):
        self.programs = programs
        self.kernels = kernels
        self.device = device
        self.allow_tf32 = allow_tf32
        self.specs = programs.specs
        self.cuda_graphs = cuda_graphs
        self.capture = None
        if device.type == "cuda" and cuda_graphs:
            from ssmcc.lowering.triton.decode_graph import CudaGraphs

            self.capture = CudaGraphs(device)
        self._modules: dict[str, torch.nn.Module] = {}
        self._on_device: dict = {}  # one copy of each weight on the device, for every graph
        self._decoder = None  # decode_graph.GraphDecoder, made on first use
        self._step_refusal: str | None = None
        self._decoder_lock = threading.Lock()

    @property
    def graphs(self) -> tuple[str, ...]:
        return self.programs.graphs

    def module(self, graph: str) -> torch.nn.Module:
        if graph not in self._modules:
            module = lower_to_triton(
                self.programs.program(graph),
                self.kernels,
                self.device,
                self._on_device,
                self.allow_tf32,
            )
            if graph in STATEFUL_GRAPHS:
                module.validate_inputs = False  # CompiledModel checked the ids and states
            self._modules[graph] = module
        return self._modules[graph]

    def use_capture(self, capture) -> None:
        """Decode through ``capture`` (e.g. ``decode_graph.DirectCall()``: the captured path's
        static buffers run without a graph, on the CPU too); None: eagerly."""
        with self._decoder_lock:
            self.capture, self._decoder, self._step_refusal = capture, None, None

    def decode_refusal(self, batch: int) -> str | None:
        """Why ``generate``/``stream`` of ``batch`` rows decode eagerly, or None."""
        step = None
        if self.cuda_graphs and self.capture is not None and self.kernels == "auto":
            step = self._graph_decoder()[1]
        return graph_refusal(
            cuda_graphs=self.cuda_graphs,
            capture=self.capture,
            kernels=self.kernels,
            batch=batch,
            step_refusal=step,
        )

    def decode_session(self, batch: int, sampling):
        """A generation decoded on the device (``decode_graph.DecodeSession``), or None: it
        decodes eagerly (``decode_refusal``), or another generation holds the graphs."""
        if self.decode_refusal(batch) is not None:
            return None
        return self._graph_decoder()[0].session(batch, sampling)

    def _graph_decoder(self) -> tuple:
        """(the ``GraphDecoder``, None) or (None, why the step cannot run over pools)."""
        from ssmcc.lowering.triton.decode_graph import GraphDecoder
        from ssmcc.lowering.triton.pooled_step import StepRefusal

        with self._decoder_lock:
            if self._decoder is None and self._step_refusal is None:
                try:
                    self._decoder = GraphDecoder(
                        self.module("step"), self.specs, self.device, self.capture
                    )
                except StepRefusal as refusal:
                    self._step_refusal = str(refusal)
            return self._decoder, self._step_refusal

    def run(self, graph: str, *inputs) -> list[torch.Tensor]:
        moved = [t.to(self.device) if isinstance(t, torch.Tensor) else t for t in inputs]
        with torch.no_grad():
            outputs = self.module(graph)(*moved)
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        if outputs and self.device.type != "cpu":
            outputs[0] = outputs[0].cpu()
        return outputs


def _device(options) -> torch.device:
    require_triton()
    return device_for(bool(options["interpret"]))


def lower(programs: ProgramSet, options) -> TritonExecutable:
    return TritonExecutable(programs, options.kernels, _device(options), options["allow_tf32"],
                            options["cuda_graphs"])


def save(executable: TritonExecutable, folder: str) -> dict:
    return torch_target.save(executable, folder)


def load(files, manifest: dict, options) -> TritonExecutable:
    device = _device(options)
    restored = torch_target.load(files, manifest, options)
    return TritonExecutable(restored.programs, options.kernels, device, options["allow_tf32"],
                            options["cuda_graphs"])


def native_ops() -> dict[str, str]:
    from ssmcc.kernels.triton.catalog import describe, launchers
    from ssmcc.kernels.triton.runtime import triton_available

    if not triton_available():
        return {}
    return {op: describe(op) for op in SSMCC_OPS if op in launchers()}


def unsupported_ops() -> dict[str, str]:
    from ssmcc.kernels.triton.catalog import launchers
    from ssmcc.kernels.triton.runtime import INSTALL_HINT, triton_available

    if not triton_available():
        return {op: f"Triton is not installed: {INSTALL_HINT}" for op in SSMCC_OPS}
    return {op: "no Triton kernel yet" for op in SSMCC_OPS if op not in launchers()}
