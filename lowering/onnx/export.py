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
import warnings

import onnx
import torch
from torch.export import ExportedProgram

from ssmcc.errors import LoweringError
from ssmcc.lowering.onnx.emitters import ONNX_TABLE
from ssmcc.lowering.onnx.functions import causal_conv1d_function, selective_scan_function
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


def _conv_widths(program: ExportedProgram) -> set[int]:
    return {
        int(node.args[1].meta["val"].shape[1])
        for node in program.graph.nodes
        if node.op == "call_function" and node.target == SSMCC_OPS["causal_conv1d"]
    }


def _rename_dims(model: onnx.ModelProto, names: dict[str, str]) -> None:
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in names:
                dim.dim_param = names[dim.dim_param]


def lower_to_onnx(
    program: ExportedProgram,
    input_names: list[str] | None = None,
    output_names: list[str] | None = None,
    dim_names: dict[str, str] | None = None,
) -> onnx.ModelProto:
    """``dim_names`` maps the program's symbol names (e.g. ``s0``) to ONNX dim names."""
    register_schemas()
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
    if "SelectiveScan" in used:
        model.functions.append(selective_scan_function(OPSET))
    if "CausalConv1d" in used:
        model.functions.append(causal_conv1d_function(OPSET, widths.pop()))
    _rename_dims(model, dim_names or {})
    return model
