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
from ssmcc.lowering.tensorrt.registration import OP_PLUGINS as OP_PLUGINS
from ssmcc.lowering.tensorrt.registration import SPECS as SPECS
from ssmcc.lowering.tensorrt.registration import plugin
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
    output_shapes: tuple[Callable, ...]  # (dims, ops, attributes) -> dims, one rule per output
    output_dtypes: tuple[str, ...]  # an input's name (its dtype) or "float32"
    extras: tuple[tuple[str, Callable], ...]  # (name, (dims) -> dim)
    grid: Callable  # (dims, ops, constexprs) -> 3 dims
    constexprs: Callable  # (attributes, static dims, input pointer types) -> {name: value}
    static_dims: tuple[tuple[str, int], ...] = ()  # (input, axis) the constexprs read
    part_of: str = ""  # the ONNX node this plugin is one of a chain for (``CHAINS``)

    @property
    def plugin_id(self) -> str:
        return f"{NAMESPACE}::{self.op_type}"


def _recurrence_constexprs(config, block: str, softplus: str) -> Callable:
    """Constants of the Mamba-1 state update: ``block`` channels per program (from the
    GPU ``config``), the state size padded to a power of two, the gate and softplus flags."""

    def constexprs(attributes: dict, static: dict, types: dict) -> dict:
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


def _conv_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    width = static[("weight", 1)]
    return {
        "WIDTH": width,
        "BLOCK_D": configs.CONV_GPU.block_d,
        "BLOCK_L": configs.CONV_GPU.chunk,
        "BLOCK_K": _next_power_of_2(width - 1),
        "ACTIVATION": _activation(attributes),
        "num_warps": configs.CONV_GPU.num_warps,
    }


def _conv_update_constexprs(attributes: dict, static: dict, types: dict) -> dict:
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

    def constexprs(attributes: dict, static: dict, types: dict) -> dict:
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


def _rmsnorm_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    group = attributes["group_size"]
    return {
        "GROUP": group,
        "EPS": float(attributes["eps"]),
        "BLOCK": _next_power_of_2(group),
        "HAS_Z": bool(attributes["has_z"]),
        "NORM_BEFORE_GATE": bool(attributes["norm_before_gate"]),
        "num_warps": 4 if group >= 1024 else 1,
    }


# ---- SsdScan as a chain of plugins (``ssd_chain.py``): SSD's five kernels, one per node -------


def _chunk(attributes: dict) -> int:
    """The chain's chunk length Q (the node's ``chunk`` attribute): a power of two >= 16, as
    ``tl.arange`` and ``tl.dot`` need."""
    chunk = int(attributes["chunk"])
    if chunk < 16 or chunk & (chunk - 1):
        raise LoweringError(
            f"an SSD plugin's chunk attribute is {chunk}; it must be a power of two >= 16"
        )
    return chunk


def _dot(types: dict, *names: str) -> str:
    """The products' dtype: the 16-bit dtype the operands ``names`` share, else float32 (IEEE:
    the TensorRT target has no TF32 option)."""
    kinds = {types[name] for name in names}
    return kinds.pop()[1:] if len(kinds) == 1 and kinds <= {"*fp16", "*bf16"} else "fp32"


def _tile(cap: int, size: int) -> int:
    """A dot's block over a dim of ``size`` (``ssd_scan._block``: 16 <= block <= cap)."""
    return max(16, min(cap, _next_power_of_2(size)))


# The 16-bit products' k block. The plugins' PTX is built with no alignment or divisibility
# hints on pointers and sizes (TensorRT gives none; the triton target's JIT builds have them), and
# there the triton target's k 64 spills: ptxas -v (triton 3.9, sm_90, mamba2-130m shapes, chunk
# 256) for chunk_scan 255 registers and 92 B spilled at k 64, 12 B at k 32, none at 16 (147
# registers; still wgmma m64n64k16 on sm_90, mma.sync m16n8k16 on sm_80).
PLUGIN_16BIT_BLOCK_K = 16


def _k_block(tile: configs.DotTile, dot: str, size: int) -> int:
    """The k block: capped for float32 operands (Triton's FMA dot), as ``ssd_scan`` does, and
    for 16-bit ones at ``PLUGIN_16BIT_BLOCK_K``."""
    cap = SSD.fma_block_k if dot == "fp32" else PLUGIN_16BIT_BLOCK_K
    return _tile(min(tile.block_k, cap), size)


