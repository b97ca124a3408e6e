"""The ONNX paths of the fuzzer: each op as one ssmcc node (its node form, ``schemas.py``) in an
ONNX Runtime session with the ssmcc library (``ort-lib``) or without it (``portable``: the
model-local function body)."""

from __future__ import annotations

import math

import numpy as np
import torch

from ssmcc.ops.activations import activation_code

from .fuzz_cases import Case

_MIXER_INPUTS = (
    "zxbcdt",
    "conv_weight",
    "conv_bias",
    "A",
    "D",
    "dt_bias",
    "norm_weight",
    "conv_state",
    "ssm_state",
)
_MAMBA_MIXER_INPUTS = (
    "zx",
    "conv_weight",
    "conv_bias",
    "x_proj_weight",
    "dt_proj_weight",
    "A",
    "D",
    "dt_bias",
    "conv_state",
    "ssm_state",
)
_NODES = {  # op -> (ONNX op type, node inputs, number of outputs)
    "selective_scan": (
        "SelectiveScan",
        ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"),
        2,
    ),
    "selective_state_update": (
        "SelectiveStateUpdate",
        ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
        2,
    ),
    "causal_conv1d": ("CausalConv1d", ("x", "weight", "bias", "initial_state"), 2),
    "causal_conv1d_update": ("CausalConv1dUpdate", ("x", "conv_state", "weight", "bias"), 2),
    "ssd_scan": (
        "SsdScan",
        ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state"),
        2,
    ),
    "ssd_state_update": (
        "SsdStateUpdate",
        ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
        2,
    ),
    "rmsnorm_gated": ("RmsNormGated", ("x", "z", "weight"), 1),
    "ssd_mixer": ("SsdMixer", _MIXER_INPUTS, 3),
    "ssd_mixer_step": ("SsdMixerStep", _MIXER_INPUTS, 3),
    "mamba_mixer": ("MambaMixer", _MAMBA_MIXER_INPUTS, 3),
    "mamba_mixer_step": ("MambaMixerStep", _MAMBA_MIXER_INPUTS, 3),
}
_SCALES = ("x_proj_scale", "dt_proj_scale")
# a mixer with both projections stored small: its quantized node
_QUANTIZED = {
    op: (f"Quantized{op_type}", inputs + _SCALES, count)
    for op, (op_type, inputs, count) in _NODES.items()
    if op in ("mamba_mixer", "mamba_mixer_step")
}


def _node(op: str, names) -> tuple:
    """(op type, node inputs, outputs, projections widened first) for the inputs ``names``: as
    the emitter does, both projections stored small -> the quantized node; one -> ssmcc.Widen
    of it (its output ``<name>_dense``) before the float node."""
    stored = [s.removesuffix("_scale") for s in _SCALES if s in names]
    if len(stored) == 2:
        return (*_QUANTIZED[op], [])
    op_type, inputs, count = _NODES[op]
    dense = {f"{n}_weight": f"{n}_dense" for n in stored}
    return op_type, tuple(dense.get(i, i) for i in inputs), count, stored


