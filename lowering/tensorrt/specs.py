"""What each TensorRT plugin of ssmcc is, as data and size rules that import neither TensorRT
nor Triton: one ``PluginSpec`` per ssmcc ONNX node type the target binds to a plugin.

A spec says, for its node (``lowering/onnx/schemas.py`` has the layouts):

    inputs / outputs     names in the node's order (TensorRT passes them to the kernel so)
    attributes           the node's attributes the kernel is specialised on, with their types
    output_shapes        each output's dims as expressions over the input dims
    output_dtypes        each output's dtype: an input's (by name) or float32
    extras               the int32 sizes the kernel takes after the inputs
    grid                 the launch grid, three expressions
    constexprs           the kernel's compile-time constants for given attributes and static dims

An expression is a function of ``dims`` (``dims["u"][1]``: dim 1 of input ``u``) and ``ops``
(``ops.cdiv``, ``ops.max``). The TensorRT plugin (``plugins.py``) evaluates the same functions
over ``tensorrt.plugin.ShapeExpr`` values; the tests evaluate them over ints (``INT_OPS``) and
compare with the ops' fake implementations, and launch the kernels in the interpreter with them.
Only dims of inputs are read, never sizes of outputs, as in TensorRT's shape functions.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from ssmcc.errors import LoweringError
from ssmcc.kernels.triton import configs
from ssmcc.ops.activations import FORMS

FLOAT32 = "float32"
NAMESPACE = "ssmcc"  # the plugins' (TensorRT plugin registry)
ONNX_DOMAIN = "ssmcc"  # the ssmcc ONNX nodes' (``lowering/onnx/schemas.py``'s DOMAIN)
PLUGIN_VERSION = "1"


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


class IntOps:
    """``cdiv`` and ``max`` over Python ints (what ``tensorrt.plugin.cdiv`` / ``max`` do over
    shape expressions)."""

    @staticmethod
    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    @staticmethod
    def max(a: int, b: int) -> int:
        return a if a >= b else b


INT_OPS = IntOps()


@dataclasses.dataclass(frozen=True)
class PluginSpec:
    op: str  # the ssmcc op (ssmcc.ops) the node computes
    op_type: str  # the ONNX node's op_type = the plugin's name
    kernel: str  # kernels/triton/plugin_kernels.py
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attributes: tuple[tuple[str, type], ...]  # (name, int or float)
    output_shapes: tuple[Callable, ...]  # (dims) -> tuple of dims, one per output
    output_dtypes: tuple[str, ...]  # an input's name (its dtype) or "float32"
    extras: tuple[tuple[str, Callable], ...]  # (name, (dims) -> dim)
    grid: Callable  # (dims, ops, constexprs) -> 3 dims
    constexprs: Callable  # (attributes, static dims) -> {name: value}
    static_dims: tuple[tuple[str, int], ...] = ()  # (input, axis) the constexprs read

    @property
    def plugin_id(self) -> str:
        return f"{NAMESPACE}::{self.op_type}"


def _recurrence_constexprs(config, block: str, softplus: str) -> Callable:
    """Constants of a Mamba-1 scan or state update: ``block`` channels per program (from the
    GPU ``config``), the state size padded to a power of two, the gate and softplus flags."""

    def constexprs(attributes: dict, static: dict) -> dict:
        return {
            block: config.block_d,
            "BLOCK_N": _next_power_of_2(static[("A", 1)]),
            "HAS_Z": bool(attributes["has_z"]),
            "SOFTPLUS": bool(attributes[softplus]),
            "num_warps": config.num_warps,
        }

    return constexprs


def _activation(attributes: dict) -> int:
    """The conv's activation code (``ssmcc.ops.activations``), a constant of the kernel."""
    code = int(attributes["activation"])
    if not 0 <= code < len(FORMS):
        raise LoweringError(
            f"a conv plugin's activation attribute is {code}; the codes are 0-{len(FORMS) - 1} "
            f"({', '.join(FORMS)})"
        )
    return code


def _conv_constexprs(attributes: dict, static: dict) -> dict:
    width = static[("weight", 1)]
    return {
        "WIDTH": width,
        "BLOCK_D": configs.CONV_GPU.block_d,
        "BLOCK_L": configs.CONV_GPU.chunk,
        "BLOCK_K": _next_power_of_2(width - 1),
        "ACTIVATION": _activation(attributes),
        "num_warps": configs.CONV_GPU.num_warps,
    }