def _stages(tile: configs.DotTile, dot: str) -> dict:
    """Warps and pipeline stages of a product kernel (``ssd_scan``'s: one stage for the FMA dot,
    which spills with more)."""
    stages = SSD.fma_stages if dot == "fp32" else tile.num_stages
    return {"num_warps": tile.num_warps, "num_stages": stages}


SSD = configs.SSD_GPU


def _cumsum_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    dt_max = float(attributes["dt_max"])
    return {
        "CHUNK": _chunk(attributes),
        "BLOCK_H": SSD.cumsum_heads,
        "SOFTPLUS": bool(attributes["dt_softplus"]),
        "DT_MIN": float(attributes["dt_min"]),
        "DT_MAX": dt_max if math.isfinite(dt_max) else 0.0,
        "CLAMP_MAX": math.isfinite(dt_max),
        "num_warps": SSD.num_warps,
    }


def _chunk_state_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    chunk, dot, tile = _chunk(attributes), _dot(types, "x", "B"), SSD.chunk_state
    return {
        "CHUNK": chunk,
        "BLOCK_P": _tile(tile.block_m, static[("x", 3)]),
        "BLOCK_N": _tile(tile.block_n, static[("B", 3)]),
        "BLOCK_K": _k_block(tile, dot, chunk),
        "DOT": dot,
        "WIDEN": False,
        **_stages(tile, dot),
    }


def _state_passing_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    size = static[("initial_state", 2)] * static[("initial_state", 3)]
    return {
        "CHUNK": _chunk(attributes),
        "BLOCK": min(SSD.passing_block, _next_power_of_2(size)),
        "num_warps": SSD.num_warps,
    }


def _bmm_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    chunk, dot, tile = _chunk(attributes), _dot(types, "C", "B"), SSD.bmm
    return {
        "CHUNK": chunk,
        "BLOCK_M": _tile(tile.block_m, chunk),
        "BLOCK_S": _tile(tile.block_n, chunk),
        "BLOCK_K": _k_block(tile, dot, static[("B", 3)]),
        "DOT": dot,
        "WIDEN": False,
        **_stages(tile, dot),
    }


def _chunk_scan_constexprs(attributes: dict, static: dict, types: dict) -> dict:
    chunk, dot, tile = _chunk(attributes), _dot(types, "x", "C"), SSD.chunk_scan
    return {
        "CHUNK": chunk,
        "BLOCK_M": _tile(tile.block_m, chunk),
        "BLOCK_P": _tile(tile.block_n, static[("x", 3)]),
        "BLOCK_K": _k_block(tile, dot, chunk),
        "HAS_Z": bool(attributes["has_z"]),
        "DOT": dot,
        "WIDEN": False,
        **_stages(tile, dot),
    }


def _chunks(ops, d, name: str, a: dict):
    """K = cdiv(l, Q) for a (b, l, ...) input."""
    return ops.cdiv(d[name][1], a["chunk"])


_DT_FLOATS = (("dt_softplus", int), ("dt_min", float), ("dt_max", float))
_PER_CHUNK = (
    ("length", lambda d: d["x"][1]),
    ("heads", lambda d: d["x"][2]),
    ("head_dim", lambda d: d["x"][3]),
)

