"""``capture``: torch.export of a model into the ssmcc IR, with dynamic batch and sequence dims.

Known SSM implementations are routed to the ssmcc ops for the duration of the export (see
``routes.py``). Hugging Face models are wrapped so the exported program maps ``input_ids``
(batch, seq) to logits. Any other module is exported as plain ``torch.export`` would, with
``Dim.AUTO`` on every tensor dim when ``dynamic`` is set, and the report notes that no SSM layer was
found. The model's modules are switched to eval mode during capture and their train/eval flags are
restored afterwards.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Iterator

import torch
from torch import nn
from torch.export import Dim, ExportedProgram
from torch.utils._pytree import tree_map

from ssmcc.errors import CaptureError, InputError
from ssmcc.frontend.inputs import check_token_ids
from ssmcc.frontend.report import CaptureReport, ssmcc_op_counts
from ssmcc.frontend.routes import RoutingRecord, routed

REPORT_KEY = "ssmcc.capture_report"


class CausalLMLogits(nn.Module):
    """``input_ids (batch, seq) -> logits (batch, seq, vocab)`` for a Hugging Face model.

    Without an LM head the last hidden state is returned instead of logits. With
    ``feeds_positions`` (routed attention layers) the model is given ``position_ids`` from
    ``ssmcc.positions``, which the stateful programs continue across calls.
    """

    def __init__(self, model: nn.Module, feeds_positions: bool = False):
        super().__init__()
        self.model = model
        self.feeds_positions = feeds_positions

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        extra = {}
        if self.feeds_positions:
            extra["position_ids"] = torch.ops.ssmcc.positions(input_ids)[0]
        out = self.model(input_ids=input_ids, use_cache=False, return_dict=True, **extra)
        logits = getattr(out, "logits", None)
        return logits if logits is not None else out.last_hidden_state


def is_hf_model(model: nn.Module) -> bool:
    try:
        from transformers import PreTrainedModel
    except ImportError:  # transformers is a dependency, but a broken install should not mask this
        return False
    return isinstance(model, PreTrainedModel)


def vocab_size_of(model: nn.Module) -> int | None:
    config = getattr(model, "config", None)
    return getattr(config, "vocab_size", None)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Eval mode inside the block; every submodule's previous ``training`` flag restored after."""
    flags = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in flags:
            module.training = training


def tracing_example(input_ids: torch.Tensor) -> torch.Tensor:
    """An example at least 2 x 2, so torch.export does not specialize batch or length to 1."""
    batch, length = input_ids.shape
    return input_ids.repeat(2 if batch < 2 else 1, 2 if length < 2 else 1)


def tracing_example_batch(input_ids: torch.Tensor) -> torch.Tensor:
    """The example with at least 2 rows (its length kept), so batch is not specialized to 1."""
    return input_ids.repeat(2, 1) if input_ids.shape[0] < 2 else input_ids


def _export_token_model(
    model: nn.Module, example: torch.Tensor, feeds_positions: bool = False
) -> ExportedProgram:
    batch, seq = Dim("batch", min=1), Dim("seq", min=1)
    wrapper = CausalLMLogits(model, feeds_positions)
    return torch.export.export(
        wrapper, (example,), dynamic_shapes={"input_ids": {0: batch, 1: seq}}, strict=False
    )


def _export_token_model_unrouted(model: nn.Module, example: torch.Tensor) -> ExportedProgram:
    """Without routing, a Python loop over time fixes the length: the batch dim stays dynamic,
    the sequence length is the example's."""
    wrapper = CausalLMLogits(model)
    shapes = {"input_ids": {0: Dim("batch", min=1)}}
    return torch.export.export(wrapper, (example,), dynamic_shapes=shapes, strict=False)


def _auto_dims(value):
    """``Dim.AUTO`` on every dim of every tensor in ``value`` (a tensor, or a tuple / list / dict
    of them), in ``value``'s structure; None for anything else."""

    def dims(x):
        return {axis: Dim.AUTO for axis in range(x.dim())} if isinstance(x, torch.Tensor) else None

    return tree_map(dims, value)


def auto_dynamic_shapes(model: nn.Module, example_inputs: tuple):
    """``dynamic_shapes`` for ``torch.export.export(model, example_inputs)`` with ``Dim.AUTO`` on
    every tensor dim, in the structure of ``model.forward``'s signature: by parameter name, the
    examples a ``*args`` parameter takes as one tuple (torch.export matches ``dynamic_shapes`` to
    the parameters, not to the flat examples). Parameters left to their defaults (keyword-only
    ones included) get none. A forward without a readable signature: one entry per example."""
    try:
        bound = inspect.signature(model.forward).bind(*example_inputs)
    except (TypeError, ValueError):  # no signature, or one these examples do not fit
        return tuple(_auto_dims(x) for x in example_inputs)
    return {name: _auto_dims(value) for name, value in bound.arguments.items()}


def _export_generic(model: nn.Module, example_inputs: tuple, dynamic: bool) -> ExportedProgram:
    dynamic_shapes = auto_dynamic_shapes(model, example_inputs) if dynamic else None
    return torch.export.export(model, example_inputs, dynamic_shapes=dynamic_shapes, strict=False)


