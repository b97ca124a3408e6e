"""``SsdScan`` as a chain of five ssmcc nodes for the TensorRT target: SSD's block decomposition
(``kernels/triton/ssd_scan.py``), one plugin (one kernel) per node, the intermediates node
outputs. Q = the ``chunk`` attribute (a constant of every plugin's specialisation), K = cdiv(l,
Q); x, z (b, l, h, p), dt (b, l, h), B, C (b, l, g, n), D (h, p), head i in group i // (h / g)::

    SsdChunkCumsum(dt, A, dt_bias)            -> dt_chunks, dA_cumsum       (b, h, K, Q) float32
        dt_t = clamp(softplus?(dt_t + dt_bias), dt_min, dt_max), 0 past l;  a_t = cumsum_q dt A
    SsdChunkState(x, B, dt_chunks, dA_cumsum) -> chunk_states              (b, K, h, p, n) float32
        S_k = sum_t x_t exp(a_last - a_t) dt_t B_t^T                          (the chunk from 0)
    SsdStatePassing(chunk_states, dA_cumsum, initial_state)
                                              -> chunk_starts (b, K, h, p, n), final_state
        h_in[0] = h0;  h_in[k+1] = exp(a_last(k)) h_in[k] + S_k;  final_state = h_in[K]
    SsdBmm(C, B)                              -> CB                         (b, K, g, Q, Q) float32
        CB_k[m, s] = C_m . B_s (only s <= m is read; the plugin leaves tiles above the diagonal
        unwritten)
    SsdChunkScan(x, z, C, D, dt_chunks, dA_cumsum, chunk_starts, CB)     -> out  (x's dtype)
        y_m = exp(a_m) C_m h_in^T + sum_{s<=m} CB[m, s] exp(a_m - a_s) dt_s x_s + D x_m,
        times silu(z_m) when has_z

Each node also has a model-local function of standard ONNX ops computing the same outputs in
float32 (the sequence zero-padded to K Q positions, MatMul per chunk, an ONNX ``Scan`` over the
chunks for the state passing), so ONNX Runtime still runs the rewritten graphs; TensorRT's parser
binds the nodes to the plugins (``plugin_namespace``). ``split_ssd_scans`` rewrites a graph.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from ssmcc.errors import LoweringError
from ssmcc.kernels.triton import configs
from ssmcc.lowering.onnx.functions import _Body, _dim, scan_value
from ssmcc.lowering.onnx.functions_ssd import _float_attr, _int_attr_1d
from ssmcc.lowering.onnx.schemas import _FLOAT_TYPES, DOMAIN, VERSION, _schema
from ssmcc.lowering.tensorrt.chain_rewrite import (
    NodeChain,
    concat_dims,
    floats,
    register_schemas,
    replace_nodes,
    step_function,
)

OPSET = 20
CHUNK = configs.SSD_GPU.chunk  # the chunk length the rewrite writes (the GPU's)
_DT = ["dt_softplus", "dt_min", "dt_max"]

# (op_type, inputs, outputs, attributes): names of SsdScan's inputs / outputs or of intermediates
CHAIN = (
    ("SsdChunkCumsum", ("dt", "A", "dt_bias"), ("dt_chunks", "dA_cumsum"), (*_DT, "chunk")),
    ("SsdChunkState", ("x", "B", "dt_chunks", "dA_cumsum"), ("chunk_states",), ("chunk",)),
    (
        "SsdStatePassing",
        ("chunk_states", "dA_cumsum", "initial_state"),
        ("chunk_starts", "final_state"),
        ("chunk",),
    ),
    ("SsdBmm", ("C", "B"), ("CB",), ("chunk",)),
    (
        "SsdChunkScan",
        ("x", "z", "C", "D", "dt_chunks", "dA_cumsum", "chunk_starts", "CB"),
        ("out",),
        ("has_z", "chunk"),
    ),
)
SCAN_INPUTS = ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_state")
SCAN_OUTPUTS = ("out", "final_state")
FLOAT32_VALUES = {"dt_chunks", "dA_cumsum", "chunk_states", "chunk_starts", "final_state", "CB"}


def _attribute_schema(name: str) -> OpSchema.Attribute:
    kind = OpSchema.AttrType.FLOAT if name in ("dt_min", "dt_max") else OpSchema.AttrType.INT
    return OpSchema.Attribute(name, kind, f"see SsdScan ({name})", required=True)


def _schemas() -> list[OpSchema]:
    made = []
    for op_type, inputs, outputs, attributes in CHAIN:
        params = lambda names: [  # noqa: E731
            OpSchema.FormalParameter(n, "F" if n in FLOAT32_VALUES else "T") for n in names
        ]
        made.append(
            _schema(
                op_type,
                DOMAIN,
                VERSION,
                doc="A piece of the SSD scan for TensorRT (ssmcc.lowering.tensorrt.ssd_chain).",
                inputs=params(inputs),
                outputs=params(outputs),
                type_constraints=[
                    ("T", _FLOAT_TYPES, "floating point"),
                    ("F", ["tensor(float)"], "float32"),
                ],
                attributes=[_attribute_schema(a) for a in attributes],
            )
        )
    return made


def register_chain_schemas() -> None:
    register_schemas(_schemas())


# ---- the model-local functions ------------------------------------------------------------


def _padded(body: _Body, t: str, rank: int, length: str, padded: str) -> str:
    """``t`` zero-padded along axis 1 from ``length`` to ``padded`` positions."""
    pads = body.op(
        "Concat",
        body.const([0] * (rank + 1)),
        body.op("Sub", padded, length),
        body.const([0] * (rank - 2)),
        axis=0,
    )
    return body.op("Pad", t, pads)


def _chunking(body: _Body, t: str) -> tuple[str, str, str, str]:
    """(l, Q, K, K Q) of a (b, l, ...) input ``t``, as 1-element int64 tensors."""
    length, chunk = _dim(body, t, 1), _int_attr_1d(body, "chunk")
    chunks = body.op("Div", body.op("Sub", body.op("Add", length, chunk), body.const([1])), chunk)
    return length, chunk, chunks, body.op("Mul", chunks, chunk)


def _last_position(body: _Body, a: str, chunk: str) -> str:
    """a[..., Q-1:Q] of a (b, h, K, Q) tensor."""
    return body.op("Slice", a, body.op("Sub", chunk, body.const([1])), chunk, body.const([3]))


def _function(op_type: str, body: _Body) -> onnx.FunctionProto:
    return step_function(CHAIN, op_type, body.nodes, OPSET)


def chunk_cumsum_function() -> onnx.FunctionProto:
    body = _Body("cc")
    dt, A, bias = floats(body, "dt", "A", "dt_bias")
    body.softplus_if("dt_softplus", body.op("Add", dt, bias), "dt_soft")
    step = body.op("Clip", "dt_soft", _float_attr(body, "dt_min"), _float_attr(body, "dt_max"))
    length, chunk, chunks, padded = _chunking(body, "dt")
    b, h = _dim(body, "dt", 0), _dim(body, "dt", 2)
    step = _padded(body, step, 3, length, padded)
    step = body.op("Reshape", step, concat_dims(body, b, chunks, chunk, h))
    body.nodes.append(helper.make_node("Transpose", [step], ["dt_chunks"], perm=[0, 3, 1, 2]))
    decay = body.op("Mul", "dt_chunks", body.op("Unsqueeze", A, body.const([1, 2])))
    body.nodes.append(helper.make_node("CumSum", [decay, body.const([3])], ["dA_cumsum"]))
    return _function("SsdChunkCumsum", body)


def _by_head(body: _Body, t: str, chunks, chunk, b, g, per_group, tail):
    """A padded (b, K Q, h, tail...) or (b, K Q, g, tail...) tensor as (b, K, Q, g, h/g or 1,
    tail)."""
    return body.op("Reshape", t, concat_dims(body, b, chunks, chunk, g, per_group, *tail))


def chunk_state_function() -> onnx.FunctionProto:
    body = _Body("cs")
    x, B = floats(body, "x", "B")
    length, chunk, chunks, padded = _chunking(body, "x")
    b, h, p = _dim(body, "x", 0), _dim(body, "x", 2), _dim(body, "x", 3)
    g, n, one = _dim(body, "B", 2), _dim(body, "B", 3), body.const([1])
    per_group = body.op("Div", h, g)
    weight = body.op(
        "Mul",
        body.op("Exp", body.op("Sub", _last_position(body, "dA_cumsum", chunk), "dA_cumsum")),
        "dt_chunks",
    )  # (b, h, K, Q)
    weight = body.op(
        "Reshape",
        body.op("Transpose", weight, perm=[0, 2, 1, 3]),
        concat_dims(body, b, chunks, g, per_group, chunk, one),
    )
    x6 = _by_head(body, _padded(body, x, 4, length, padded), chunks, chunk, b, g, per_group, [p])
    B6 = _by_head(body, _padded(body, B, 4, length, padded), chunks, chunk, b, g, one, [n])
    xT = body.op("Transpose", x6, perm=[0, 1, 3, 4, 5, 2])  # (b, K, g, h/g, p, Q)
    Bw = body.op("Mul", body.op("Transpose", B6, perm=[0, 1, 3, 4, 2, 5]), weight)  # (.., Q, n)
    states = body.op("MatMul", xT, Bw)
    body.nodes.append(
        helper.make_node(
            "Reshape", [states, concat_dims(body, b, chunks, h, p, n)], ["chunk_states"]
        )
    )
    return _function("SsdChunkState", body)


def state_passing_function() -> onnx.FunctionProto:
    body = _Body("sp")
    chunk = _int_attr_1d(body, "chunk")
    decay = body.op("Exp", _last_position(body, "dA_cumsum", chunk))  # (b, h, K, 1)
    decay = body.op("Unsqueeze", body.op("Transpose", decay, perm=[2, 0, 1, 3]), body.const([4]))
    states = body.op("Transpose", "chunk_states", perm=[1, 0, 2, 3, 4])  # (K, b, h, p, n)
    (h0,) = floats(body, "initial_state")
    step = helper.make_graph(
        [
            helper.make_node("Identity", ["h_prev"], ["h_start"]),
            helper.make_node("Mul", ["decay_k", "h_prev"], ["carried"]),
            helper.make_node("Add", ["carried", "S_k"], ["h_next"]),
        ],
        "ssd_state_passing_step",
        [scan_value(v, 4) for v in ("h_prev", "S_k", "decay_k")],
        [scan_value(v, 4) for v in ("h_next", "h_start")],
    )
    body.nodes.append(
        helper.make_node(
            "Scan", [h0, states, decay], ["final_state", "sp_starts"], body=step,
            num_scan_inputs=2,
        )
    )
    body.nodes.append(
        helper.make_node("Transpose", ["sp_starts"], ["chunk_starts"], perm=[1, 0, 2, 3, 4])
    )
    return _function("SsdStatePassing", body)


def bmm_function() -> onnx.FunctionProto:
    body = _Body("bm")
    C, B = floats(body, "C", "B")
    length, chunk, chunks, padded = _chunking(body, "C")
    b, g, n = _dim(body, "C", 0), _dim(body, "C", 2), _dim(body, "C", 3)
    grouped = concat_dims(body, b, chunks, chunk, g, n)
    by_chunk = lambda t: body.op(  # noqa: E731  (b, K, g, Q, n)
        "Transpose",
        body.op("Reshape", _padded(body, t, 4, length, padded), grouped),
        perm=[0, 1, 3, 2, 4],
    )
    Bt = body.op("Transpose", by_chunk(B), perm=[0, 1, 2, 4, 3])
    body.nodes.append(helper.make_node("MatMul", [by_chunk(C), Bt], ["CB"]))
    return _function("SsdBmm", body)


def chunk_scan_function() -> onnx.FunctionProto:
    body = _Body("sc")
    x, z, C, D = floats(body, "x", "z", "C", "D")
    length, chunk, chunks, padded = _chunking(body, "x")
    b, h, p = _dim(body, "x", 0), _dim(body, "x", 2), _dim(body, "x", 3)
    g, n, one = _dim(body, "C", 2), _dim(body, "C", 3), body.const([1])
    per_group = body.op("Div", h, g)
    a = body.op("Transpose", "dA_cumsum", perm=[0, 2, 1, 3])  # (b, K, h, Q)
    dt = body.op("Transpose", "dt_chunks", perm=[0, 2, 1, 3])
    # from the state entering the chunk: exp(a_m) C_m h_in^T
    C6 = _by_head(body, _padded(body, C, 4, length, padded), chunks, chunk, b, g, one, [n])
    C6 = body.op("Transpose", C6, perm=[0, 1, 3, 4, 2, 5])  # (b, K, g, 1, Q, n)
    starts = body.op("Reshape", "chunk_starts", concat_dims(body, b, chunks, g, per_group, p, n))
    starts = body.op("Transpose", starts, perm=[0, 1, 2, 3, 5, 4])  # (b, K, g, h/g, n, p)
    grouped = concat_dims(body, b, chunks, g, per_group, chunk, one)
    y = body.op(
        "Mul", body.op("MatMul", C6, starts), body.op("Exp", body.op("Reshape", a, grouped))
    )
    # within the chunk: (CB o L) x, L[m, s] = exp(a_m - a_s) dt_s for s <= m
    positions = body.op(
        "Range",
        body.op("Constant", value=helper.make_tensor("zero", TensorProto.INT64, [], [0])),
        body.op("Squeeze", chunk, body.const([0])),
        body.op("Constant", value=helper.make_tensor("one", TensorProto.INT64, [], [1])),
    )
    causal = body.op(
        "GreaterOrEqual",
        body.op("Unsqueeze", positions, body.const([1])),
        body.op("Unsqueeze", positions, body.const([0])),
    )
    diff = body.op(
        "Sub", body.op("Unsqueeze", a, body.const([4])), body.op("Unsqueeze", a, body.const([3]))
    )
    zero = body.op("Constant", value=helper.make_tensor("zero_f", TensorProto.FLOAT, [], [0.0]))
    L = body.op("Mul", body.op("Where", causal, body.op("Exp", diff), zero),
                body.op("Unsqueeze", dt, body.const([3])))  # (b, K, h, Q, Q)
    L = body.op("Reshape", L, concat_dims(body, b, chunks, g, per_group, chunk, chunk))
    weights = body.op("Mul", L, body.op("Unsqueeze", "CB", body.const([3])))
    x6 = _by_head(body, _padded(body, x, 4, length, padded), chunks, chunk, b, g, per_group, [p])
    x6 = body.op("Transpose", x6, perm=[0, 1, 3, 4, 2, 5])  # (b, K, g, h/g, Q, p)
    y = body.op("Add", y, body.op("MatMul", weights, x6))
    y = body.op("Transpose", body.op("Reshape", y, concat_dims(body, b, chunks, h, chunk, p)),
                perm=[0, 1, 3, 2, 4])
    y = body.op("Reshape", y, concat_dims(body, b, padded, h, p))
    y = body.op("Slice", y, body.const([0]), length, body.const([1]))
    y = body.op("Add", y, body.op("Mul", D, x))
    body.gate_if("has_z", y, z, "y_gated")
    body.nodes.append(helper.make_node("CastLike", ["y_gated", "x"], ["out"]))
    return _function("SsdChunkScan", body)


FUNCTIONS = {
    "SsdChunkCumsum": chunk_cumsum_function,
    "SsdChunkState": chunk_state_function,
    "SsdStatePassing": state_passing_function,
    "SsdBmm": bmm_function,
    "SsdChunkScan": chunk_scan_function,
}


# ---- the rewrite --------------------------------------------------------------------------


def _intermediates(node: onnx.NodeProto, dims: dict, chunk: int) -> dict[str, tuple]:
    """The dims of the chain's float32 intermediates, dims from x's and B's (the count of
    chunks K named ``cdiv(<l>,<Q>)`` when l is not a number)."""
    try:
        b, length, h, p = dims[node.input[0]]
        g, n = dims[node.input[3]][2:]
    except (KeyError, ValueError) as error:
        raise LoweringError(
            f"target 'tensorrt': SsdScan node {node.name!r}: the shapes of x and B are not "
            f"known ({error}); the chain's intermediates need them"
        ) from error
    K = -(-length // chunk) if isinstance(length, int) else f"cdiv({length},{chunk})"
    shapes = {
        "dt_chunks": (b, h, K, chunk),
        "dA_cumsum": (b, h, K, chunk),
        "chunk_states": (b, K, h, p, n),
        "chunk_starts": (b, K, h, p, n),
        "CB": (b, K, g, chunk, chunk),
    }
    return shapes


CHAIN_REWRITE = NodeChain(
    op_type="SsdScan",
    inputs=SCAN_INPUTS,
    outputs=SCAN_OUTPUTS,
    steps=CHAIN,
    functions=FUNCTIONS,
    intermediates=_intermediates,
    register_schemas=register_chain_schemas,
    absent={},
)


def split_ssd_scans(model: onnx.ModelProto, chunk: int = CHUNK) -> int:
    """Replace every ``SsdScan`` node of ``model``'s graph by its chain (in place) and add the
    chain's functions; returns how many were replaced."""
    return replace_nodes(model, CHAIN_REWRITE, chunk)