SSD_CHAIN_SPECS = tuple(
    map(
        plugin,
        (
            PluginSpec(
                op="ssd_scan",
                op_type="SsdChunkCumsum",
                kernel="trt_ssd_chunk_cumsum_kernel",
                inputs=("dt", "A", "dt_bias"),
                outputs=("dt_chunks", "dA_cumsum"),
                attributes=(*_DT_FLOATS, ("chunk", int)),
                output_shapes=(
                    lambda d, ops, a: (
                        d["dt"][0],
                        d["dt"][2],
                        _chunks(ops, d, "dt", a),
                        a["chunk"],
                    ),
                )
                * 2,
                output_dtypes=(FLOAT32, FLOAT32),
                extras=(("length", lambda d: d["dt"][1]), ("heads", lambda d: d["dt"][2])),
                grid=lambda d, ops, c: (
                    d["dt"][0],
                    ops.cdiv(d["dt"][1], c["CHUNK"]),
                    ops.cdiv(d["dt"][2], c["BLOCK_H"]),
                ),
                constexprs=_cumsum_constexprs,
                part_of="SsdScan",
            ),
            PluginSpec(
                op="ssd_scan",
                op_type="SsdChunkState",
                kernel="trt_ssd_chunk_state_kernel",
                inputs=("x", "B", "dt_chunks", "dA_cumsum"),
                outputs=("chunk_states",),
                attributes=(("chunk", int),),
                output_shapes=(
                    lambda d, ops, a: (
                        d["x"][0],
                        _chunks(ops, d, "x", a),
                        d["x"][2],
                        d["x"][3],
                        d["B"][3],
                    ),
                ),
                output_dtypes=(FLOAT32,),
                extras=(
                    *_PER_CHUNK,
                    ("groups", lambda d: d["B"][2]),
                    ("nstate", lambda d: d["B"][3]),
                ),
                grid=lambda d, ops, c: (
                    d["x"][0] * ops.cdiv(d["x"][1], c["CHUNK"]),
                    d["x"][2],
                    ops.cdiv(d["x"][3], c["BLOCK_P"]) * ops.cdiv(d["B"][3], c["BLOCK_N"]),
                ),
                constexprs=_chunk_state_constexprs,
                static_dims=(("x", 3), ("B", 3)),
                part_of="SsdScan",
            ),
            PluginSpec(
                op="ssd_scan",
                op_type="SsdStatePassing",
                kernel="trt_ssd_state_passing_kernel",
                inputs=("chunk_states", "dA_cumsum", "initial_state"),
                outputs=("chunk_starts", "final_state"),
                attributes=(("chunk", int),),
                output_shapes=(
                    lambda d, ops, a: tuple(d["chunk_states"]),
                    lambda d, ops, a: tuple(d["initial_state"]),
                ),
                output_dtypes=(FLOAT32, FLOAT32),
                extras=tuple(
                    (name, lambda d, axis=axis: d["chunk_states"][axis])
                    for name, axis in (("chunks", 1), ("heads", 2), ("head_dim", 3), ("nstate", 4))
                ),
                grid=lambda d, ops, c: (
                    d["initial_state"][0],
                    d["initial_state"][1],
                    ops.cdiv(d["initial_state"][2] * d["initial_state"][3], c["BLOCK"]),
                ),
                constexprs=_state_passing_constexprs,
                static_dims=(("initial_state", 2), ("initial_state", 3)),
                part_of="SsdScan",
            ),
            PluginSpec(
                op="ssd_scan",
                op_type="SsdBmm",
                kernel="trt_ssd_bmm_kernel",
                inputs=("C", "B"),
                outputs=("CB",),
                attributes=(("chunk", int),),
                output_shapes=(
                    lambda d, ops, a: (
                        d["C"][0],
                        _chunks(ops, d, "C", a),
                        d["C"][2],
                        a["chunk"],
                        a["chunk"],
                    ),
                ),
                output_dtypes=(FLOAT32,),
                extras=(
                    ("length", lambda d: d["C"][1]),
                    ("groups", lambda d: d["C"][2]),
                    ("nstate", lambda d: d["C"][3]),
                ),
                grid=lambda d, ops, c: (
                    d["C"][0] * ops.cdiv(d["C"][1], c["CHUNK"]),
                    d["C"][2],
                    ops.cdiv(c["CHUNK"], c["BLOCK_M"]) * ops.cdiv(c["CHUNK"], c["BLOCK_S"]),
                ),
                constexprs=_bmm_constexprs,
                static_dims=(("B", 3),),
                part_of="SsdScan",
            ),
            PluginSpec(
                op="ssd_scan",
                op_type="SsdChunkScan",
                kernel="trt_ssd_chunk_scan_kernel",
                inputs=("x", "z", "C", "D", "dt_chunks", "dA_cumsum", "chunk_starts", "CB"),
                outputs=("out",),
                attributes=(("has_z", int), ("chunk", int)),
                output_shapes=(lambda d, ops, a: tuple(d["x"]),),
                output_dtypes=("x",),
                extras=(
                    *_PER_CHUNK,
                    ("groups", lambda d: d["C"][2]),
                    ("nstate", lambda d: d["C"][3]),
                ),
                grid=lambda d, ops, c: (
                    d["x"][0] * ops.cdiv(d["x"][1], c["CHUNK"]),
                    d["x"][2],
                    ops.cdiv(c["CHUNK"], c["BLOCK_M"]) * ops.cdiv(d["x"][3], c["BLOCK_P"]),
                ),
                constexprs=_chunk_scan_constexprs,
                static_dims=(("x", 3),),
                part_of="SsdScan",
            ),
        ),
    )
)