def _common_groups(B: torch.Tensor, C: torch.Tensor, grouped_rank: int):
    """B and C at the least common multiple of their group counts (the emitters' form)."""
    as_grouped = lambda t: t.unsqueeze(1) if t.dim() == grouped_rank - 1 else t  # noqa: E731
    B, C = as_grouped(B), as_grouped(C)
    target = math.lcm(B.shape[1], C.shape[1])
    return tuple(t.repeat_interleave(target // t.shape[1], dim=1) for t in (B, C))


def _mamba1_form(op: str, a: dict) -> dict:
    scan = op == "selective_scan"
    main, prefix = ("u", "delta") if scan else ("x", "dt")
    bias = f"{prefix}_bias"
    dim, n = a["A"].shape
    a["B"], a["C"] = _common_groups(a["B"], a["C"], 4 if scan else 3)
    softplus = f"{prefix}_softplus"
    attrs = {softplus: int(a[softplus]), "has_z": int(a["z"] is not None)}
    a["D"] = torch.zeros(dim) if a["D"] is None else a["D"]
    a["z"] = a[main] if a["z"] is None else a["z"]
    a[bias] = torch.zeros(dim) if a[bias] is None else a[bias]
    if scan and a["initial_state"] is None:
        a["initial_state"] = torch.zeros(a["u"].shape[0], dim, n)
    return attrs


def _ssd_form(op: str, a: dict) -> dict:
    x = a["x"]
    heads, head_dim = x.shape[-2:]
    attrs = {
        "dt_softplus": int(a["dt_softplus"]),
        "has_z": int(a["z"] is not None),
        "dt_min": float(a["dt_min"]),
        "dt_max": float(a["dt_max"]),
    }
    D = a["D"]
    D = torch.zeros(heads, head_dim) if D is None else D
    a["D"] = D[:, None].expand(heads, head_dim) if D.dim() == 1 else D
    a["z"] = x if a["z"] is None else a["z"]
    a["dt_bias"] = torch.zeros(heads) if a["dt_bias"] is None else a["dt_bias"]
    if op == "ssd_scan" and a["initial_state"] is None:
        a["initial_state"] = torch.zeros(x.shape[0], heads, head_dim, a["B"].shape[-1])
    return attrs


def _mixer_form(op: str, a: dict) -> dict:
    heads, inner = a["A"].shape[0], a["norm_weight"].shape[0]
    channels, width = a["conv_weight"].shape
    head_dim, groups = inner // heads, a["groups"]
    batch = a["zxbcdt"].shape[0]
    D = torch.zeros(heads) if a["D"] is None else a["D"]
    a["D"] = D[:, None].expand(heads, head_dim) if D.dim() == 1 else D
    a["conv_bias"] = torch.zeros(channels) if a["conv_bias"] is None else a["conv_bias"]
    a["dt_bias"] = torch.zeros(heads) if a["dt_bias"] is None else a["dt_bias"]
    if a["conv_state"] is None:
        a["conv_state"] = torch.zeros(batch, channels, width - 1)
    if a["ssm_state"] is None:
        state = (channels - inner) // (2 * groups)
        a["ssm_state"] = torch.zeros(batch, heads, head_dim, state)
    return {
        "groups": int(groups),
        "z_offset": max(int(a["z_offset"]), 0),
        "has_z": int(a["z_offset"] >= 0),
        "xbc_offset": int(a["xbc_offset"]),
        "dt_offset": int(a["dt_offset"]),
        "norm_group_size": int(a["norm_group_size"]),
        "eps": float(a["eps"]),
        "norm_before_gate": int(a["norm_before_gate"]),
        "activation": activation_code("fuzz", a["activation"]),
        "dt_softplus": int(a["dt_softplus"]),
        "dt_min": float(a["dt_min"]),
        "dt_max": float("inf") if a["dt_max"] is None else float(a["dt_max"]),
    }


def _mamba_mixer_form(a: dict) -> dict:
    """Neutral values for absent inputs (a projection stored small keeps its storage)."""
    channels, width = a["conv_weight"].shape
    batch, state = a["zx"].shape[0], a["A"].shape[1]
    for name in ("conv_bias", "D", "dt_bias"):
        a[name] = torch.zeros(channels) if a[name] is None else a[name]
    if a["conv_state"] is None:
        a["conv_state"] = torch.zeros(batch, channels, width - 1)
    if a["ssm_state"] is None:
        a["ssm_state"] = torch.zeros(batch, channels, state)
    return {
        "x_offset": int(a["x_offset"]),
        "z_offset": max(int(a["z_offset"]), 0),
        "has_z": int(a["z_offset"] >= 0),
        "activation": activation_code("fuzz", a["activation"]),
        "delta_softplus": int(a["delta_softplus"]),
        "has_rms": int(a["bcdt_rms_eps"] is not None),
        "rms_eps": float(a["bcdt_rms_eps"] or 0.0),
    }


def node_form(case: Case) -> tuple[dict, dict]:
    """(inputs as float32 arrays, attributes) of the op's ONNX node."""
    # inputs as float32, but a projection stored small as it is stored (next to its scale)
    projections = ("x_proj", "dt_proj")
    stored = {f"{n}_weight" for n in projections if case.args.get(f"{n}_scale") is not None}
    a = {
        k: v.float() if isinstance(v, torch.Tensor) and k not in stored else v
        for k, v in case.args.items()
    }
    if case.op in ("selective_scan", "selective_state_update"):
        attrs = _mamba1_form(case.op, a)
    elif case.op in ("ssd_scan", "ssd_state_update"):
        attrs = _ssd_form(case.op, a)
    elif case.op in ("ssd_mixer", "ssd_mixer_step"):
        attrs = _mixer_form(case.op, a)
    elif case.op in ("mamba_mixer", "mamba_mixer_step"):
        attrs = _mamba_mixer_form(a)
    elif case.op == "rmsnorm_gated":
        attrs = {
            "group_size": int(a["group_size"]),
            "eps": float(a["eps"]),
            "norm_before_gate": int(a["norm_before_gate"]),
            "has_z": int(a["z"] is not None),
        }
        a["z"] = a["x"] if a["z"] is None else a["z"]
    else:
        dim, width = a["weight"].shape
        attrs = {"activation": activation_code("fuzz", a["activation"])}
        a["bias"] = torch.zeros(dim) if a["bias"] is None else a["bias"]
        if case.op == "causal_conv1d" and a["initial_state"] is None:
            a["initial_state"] = torch.zeros(a["x"].shape[0], dim, width - 1)
    op_type, names, _, widened = _node(case.op, [k for k, v in a.items() if v is not None])
    names = [n for n in names if not n.endswith("_dense")]
    names += [f"{n}_{part}" for n in widened for part in ("weight", "scale")]
    return {k: np.ascontiguousarray(a[k].numpy()) for k in names}, attrs


_SESSIONS: dict = {}


def _functions(op: str, width: int | None, quantized: bool = False, widen: bool = False) -> list:
    """The model-local functions the op's node needs (a fused op's body calls others; ``widen``:
    ssmcc.Widen nodes before it)."""
    from ssmcc.lowering.onnx import functions, functions_mixer, functions_ssd
    from ssmcc.lowering.onnx import quantized as q
    from ssmcc.lowering.onnx.export import OPSET

    if quantized:  # Quantized{MambaMixer,MambaMixerStep}: Widen, then the float node
        outer = {
            "mamba_mixer": functions_mixer.quantized_mamba_mixer_function,
            "mamba_mixer_step": functions_mixer.quantized_mamba_mixer_step_function,
        }[op]
        return [outer(OPSET), q.widen_function(OPSET), *_functions(op, width)]
    if widen:
        return [q.widen_function(OPSET), *_functions(op, width)]

    bodies = {
        "selective_scan": lambda: [functions.selective_scan_function(OPSET)],
        "selective_state_update": lambda: [functions.selective_state_update_function(OPSET)],
        "causal_conv1d": lambda: [functions.causal_conv1d_function(OPSET, width)],
        "causal_conv1d_update": lambda: [functions.causal_conv1d_update_function(OPSET)],
        "ssd_scan": lambda: [functions_ssd.ssd_scan_function(OPSET)],
        "ssd_state_update": lambda: [functions_ssd.ssd_state_update_function(OPSET)],
        "rmsnorm_gated": lambda: [functions_ssd.rmsnorm_gated_function(OPSET)],
        "ssd_mixer": lambda: [
            functions_mixer.ssd_mixer_function(OPSET),
            functions.causal_conv1d_function(OPSET, width),
            functions_ssd.ssd_scan_function(OPSET),
            functions_ssd.rmsnorm_gated_function(OPSET),
        ],
        "ssd_mixer_step": lambda: [
            functions_mixer.ssd_mixer_step_function(OPSET),
            functions.causal_conv1d_update_function(OPSET),
            functions_ssd.ssd_state_update_function(OPSET),
            functions_ssd.rmsnorm_gated_function(OPSET),
        ],
        "mamba_mixer": lambda: [
            functions_mixer.mamba_mixer_function(OPSET),
            functions.causal_conv1d_function(OPSET, width),
            functions.selective_scan_function(OPSET),
        ],
        "mamba_mixer_step": lambda: [
            functions_mixer.mamba_mixer_step_function(OPSET),
            functions.causal_conv1d_update_function(OPSET),
            functions.selective_state_update_function(OPSET),
        ],
    }
    return bodies[op]()


def session(
    op: str,
    attrs: dict,
    ranks: dict,
    library: bool,
    width: int | None = None,
    types: tuple = (),
):
    """An ORT session running the op's node alone; ``ranks``: of each input (all dims dynamic),
    and of ``out`` / ``state_out``; ``types``: (input, ONNX element type) of inputs not float32
    (a mixer's projections stored small: its quantized node)."""
    key = (op, tuple(sorted(attrs.items())), tuple(sorted(ranks.items())), width, library, types)
    if key not in _SESSIONS:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        from ssmcc.lowering.onnx.export import OPSET
        from ssmcc.lowering.onnx.runtime import custom_op_library
        from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

        op_type, inputs, count, widened = (
            _node(op, ranks) if op in _QUANTIZED else (*_NODES[op], [])
        )
        quantized = op_type.startswith("Quantized")
        outputs = ["out", "state_out", "state2_out"][:count]
        element = dict(types)
        value = lambda name: helper.make_tensor_value_info(  # noqa: E731
            name,
            element.get(name, TensorProto.FLOAT),
            [f"{name}_{axis}" for axis in range(ranks[name])],
        )
        nodes = [
            helper.make_node("Widen", [f"{n}_weight", f"{n}_scale"], [f"{n}_dense"], domain=DOMAIN)
            for n in widened
        ]
        nodes.append(helper.make_node(op_type, list(inputs), outputs, domain=DOMAIN, **attrs))
        graph_inputs = [n for n in inputs if not n.endswith("_dense")]
        graph_inputs += [f"{n}_{part}" for n in widened for part in ("weight", "scale")]
        graph = helper.make_graph(
            nodes, f"fuzz_{op}", [value(n) for n in graph_inputs], [value(n) for n in outputs]
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, VERSION)],
            functions=_functions(op, width, quantized, bool(widened)),
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        if library:
            path = custom_op_library("auto")
            assert path is not None, "the ssmcc ORT library does not build here"
            options.register_custom_ops_library(path)
        _SESSIONS[key] = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    return _SESSIONS[key]


def output_ranks(op: str, feed: dict) -> dict:
    """Ranks of the node's outputs: ``out`` like its main input, the state like the state in."""
    if op in ("ssd_mixer", "ssd_mixer_step"):
        return {"out": feed["zxbcdt"].ndim, "state_out": 3, "state2_out": 4}
    if op in ("mamba_mixer", "mamba_mixer_step"):
        return {"out": feed["zx"].ndim, "state_out": 3, "state2_out": 3}
    main = {"selective_scan": "u", "ssd_scan": "x"}.get(op, "x")
    state = {
        "selective_scan": "initial_state",
        "selective_state_update": "state",
        "causal_conv1d": "initial_state",
        "causal_conv1d_update": "conv_state",
        "ssd_scan": "initial_state",
        "ssd_state_update": "state",
    }.get(op)
    ranks = {"out": feed[main].ndim}
    if state is not None:
        ranks["state_out"] = feed[state].ndim
    return ranks


def session_for(op: str, feed: dict, attrs: dict, library: bool):
    """The session that runs ``feed`` (its ranks, its conv width) through the op's node."""
    width = None
    if op in ("causal_conv1d", "causal_conv1d_update"):
        width = feed["weight"].shape[1]
    elif op in ("ssd_mixer", "mamba_mixer"):
        width = feed["conv_weight"].shape[1]
    ranks = {name: array.ndim for name, array in feed.items()} | output_ranks(op, feed)
    from onnx import TensorProto

    elements = {np.dtype(np.int8): TensorProto.INT8, np.dtype(np.float16): TensorProto.FLOAT16}
    types = tuple(
        (name, elements[array.dtype]) for name, array in feed.items() if array.dtype in elements
    )
    return session(op, attrs, ranks, library, width, types)


def run_onnx(case: Case, library: bool):
    feed, attrs = node_form(case)
    outputs = session_for(case.op, feed, attrs, library).run(None, feed)
    return tuple(torch.from_numpy(o) for o in outputs)
