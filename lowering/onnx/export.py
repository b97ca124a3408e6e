"""Lowering to ONNX: ``torch.onnx.export`` of the program with the ssmcc emitters, then the
portable function bodies attached and the symbolic dims given readable names.

Before: a verified ssmcc program. After: an ONNX ModelProto (default opset 20, ``ssmcc`` opset 1)
in which every ssmcc op is exactly one ``ssmcc``-domain node, with one model-local function per
ssmcc op type; ``onnx.checker`` passes with full checking.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import io
import logging
import operator
import re
import warnings

import onnx
import torch
from torch.export import ExportedProgram

from ssmcc.errors import LoweringError
from ssmcc.lowering.onnx.emitters import ONNX_TABLE
from ssmcc.lowering.onnx.functions import (
    causal_conv1d_function,
    causal_conv1d_update_function,
    selective_scan_function,
    selective_state_update_function,
)
from ssmcc.lowering.onnx.functions_mixer import (
    mamba_mixer_function,
    mamba_mixer_step_function,
    quantized_mamba_mixer_function,
    quantized_mamba_mixer_step_function,
    ssd_mixer_function,
    ssd_mixer_step_function,
)
from ssmcc.lowering.onnx.functions_ssd import (
    rmsnorm_gated_function,
    ssd_scan_function,
    ssd_state_update_function,
)
from ssmcc.lowering.onnx.moe import SCHEMAS as MOE_SCHEMAS
from ssmcc.lowering.onnx.moe import (
    emit_moe_experts_node,
    few_tokens,
    moe_experts_function,
    quantized_moe_experts_function,
)
from ssmcc.lowering.onnx.quantized import SCHEMAS as QUANTIZED_SCHEMAS
from ssmcc.lowering.onnx.quantized import (
    half_linear_function,
    quantized_linear_function,
    widen_function,
)
from ssmcc.lowering.onnx.schemas import DOMAIN, register_schemas
from ssmcc.lowering.onnx.weights_in_place import SCHEMA as LINEAR_SCHEMA
from ssmcc.ops import SSMCC_OPS, is_ssmcc_op

OPSET = 20
WEIGHT_BYTES = 1024  # initializers this large are weights: kept as stored, in weights.bin


@contextlib.contextmanager
def _quiet_exporter():
    """torch.onnx prints progress and warnings of its own; ssmcc reports progress itself."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@functools.cache
def _torchlib_registry():
    """torch.onnx's registry of its ATen translations at ``OPSET``, built once per process
    (building it compiles every torchlib function: about a second, which ``torch.onnx.export``
    spends again on every call)."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    return ONNXRegistry.from_torchlib(opset_version=OPSET)


def _registry_with(table: dict):
    """A copy of the torchlib registry with ssmcc's translations (``table``) registered first."""
    from torch.onnx._internal.exporter._registration import ONNXRegistry

    base = _torchlib_registry()
    registry = ONNXRegistry()
    registry._opset_version = base.opset_version
    registry.functions = {target: list(metas) for target, metas in base.functions.items()}
    for target, function in table.items():
        registry.register_op(target, function, is_complex=False)
    return registry


def _needs_decomposition(program: ExportedProgram, registry) -> list[str]:
    """What torch.onnx's decomposition (a retrace of the whole program) would have to rewrite
    before the program can be translated: ops and functions without an ONNX translation (or a
    mutating one) and higher-order ops. ``operator.getitem`` is translated on its own."""
    needs = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        target = node.target
        mutable = isinstance(target, torch._ops.OpOverload) and target._schema.is_mutable
        if mutable or not registry.is_registered(target):
            needs.append(str(target))
    return needs


def _graph_copy(program: ExportedProgram) -> ExportedProgram | None:
    """``program`` over a copy of its graph (the weights shared): the exporter's type promotion
    edits the graph it is given, and the compiled model keeps its program. None where the copy
    renamed a node the signature names (fx renames a placeholder named after a builtin)."""
    graph = torch.fx.Graph()
    graph._codegen = program.graph._codegen
    graph.output(graph.graph_copy(program.graph, {}))
    if [n.name for n in graph.nodes] != [n.name for n in program.graph.nodes]:
        return None
    copied = copy.copy(program)
    copied._graph_module = torch.fx.GraphModule(program.graph_module, graph)
    return copied