# ---- SelectiveScan as a chain of plugins (``scan_chain.py``): the Mamba-1 scan's three kernels --


def _scan_chunk(attributes: dict) -> int:
    """The Mamba-1 chain's chunk length (the node's ``chunk`` attribute): any positive length
    (the kernels step through a chunk in tiles of ``BLOCK_L``, masked past its end)."""
    chunk = int(attributes["chunk"])
    if chunk < 1:
        raise LoweringError(
            f"a selective scan plugin's chunk attribute is {chunk}; it must be >= 1"
        )
    return chunk


def _scan_chain_constexprs(*flags: str) -> Callable:
    """Constants of the Mamba-1 chain's kernels: the chunk, ``BLOCK_D`` channels per program and
    the tile length (``configs.SELECTIVE_SCAN_GPU``, the tile no longer than a chunk), the state
    padded to a power of two, and ``flags`` (``HAS_Z``, ``SOFTPLUS``) from the attributes."""
    config = configs.SELECTIVE_SCAN_GPU
    attribute = {"HAS_Z": "has_z", "SOFTPLUS": "delta_softplus"}

    def constexprs(attributes: dict, static: dict, types: dict) -> dict:
        made = {"BLOCK_D": config.block_d, "BLOCK_N": _next_power_of_2(static[("A", 1)])}
        if flags:  # the chunk kernels (the state passing reads no chunk)
            chunk = _scan_chunk(attributes)
            made = {
                "CHUNK": chunk,
                **made,
                "BLOCK_L": min(config.block_l, _next_power_of_2(chunk)),
                **{flag: bool(attributes[attribute[flag]]) for flag in flags},
            }
        return {**made, "num_warps": config.num_warps}

    return constexprs


def _scan_chunks(ops, d, a: dict):
    """K = cdiv(l, chunk) for the (b, d, l) input u."""
    return ops.cdiv(d["u"][2], a["chunk"])


_SCAN_SIZES = (
    ("dim", lambda d: d["u"][1]),
    ("length", lambda d: d["u"][2]),
    ("groups", lambda d: d["B"][1]),
    ("state", lambda d: d["A"][1]),
)


def _scan_grid(d, ops, c):
    """(batch, channel blocks, chunks)."""
    return (d["u"][0], ops.cdiv(d["u"][1], c["BLOCK_D"]), ops.cdiv(d["u"][2], c["CHUNK"]))


