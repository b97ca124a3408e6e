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
    ssd_mixer_function,
    ssd_mixer_step_function,
)
from ssmcc.lowering.onnx.functions_ssd import (
    rmsnorm_gated_function,
    ssd_scan_function,
    ssd_state_update_function,
)
from ssmcc.lowering.onnx.quantized import SCHEMAS as QUANTIZED_SCHEMAS
from ssmcc.lowering.onnx.quantized import half_linear_function, quantized_linear_function
from ssmcc.lowering.onnx.schemas import DOMAIN, register_schemas
from ssmcc.ops import SSMCC_OPS, is_ssmcc_op

OPSET = 20


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


def _translation_table(program: ExportedProgram) -> dict:
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
    return table


# the ops whose arg 1 is a conv weight (d, k)
_CONVS = {SSMCC_OPS[name] for name in ("causal_conv1d", "ssd_mixer", "mamba_mixer")}
# The bodies a fused op's body calls (functions_mixer.py).
_CALLED = {
    "SsdMixer": ("CausalConv1d", "SsdScan", "RmsNormGated"),
    "SsdMixerStep": ("CausalConv1dUpdate", "SsdStateUpdate", "RmsNormGated"),
    "MambaMixer": ("CausalConv1d", "SelectiveScan"),
    "MambaMixerStep": ("CausalConv1dUpdate", "SelectiveStateUpdate"),
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


def _share_transposed_weights(model: onnx.ModelProto) -> int:
    """Replace each 2-D initializer that equals the transpose of another by ``Transpose(other)``.

    torch.onnx's constant folding pre-transposes linear weights; a weight tied to another use
    (the LM head and the token embedding) is then stored twice. ORT folds the Transpose back at
    session creation, so the file holds the weights once. Returns how many were shared.
    """
    from onnx import numpy_helper

    by_shape: dict[tuple, list] = {}
    for tensor in model.graph.initializer:
        if len(tensor.dims) == 2:
            by_shape.setdefault(tuple(tensor.dims), []).append(tensor)
    replaced = {}
    for tensor in list(model.graph.initializer):
        if len(tensor.dims) != 2 or tensor.name in replaced:
            continue
        candidates = by_shape.get((tensor.dims[1], tensor.dims[0]), [])
        array = None
        for other in candidates:
            if other.name == tensor.name or other.name in replaced or tensor.dims[0] < 2:
                continue
            array = numpy_helper.to_array(tensor) if array is None else array
            if (
                other.data_type == tensor.data_type
                and (numpy_helper.to_array(other) == array.T).all()
            ):
                replaced[tensor.name] = other.name
                break
    if not replaced:
        return 0
    kept = [t for t in model.graph.initializer if t.name not in replaced]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    transposes = [
        onnx.helper.make_node("Transpose", [source], [name], perm=[1, 0])
        for name, source in replaced.items()
    ]
    nodes = list(model.graph.node)
    del model.graph.node[:]
    model.graph.node.extend(transposes + nodes)
    return len(replaced)


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
) -> onnx.ModelProto:
    """``dim_names`` maps the program's symbol names (e.g. ``s0``) to ONNX dim names."""
    register_schemas(QUANTIZED_SCHEMAS)
    table = _translation_table(program)
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
                optimize=True,
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
    model = exported.model_proto
    used = {node.op_type for node in model.graph.node if node.domain == DOMAIN}
    bodies = {
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
        "QuantizedLinear": lambda: quantized_linear_function(OPSET),
        "HalfLinear": lambda: half_linear_function(OPSET),
    }
    for fused, called in _CALLED.items():
        if fused in used:
            used.update(called)
    for op_type, make in bodies.items():
        if op_type in used:
            model.functions.append(make())
    _rename_dims(model, dim_names or {})
    _share_transposed_weights(model)
    _strip_node_metadata(model)
    return model