_ALIASING_CASTS = {
    torch.ops.aten.to.dtype,
    torch.ops.aten.to.device,
    torch.ops.aten.to.dtype_layout,
}


def _functional_casts(graph: torch.fx.Graph) -> None:
    """``aten.to`` (which returns its input when nothing changes) as the decomposition writes
    it: its input where dtype, device and layout are kept, else ``aten._to_copy(x, dtype=...)``
    (the only change a program exported on the CPU can make is the dtype)."""
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _ALIASING_CASTS:
            continue
        source, result = node.args[0].meta.get("val"), node.meta.get("val")
        if not isinstance(source, torch.Tensor) or not isinstance(result, torch.Tensor):
            continue
        if graph.output_node() in node.users:  # the signature names it: left to the whole path
            continue
        if (source.device, source.layout) != (result.device, result.layout):
            continue
        if source.dtype == result.dtype:
            node.replace_all_uses_with(node.args[0])
        else:
            with graph.inserting_before(node):
                cast = graph.call_function(
                    torch.ops.aten._to_copy.default, (node.args[0],), {"dtype": result.dtype}
                )
            cast.meta = dict(node.meta)
            node.replace_all_uses_with(cast)
        graph.erase_node(node)


def _export(program: ExportedProgram, table: dict, input_names, output_names):
    """What ``torch.onnx.export(program, dynamo=True, custom_translation_table=table,
    optimize=False, opset_version=OPSET)`` does for an ``ExportedProgram`` (torch 2.13's
    ``export_compat`` and ``_core.export``), with the registry built once and, where it would
    change nothing but the casts (``_needs_decomposition``), without re-tracing the program to
    decompose it: on ssmcc's programs that retrace is most of an export's time."""
    from torch.onnx._internal._lazy_import import onnxscript_apis
    from torch.onnx._internal.exporter import _core, _flags, _fx_passes, _ir_passes

    registry = _registry_with(table)
    prepared = _graph_copy(program)
    if prepared is not None:
        _functional_casts(prepared.graph)
        _fx_passes.remove_assertion_nodes(prepared.graph_module)
    if prepared is None or _needs_decomposition(prepared, registry):
        return _core.export(
            program,
            registry=registry,
            input_names=input_names,
            output_names=output_names,
            optimize=False,
            opset_version=OPSET,
            verbose=False,
        )
    with torch.fx.experimental._config.patch(backed_size_oblivious=True):
        _fx_passes.insert_type_promotion_nodes(prepared.graph_module)
    translate = _flags.set_onnx_exporting_flag(_core._exported_program_to_onnx_program)
    exported = translate(prepared, registry=registry)
    exported.model = onnxscript_apis.convert_version(exported.model, OPSET)
    if input_names:
        _ir_passes.rename_inputs(exported.model, input_names)
    if output_names:
        _ir_passes.rename_outputs(exported.model, output_names)
    return exported


def _translation_table(program: ExportedProgram, runtime_nodes: bool) -> dict:
    table = {}
    for node in program.graph.nodes:
        if node.op != "call_function" or not is_ssmcc_op(node.target):
            continue
        name = node.target._opname
        if name not in ONNX_TABLE:
            raise LoweringError(
                f"backend 'onnx' has no emitter for op ssmcc.{name} (node {node.name}); "
                f"supported: {', '.join(sorted(ONNX_TABLE))}"
            )
        table[SSMCC_OPS[name]] = ONNX_TABLE[name].emit
    few = runtime_nodes and SSMCC_OPS["moe_experts"] in table and _few_expert_tokens(program)
    if few:
        table[SSMCC_OPS["moe_experts"]] = emit_moe_experts_node
    return table