SCAN_CHAIN_SPECS = tuple(
    map(
        plugin,
        (
            PluginSpec(
                op="selective_scan",
                op_type="SelectiveScanChunkState",
                kernel="trt_selective_scan_chunk_state_kernel",
                inputs=("u", "delta", "A", "B", "delta_bias"),
                outputs=("chunk_ends", "dt_sums"),
                attributes=(("delta_softplus", int), ("chunk", int)),
                output_shapes=(
                    lambda d, ops, a: (d["u"][0], _scan_chunks(ops, d, a), d["A"][1], d["u"][1]),
                    lambda d, ops, a: (d["u"][0], _scan_chunks(ops, d, a), d["u"][1]),
                ),
                output_dtypes=(FLOAT32, FLOAT32),
                extras=_SCAN_SIZES,
                grid=_scan_grid,
                constexprs=_scan_chain_constexprs("SOFTPLUS"),
                static_dims=(("A", 1),),
                part_of="SelectiveScan",
            ),
            PluginSpec(
                op="selective_scan",
                op_type="SelectiveScanPassStates",
                kernel="trt_selective_scan_pass_states_kernel",
                inputs=("chunk_ends", "dt_sums", "A", "initial_state"),
                outputs=("chunk_starts",),
                attributes=(("chunk", int),),
                output_shapes=(lambda d, ops, a: tuple(d["chunk_ends"]),),
                output_dtypes=(FLOAT32,),
                extras=(
                    ("chunks", lambda d: d["chunk_ends"][1]),
                    ("dim", lambda d: d["A"][0]),
                    ("state", lambda d: d["A"][1]),
                ),
                grid=lambda d, ops, c: (
                    d["initial_state"][0],
                    ops.cdiv(d["initial_state"][1], c["BLOCK_D"]),
                    1,
                ),
                constexprs=_scan_chain_constexprs(),
                static_dims=(("A", 1),),
                part_of="SelectiveScan",
            ),
            PluginSpec(
                op="selective_scan",
                op_type="SelectiveScanChunkScan",
                kernel="trt_selective_scan_chunk_scan_kernel",
                inputs=("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "chunk_starts"),
                outputs=("out", "last_state"),
                attributes=(("delta_softplus", int), ("has_z", int), ("chunk", int)),
                output_shapes=(
                    lambda d, ops, a: (d["u"][0], d["u"][1], d["u"][2]),
                    lambda d, ops, a: (d["u"][0], d["u"][1], d["A"][1]),
                ),
                output_dtypes=("u", FLOAT32),
                extras=_SCAN_SIZES,
                grid=_scan_grid,
                constexprs=_scan_chain_constexprs("HAS_Z", "SOFTPLUS"),
                static_dims=(("A", 1),),
                part_of="SelectiveScan",
            ),
        ),
    )
)


SINGLE_SPECS = tuple(
    map(
        plugin,
        (
            PluginSpec(
                op="causal_conv1d",
                op_type="CausalConv1d",
                kernel="trt_causal_conv1d_kernel",
                inputs=("x", "weight", "bias", "initial_state"),
                outputs=("out", "final_state"),
                attributes=(("activation", int),),
                output_shapes=(
                    lambda d, ops, a: (d["x"][0], d["x"][1], d["x"][2]),
                    lambda d, ops, a: (d["x"][0], d["x"][1], d["initial_state"][2]),
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
                    lambda d, ops, a: (d["x"][0], d["x"][1]),
                    lambda d, ops, a: (d["state"][0], d["state"][1], d["state"][2]),
                ),
                output_dtypes=("x", FLOAT32),
                extras=(
                    ("dim", lambda d: d["x"][1]),
                    ("nstate", lambda d: d["A"][1]),
                    ("groups", lambda d: d["B"][1]),
                ),
                grid=lambda d, ops, c: (d["x"][0], 1, ops.cdiv(d["x"][1], c["BLOCK_R"])),
                constexprs=_recurrence_constexprs(
                    configs.STATE_UPDATE_GPU, "BLOCK_R", "dt_softplus"
                ),
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
                    lambda d, ops, a: (d["x"][0], d["x"][1]),
                    lambda d, ops, a: (d["conv_state"][0], d["conv_state"][1], d["conv_state"][2]),
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
                output_shapes=(lambda d, ops, a: tuple(d["x"]),),
                output_dtypes=("x",),
                extras=(("rows", _leading_product), ("dim", lambda d: d["weight"][0])),
                grid=lambda d, ops, c: (_leading_product(d), d["weight"][0] // c["GROUP"], 1),
                constexprs=_rmsnorm_constexprs,
            ),
            PluginSpec(
                op="ssd_state_update",
                op_type="SsdStateUpdate",
                kernel="trt_ssd_state_update_kernel",
                inputs=("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
                outputs=("out", "new_state"),
                attributes=_SSD_ATTRIBUTES,
                output_shapes=(
                    lambda d, ops, a: (d["x"][0], d["x"][1], d["x"][2]),
                    lambda d, ops, a: (d["state"][0], d["state"][1], d["state"][2], d["state"][3]),
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
        ),
    )
)

# the ONNX node a chain of plugins replaces -> the chain's plugins, in order (``scan_chain.py``,
# ``ssd_chain.py``)
CHAINS = {
    "SelectiveScan": tuple(spec.op_type for spec in SCAN_CHAIN_SPECS),
    "SsdScan": tuple(spec.op_type for spec in SSD_CHAIN_SPECS),
}


def static_dims(spec: PluginSpec, shapes: dict) -> dict:
    """The dims a spec's constants read, from concrete or static ONNX input shapes."""
    return {(name, axis): int(shapes[name][axis]) for name, axis in spec.static_dims}
