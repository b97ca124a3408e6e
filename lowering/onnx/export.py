"""Lowering to ONNX: ``torch.onnx.export`` of the program with the ssmcc emitters, then the
portable function bodies attached and the symbolic dims given readable names.

Before: a verified ssmcc program. After: an ONNX ModelProto (default opset 20, ``ssmcc`` opset 1)
in which every ssmcc op is exactly one ``ssmcc``-domain node, with one model-local function per
ssmcc op type; ``onnx.checker`` passes with full checking.
"""

from __future__ import annotations

import contextlib
import io
import logging
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
            exported = torch.onnx.export(
                program,
                dynamo=True,
                custom_translation_table=table,
                optimize=False,  # optimised below, keeping weights as the model stores them
                opset_version=OPSET,
                input_names=input_names,
                output_names=output_names,
                verbose=False,
            )
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