def _conv_update_constexprs(attributes: dict, static: dict) -> dict:
    width = static[("weight", 1)]
    return {
        "WIDTH": width,
        "BLOCK_D": configs.CONV_GPU.block_d,
        "ACTIVATION": _activation(attributes),
        "num_warps": configs.CONV_GPU.num_warps,
    }


def _ssd_constexprs(block: str, config, head_dim: tuple, state: tuple) -> Callable:
    """Constants of a Mamba-2 scan or state update: ``block`` head-dim rows per program, the state
    padded to a power of two, the flags, and the dt limits (no upper clamp when dt_max is inf)."""

    def constexprs(attributes: dict, static: dict) -> dict:
        dt_max = float(attributes["dt_max"])
        return {
            block: min(config.block_d, _next_power_of_2(static[head_dim])),
            "BLOCK_N": _next_power_of_2(static[state]),
            "HAS_Z": bool(attributes["has_z"]),
            "SOFTPLUS": bool(attributes["dt_softplus"]),
            "DT_MIN": float(attributes["dt_min"]),
            "DT_MAX": dt_max if math.isfinite(dt_max) else 0.0,
            "CLAMP_MAX": math.isfinite(dt_max),
            "num_warps": config.num_warps,
        }

    return constexprs


_SSD_ATTRIBUTES = (("dt_softplus", int), ("has_z", int), ("dt_min", float), ("dt_max", float))


def _leading_product(d):
    """Rows of the norm: the product of x's dims but the last."""
    rows = 1
    for size in d["x"][:-1]:
        rows = size * rows
    return rows


def _rmsnorm_constexprs(attributes: dict, static: dict) -> dict:
    group = attributes["group_size"]
    return {
        "GROUP": group,
        "EPS": float(attributes["eps"]),
        "BLOCK": _next_power_of_2(group),
        "HAS_Z": bool(attributes["has_z"]),
        "NORM_BEFORE_GATE": bool(attributes["norm_before_gate"]),
        "num_warps": 4 if group >= 1024 else 1,
    }