def describe_input_dims(
    program: ExportedProgram, axis_names: dict[str, tuple[str, ...]] | None = None
) -> dict[str, list[str]]:
    """Each user input's dims: an int when static (torch.export's symbols specialised to a
    number included), else ``name[low,high]`` (the symbol's range).

    ``axis_names`` gives readable names (``batch``, ``seq``) for inputs whose dims ssmcc chose.
    """
    axis_names = axis_names or {}
    dims: dict[str, list[str]] = {}
    user_inputs = set(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        value = node.meta.get("val")
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        if not isinstance(value, torch.Tensor):
            continue
        names = axis_names.get(node.name, ())
        described = []
        for axis, size in enumerate(value.shape):
            if not isinstance(size, torch.SymInt) or size.node.expr.is_number:
                described.append(str(int(size)))
                continue
            expr = size.node.expr
            bounds = program.range_constraints.get(expr)
            low, high = ("?", "?") if bounds is None else (str(bounds.lower), str(bounds.upper))
            high = "inf" if "oo" in high else high
            name = names[axis] if axis < len(names) else str(expr)
            described.append(f"{name}[{low},{high}]")
        dims[node.name] = described
    return dims


def capture_with_report(
    model: nn.Module, example_inputs, dynamic: bool = True, route: bool = True
) -> tuple[ExportedProgram, CaptureReport]:
    """Capture and describe; see ``capture``. An ``ExportedProgram`` is taken as it is."""
    if isinstance(model, ExportedProgram):
        return model, CaptureReport(
            model="ExportedProgram",
            routes=[],
            ssm_layers=[],
            dynamic_dims=describe_input_dims(model),
            node_count=len(model.graph.nodes),
            op_counts=ssmcc_op_counts(model),
            capture_seconds=0.0,
            notes=["an exported program, captured by the caller"],
        )
    if not isinstance(model, nn.Module):
        raise InputError(
            f"model must be a torch.nn.Module or a torch.export ExportedProgram, got "
            f"{type(model).__name__}"
        )
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    example_inputs = tuple(example_inputs)
    hf = is_hf_model(model)
    if hf:
        if len(example_inputs) != 1:
            raise InputError(
                f"a Hugging Face model is captured from one example tensor of token ids "
                f"(batch, length); got {len(example_inputs)} example inputs"
            )
        ids = check_token_ids(example_inputs[0], vocab_size_of(model), what="example input_ids")

    started = time.perf_counter()
    model_name = type(model).__name__
    routing_scope = routed(model) if route else contextlib.nullcontext(RoutingRecord())
    with eval_mode(model), routing_scope as routing:
        try:
            if hf and dynamic and not route:
                program = _export_token_model_unrouted(model, tracing_example_batch(ids))
            elif hf and dynamic:
                program = _export_token_model(model, tracing_example(ids), routing.feeds_positions)
            elif hf:
                program = torch.export.export(CausalLMLogits(model), (ids,), strict=False)
            else:
                program = _export_generic(model, example_inputs, dynamic)
        except Exception as error:  # report torch.export's own message, with the model named
            first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
            how = f"routed via {', '.join(routing.routes)}" if routing.routes else "no SSM route"
            how = how if route else "routing off"
            raise CaptureError(
                f"torch.export failed for {model_name} ({how}): "
                f"{type(error).__name__}: {first_line}"
            ) from error

    op_counts = ssmcc_op_counts(program)
    notes = []
    if not route:
        notes.append(
            "routing off: SSM layers are captured as the model computes them; the pass "
            "detect_selective_scan rewrites the scans it recognises"
        )
    elif not routing.layers and not op_counts:
        notes.append(
            "no SSM layer found: captured as plain torch.export (no ssmcc op in the graph; "
            "known models: Hugging Face Mamba, FalconMamba); the pass detect_selective_scan "
            "rewrites the scans it recognises"
        )
    report = CaptureReport(
        model=model_name,
        routes=routing.routes,
        ssm_layers=[f"{name} ({cls})" for name, cls in routing.layers],
        dynamic_dims=describe_input_dims(program, {"input_ids": ("batch", "seq")} if hf else None),
        node_count=len(program.graph.nodes),
        op_counts=op_counts,
        capture_seconds=round(time.perf_counter() - started, 3),
        notes=notes,
    )
    program.graph_module.meta[REPORT_KEY] = report
    return program, report


def capture(
    model: nn.Module, example_inputs, dynamic: bool = True, route: bool = True
) -> ExportedProgram:
    """Capture ``model`` with torch.export into the ssmcc IR (ATen + ssmcc ops).

    ``route=False`` exports the model's own code: a Hugging Face mixer's Python loop over time
    is then unrolled at the example's length (the program is static in length; batch stays
    dynamic where the model allows), for ``detect_selective_scan`` to re-roll.

    Hugging Face Mamba / FalconMamba models take one example tensor of token ids (batch, length);
    the program maps ``input_ids`` to logits with dynamic ``batch`` and ``seq`` dims (>= 1) when
    ``dynamic``. The capture report is stored in ``program.graph_module.meta[REPORT_KEY]``. The
    model object is left as it was, also when capture fails.
    """
    program, _ = capture_with_report(model, example_inputs, dynamic, route)
    return program