def _size(size):
    return str(size.node.expr) if isinstance(size, torch.SymInt) else int(size)


def _few_expert_tokens(program: ExportedProgram) -> bool:
    """Every ``moe_experts`` node of the program runs on few tokens (``moe.few_tokens``: at most
    a few, or one per sequence of the batch, the first user input's dim 0): a decode step."""
    first = program.graph_signature.user_inputs[0]
    batch = None
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == first:
            shape = node.meta["val"].shape
            batch = _size(shape[0]) if len(shape) else None
    return all(
        few_tokens(_size(node.args[0].meta["val"].shape[0]), batch)
        for node in program.graph.nodes
        if node.op == "call_function" and node.target is SSMCC_OPS["moe_experts"]
    )


# the ops whose arg 1 is a conv weight (d, k)
_CONVS = {SSMCC_OPS[name] for name in ("causal_conv1d", "ssd_mixer", "mamba_mixer")}
# The bodies a fused op's body calls (functions_mixer.py).
_CALLED = {
    "SsdMixer": ("CausalConv1d", "SsdScan", "RmsNormGated"),
    "SsdMixerStep": ("CausalConv1dUpdate", "SsdStateUpdate", "RmsNormGated"),
    "MambaMixer": ("CausalConv1d", "SelectiveScan"),
    "MambaMixerStep": ("CausalConv1dUpdate", "SelectiveStateUpdate"),
    "QuantizedMambaMixer": ("Widen", "MambaMixer", "CausalConv1d", "SelectiveScan"),
    "QuantizedMoeExperts": ("Widen", "MoeExperts"),
    "QuantizedMambaMixerStep": (
        "Widen",
        "MambaMixerStep",
        "CausalConv1dUpdate",
        "SelectiveStateUpdate",
    ),
}


def _conv_widths(program: ExportedProgram) -> set[int]:
    return {
        int(node.args[1].meta["val"].shape[1])
        for node in program.graph.nodes
        if node.op == "call_function" and node.target in _CONVS
    }


def _rename_dims(model: onnx.ModelProto, names: dict[str, str]) -> None:
    """Symbolic dims named as the program's inputs name them, inside expressions too
    (``s14 + 1`` -> ``past + 1``: a K/V cache one position longer)."""
    if not names:
        return
    symbol = re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")\b")
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param:
                dim.dim_param = symbol.sub(lambda m: names[m.group(1)], dim.dim_param)


# Elementwise ops of one weight folded whatever their size (onnxscript folds only inputs of up to
# 8,192 elements): ``A = -exp(A_log)`` of every Mamba layer, otherwise recomputed on every call,
# 24 Exp + 24 Neg over 24,576 floats each per decoded token for mamba-130m. Where the Exp is the
# weight's only reader (A_log in every Mamba layer) the result replaces it in the artifact.
_FOLD_ELEMENTWISE = ("Exp", "Neg")
_FOLD_ELEMENTWISE_BYTES = 4 << 20


def _fold_rules(node) -> bool | None:
    """onnxscript's folding rules: never fold a ``Transpose`` of a weight (an initializer of
    ``WEIGHT_BYTES`` or more); always fold ``_FOLD_ELEMENTWISE`` of one constant of up to
    ``_FOLD_ELEMENTWISE_BYTES``; None leaves every other node to the default rules.

    Folded, each linear layer's weight (n, k) would become a new (k, n) array: a second copy of
    the weights in memory while compiling, and a layout that ``weights_in_place`` would transpose
    back. Kept, the product reads the model's own tensor, which is written to ``weights.bin``
    as it is."""
    if node.domain not in ("", "ai.onnx") or not node.inputs:
        return None
    source = node.inputs[0]
    tensor = source.const_value if source is not None else None
    if tensor is None:
        return None
    if node.op_type == "Transpose" and tensor.nbytes >= WEIGHT_BYTES:
        return False
    if node.op_type in _FOLD_ELEMENTWISE and tensor.nbytes <= _FOLD_ELEMENTWISE_BYTES:
        return True
    return None