SPECS: dict[str, PluginSpec] = {
    spec.op_type: spec
    for spec in (
        PluginSpec(
            op="selective_scan",
            op_type="SelectiveScan",
            kernel="trt_selective_scan_kernel",
            inputs=("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"),
            outputs=("out", "last_state"),
            attributes=(("delta_softplus", int), ("has_z", int)),
            output_shapes=(
                lambda d: (d["u"][0], d["u"][1], d["u"][2]),
                lambda d: (d["u"][0], d["u"][1], d["A"][1]),
            ),
            output_dtypes=("u", FLOAT32),
            extras=(
                ("dim", lambda d: d["u"][1]),
                ("length", lambda d: d["u"][2]),
                ("groups", lambda d: d["B"][1]),
                ("state", lambda d: d["A"][1]),
            ),
            grid=lambda d, ops, c: (d["u"][0], ops.cdiv(d["u"][1], c["BLOCK_D"]), 1),
            constexprs=_recurrence_constexprs(
                configs.SELECTIVE_SCAN_GPU, "BLOCK_D", "delta_softplus"
            ),
            static_dims=(("A", 1),),
        ),
        PluginSpec(
            op="causal_conv1d",
            op_type="CausalConv1d",
            kernel="trt_causal_conv1d_kernel",
            inputs=("x", "weight", "bias", "initial_state"),
            outputs=("out", "final_state"),
            attributes=(("activation", int),),
            output_shapes=(
                lambda d: (d["x"][0], d["x"][1], d["x"][2]),
                lambda d: (d["x"][0], d["x"][1], d["initial_state"][2]),
            ),
            output_dtypes=("x", FLOAT32),
            extras=(("dim", lambda d: d["x"][1]), ("length", lambda d: d["x"][2])),
            grid=lambda d, ops, c: (
                d["x"][0],
                ops.cdiv(d["x"][1], c["BLOCK_D"]),
                ops.max(ops.cdiv(d["x"][2], c["BLOCK_L"]), 1),
            ),
            constexprs=_conv_constexprs,
            static_dims=(("weight", 1),),
        ),
        PluginSpec(
            op="selective_state_update",
            op_type="SelectiveStateUpdate",
            kernel="trt_selective_state_update_kernel",
            inputs=("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
            outputs=("out", "new_state"),
            attributes=(("dt_softplus", int), ("has_z", int)),
            output_shapes=(
                lambda d: (d["x"][0], d["x"][1]),
                lambda d: (d["state"][0], d["state"][1], d["state"][2]),
            ),
            output_dtypes=("x", FLOAT32),
            extras=(
                ("dim", lambda d: d["x"][1]),
                ("nstate", lambda d: d["A"][1]),
                ("groups", lambda d: d["B"][1]),
            ),
            grid=lambda d, ops, c: (d["x"][0], 1, ops.cdiv(d["x"][1], c["BLOCK_R"])),
            constexprs=_recurrence_constexprs(configs.STATE_UPDATE_GPU, "BLOCK_R", "dt_softplus"),
            static_dims=(("A", 1),),
        ),
        PluginSpec(
            op="causal_conv1d_update",
            op_type="CausalConv1dUpdate",
            kernel="trt_causal_conv1d_update_kernel",
            inputs=("x", "conv_state", "weight", "bias"),
            outputs=("out", "new_state"),
            attributes=(("activation", int),),
            output_shapes=(
                lambda d: (d["x"][0], d["x"][1]),
                lambda d: (d["conv_state"][0], d["conv_state"][1], d["conv_state"][2]),
            ),
            output_dtypes=("x", FLOAT32),
            extras=(("dim", lambda d: d["x"][1]),),
            grid=lambda d, ops, c: (d["x"][0], ops.cdiv(d["x"][1], c["BLOCK_D"]), 1),
            constexprs=_conv_update_constexprs,
            static_dims=(("weight", 1),),
        ),
        PluginSpec(
            op="rmsnorm_gated",
            op_type="RmsNormGated",
            kernel="trt_rmsnorm_gated_kernel",
            inputs=("x", "z", "weight"),
            outputs=("out",),
            attributes=(
                ("group_size", int),
                ("eps", float),
                ("norm_before_gate", int),
                ("has_z", int),
            ),
            output_shapes=(lambda d: tuple(d["x"]),),
            output_dtypes=("x",),
            extras=(("rows", _leading_product), ("dim", lambda d: d["weight"][0])),
            grid=lambda d, ops, c: (_leading_product(d), d["weight"][0] // c["GROUP"], 1),
            constexprs=_rmsnorm_constexprs,
        ),
        PluginSpec(
            op="ssd_scan",
            op_type="SsdScan",
            kernel="trt_ssd_scan_kernel",
            inputs=("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state"),
            outputs=("out", "final_state"),
            attributes=_SSD_ATTRIBUTES,
            output_shapes=(
                lambda d: (d["x"][0], d["x"][1], d["x"][2], d["x"][3]),
                lambda d: (d["x"][0], d["x"][2], d["x"][3], d["B"][3]),
            ),
            output_dtypes=("x", FLOAT32),
            extras=(
                ("length", lambda d: d["x"][1]),
                ("heads", lambda d: d["x"][2]),
                ("head_dim", lambda d: d["x"][3]),
                ("groups", lambda d: d["B"][2]),
                ("nstate", lambda d: d["B"][3]),
            ),
            grid=lambda d, ops, c: (d["x"][0], d["x"][2], ops.cdiv(d["x"][3], c["BLOCK_P"])),
            constexprs=_ssd_constexprs("BLOCK_P", configs.STATE_UPDATE_GPU, ("x", 3), ("B", 3)),
            static_dims=(("x", 3), ("B", 3)),
        ),
        PluginSpec(
            op="ssd_state_update",
            op_type="SsdStateUpdate",
            kernel="trt_ssd_state_update_kernel",
            inputs=("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
            outputs=("out", "new_state"),
            attributes=_SSD_ATTRIBUTES,
            output_shapes=(
                lambda d: (d["x"][0], d["x"][1], d["x"][2]),
                lambda d: (d["state"][0], d["state"][1], d["state"][2], d["state"][3]),
            ),
            output_dtypes=("x", FLOAT32),
            extras=(
                ("heads", lambda d: d["x"][1]),
                ("head_dim", lambda d: d["x"][2]),
                ("nstate", lambda d: d["B"][2]),
                ("groups", lambda d: d["B"][1]),
            ),
            grid=lambda d, ops, c: (d["x"][0], d["x"][1], ops.cdiv(d["x"][2], c["BLOCK_R"])),
            constexprs=_ssd_constexprs("BLOCK_R", configs.STATE_UPDATE_GPU, ("x", 2), ("B", 2)),
            static_dims=(("x", 2), ("B", 2)),
        ),
    )
}

OP_TYPES = {spec.op: spec.op_type for spec in SPECS.values()}


def static_dims(spec: PluginSpec, shapes: dict) -> dict:
    """The dims a spec's constants read, from concrete or static ONNX input shapes."""
    return {(name, axis): int(shapes[name][axis]) for name, axis in spec.static_dims}