def _optimize(model) -> None:
    """torch.onnx's ``optimize=True`` (onnxscript's constant folding and rewrites, in place on
    the ONNX IR) with the weights' transposes kept and ``A = -exp(A_log)`` folded
    (``_fold_rules``)."""
    from onnxscript.optimizer import optimize_ir

    optimize_ir(model, should_fold=_fold_rules)


def _strip_node_metadata(model: onnx.ModelProto) -> None:
    """torch.onnx stores a stack trace and FX names on every node; the artifact needs none."""
    for node in model.graph.node:
        del node.metadata_props[:]
    for value in [*model.graph.value_info, *model.graph.input, *model.graph.output]:
        del value.metadata_props[:]


def lower_to_onnx(
    program: ExportedProgram,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dim_names: dict[str, str] | None = None,
    take_weights=None,
    runtime_nodes: bool = True,
) -> onnx.ModelProto:
    """``dim_names`` maps the program's symbol names (e.g. ``s0``) to ONNX dim names.
    ``take_weights(ir_model)``, when given, moves the weights out of the exported model before
    it becomes a ModelProto (which would otherwise hold a copy of every weight).
    ``runtime_nodes``: write the nodes that exist for ssmcc's ONNX Runtime kernels where their
    inputs are small (a decode step's ``MoeExperts``); False: standard ops there."""
    register_schemas((*QUANTIZED_SCHEMAS, LINEAR_SCHEMA, *MOE_SCHEMAS))
    table = _translation_table(program, runtime_nodes)
    widths = _conv_widths(program)
    if len(widths) > 1:
        raise LoweringError(
            f"backend 'onnx': causal_conv1d nodes use different kernel widths {sorted(widths)}; "
            "the portable body supports one width per model"
        )
    try:
        with _quiet_exporter():
            exported = _export(program, table, input_names, output_names)
    except Exception as error:
        raise LoweringError(
            f"backend 'onnx': torch.onnx.export failed: {type(error).__name__}: "
            f"{str(error).strip().splitlines()[0]}"
        ) from error
    _optimize(exported.model)
    if take_weights is not None:
        take_weights(exported.model)
    model = exported.model_proto
    del exported
    used = {node.op_type for node in model.graph.node if node.domain == DOMAIN}
    # callees before their callers: onnx.reference builds each function from those listed before
    bodies = {
        "Widen": lambda: widen_function(OPSET),
        "SelectiveScan": lambda: selective_scan_function(OPSET),
        "CausalConv1d": lambda: causal_conv1d_function(OPSET, widths.pop()),
        "SelectiveStateUpdate": lambda: selective_state_update_function(OPSET),
        "CausalConv1dUpdate": lambda: causal_conv1d_update_function(OPSET),
        "SsdScan": lambda: ssd_scan_function(OPSET),
        "SsdStateUpdate": lambda: ssd_state_update_function(OPSET),
        "RmsNormGated": lambda: rmsnorm_gated_function(OPSET),
        "SsdMixer": lambda: ssd_mixer_function(OPSET),
        "SsdMixerStep": lambda: ssd_mixer_step_function(OPSET),
        "MambaMixer": lambda: mamba_mixer_function(OPSET),
        "MambaMixerStep": lambda: mamba_mixer_step_function(OPSET),
        "QuantizedMambaMixer": lambda: quantized_mamba_mixer_function(OPSET),
        "QuantizedMambaMixerStep": lambda: quantized_mamba_mixer_step_function(OPSET),
        "QuantizedLinear": lambda: quantized_linear_function(OPSET),
        "HalfLinear": lambda: half_linear_function(OPSET),
        "MoeExperts": lambda: moe_experts_function(OPSET),
        "QuantizedMoeExperts": lambda: quantized_moe_experts_function(OPSET),
    }
    for fused, called in _CALLED.items():
        if fused in used:
            used.update(called)
    for op_type, make in bodies.items():
        if op_type in used:
            model.functions.append(make())
    _rename_dims(model, dim_names or {})
    _strip_node_metadata(model)
    return model
