"""``SelectiveScan`` as a chain of three ssmcc nodes for the TensorRT target: the Mamba-1 scan's
chunked kernels (``kernels/triton/selective_scan.py``), one plugin (one kernel) per node, the
intermediates node outputs. Q = the ``chunk`` attribute (a constant of every plugin's
specialisation), K = cdiv(l, Q); u, delta, z, out (b, d, l), A (d, n), B, C (b, g, n, l),
channel c in group c // (d / g)::

    SelectiveScanChunkState(u, delta, A, B, delta_bias)
                                  -> chunk_ends (b, K, n, d), dt_sums (b, K, d)       float32
        dt_t = softplus?(delta_t + delta_bias), 0 past l; each chunk from a zero state:
        S_k = sum_t exp(A (dt_{t+1} + ... + dt_last)) dt_t u_t B_t,  dt_sum_k = sum_t dt_t
    SelectiveScanPassStates(chunk_ends, dt_sums, A, initial_state)
                                  -> chunk_starts (b, K, n, d)                        float32
        h_in[0] = h0;  h_in[k+1] = exp(A dt_sum_k) h_in[k] + S_k
    SelectiveScanChunkScan(u, delta, A, B, C, D, z, delta_bias, chunk_starts)
                                  -> out (u's dtype), last_state (b, d, n) float32
        every chunk again from h_in[k]: h_t = exp(dt_t A) h_{t-1} + dt_t u_t B_t,
        y_t = C_t h_t + D u_t, times silu(z_t) when has_z; last_state: the last chunk's end

The chain reads u, delta and B twice (the chunk state and the chunk scan) for parallelism along
the sequence: a program per (batch row, channel block, chunk), only the state passing walking the
K chunks. Each node also has a model-local function of standard ONNX ops computing the same
outputs in float32 (the sequence zero-padded to K Q positions with dt 0 there, an ONNX ``Scan``
over the Q positions of every chunk at once, one over the K chunks for the state passing), so
ONNX Runtime still runs the rewritten graphs; TensorRT's parser binds the nodes to the plugins
(``plugin_namespace``). ``split_selective_scans`` rewrites a graph.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper
from onnx.defs import OpSchema

from ssmcc.errors import LoweringError
from ssmcc.kernels.triton import configs
from ssmcc.lowering.onnx.functions import INT64_MAX, _Body, _dim, scan_value
from ssmcc.lowering.onnx.functions_ssd import _int_attr_1d
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
# the chunk length the rewrite writes: the triton target's smallest chunk on a GPU
CHUNK = configs.SELECTIVE_SCAN_GPU.min_chunk

# (op_type, inputs, outputs, attributes): names of SelectiveScan's inputs / outputs or of
# intermediates
CHAIN = (
    (
        "SelectiveScanChunkState",
        ("u", "delta", "A", "B", "delta_bias"),
        ("chunk_ends", "dt_sums"),
        ("delta_softplus", "chunk"),
    ),
    (
        "SelectiveScanPassStates",
        ("chunk_ends", "dt_sums", "A", "initial_state"),
        ("chunk_starts",),
        ("chunk",),
    ),
    (
        "SelectiveScanChunkScan",
        ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "chunk_starts"),
        ("out", "last_state"),
        ("delta_softplus", "has_z", "chunk"),
    ),
)
SCAN_INPUTS = ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state")
SCAN_OUTPUTS = ("out", "last_state")
FLOAT32_VALUES = {"chunk_ends", "dt_sums", "chunk_starts", "last_state"}


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
                doc="A piece of the Mamba-1 scan for TensorRT "
                "(ssmcc.lowering.tensorrt.scan_chain).",
                inputs=params(inputs),
                outputs=params(outputs),
                type_constraints=[
                    ("T", _FLOAT_TYPES, "floating point"),
                    ("F", ["tensor(float)"], "float32"),
                ],
                attributes=[
                    OpSchema.Attribute(
                        a, OpSchema.AttrType.INT, f"see SelectiveScan ({a})", required=True
                    )
                    for a in attributes
                ],
            )
        )
    return made


def register_chain_schemas() -> None:
    register_schemas(_schemas())


# ---- the model-local functions ------------------------------------------------------------


class _Chunks:
    """The sizes of a body's chunking, as 1-element int64 tensors, from u (b, d, l) and B
    (b, g, n, l): b, d, l, n, g, d/g, Q, K and K Q."""

    def __init__(self, body: _Body, u: str, A: str, B: str):
        self.b, self.d, self.l = (_dim(body, u, axis) for axis in range(3))
        self.n, self.g = _dim(body, A, 1), _dim(body, B, 1)
        self.per_group, self.one = body.op("Div", self.d, self.g), body.const([1])
        self.Q = _int_attr_1d(body, "chunk")
        self.K = body.op(
            "Div", body.op("Sub", body.op("Add", self.l, self.Q), self.one), self.Q
        )
        self.padded = body.op("Mul", self.K, self.Q)


def _positions(body: _Body, c: _Chunks, t: str, rank: int, tail) -> str:
    """A (b, ..., l) tensor zero-padded to K Q positions along its last axis and made
    position-major, (Q, b, K, *tail)."""
    pads = concat_dims(body, body.const([0] * (2 * rank - 1)), body.op("Sub", c.padded, c.l))
    padded = body.op("Pad", t, pads)
    split = body.op(
        "Reshape", padded, concat_dims(body, body.op("Shape", t, end=rank - 1), c.K, c.Q)
    )
    perm = [rank, 0, rank - 1, *range(1, rank - 1)]  # (Q, b, K, middle axes)
    return body.op(
        "Reshape",
        body.op("Transpose", split, perm=perm),
        concat_dims(body, c.Q, c.b, c.K, *tail),
    )


def _steps(body: _Body, c: _Chunks, softplus: bool = True):
    """dt (b, d, l) with the bias and softplus, and the step inputs of the position Scan:
    dt and dt u as (Q, b, K, g, 1, d/g), B as (Q, b, K, g, n, 1), A as (g, n, d/g); dt is 0 on
    the padding."""
    u, delta, A, B, bias = floats(body, "u", "delta", "A", "B", "delta_bias")
    body.softplus_if("delta_softplus", body.op("Add", delta, body.op("Unsqueeze", bias,
                                                                     body.const([1]))), "dt")
    by_channel = (c.g, c.one, c.per_group)
    dt = _positions(body, c, "dt", 3, by_channel)
    dtu = _positions(body, c, body.op("Mul", "dt", u), 3, by_channel)
    B6 = _positions(body, c, B, 4, (c.g, c.n, c.one))
    A3 = body.op("Transpose", body.op("Reshape", A, concat_dims(body, c.g, c.per_group, c.n)),
                 perm=[0, 2, 1])
    return u, A3, dt, dtu, B6


def _position_scan(body: _Body, h0: str, A3: str, dt: str, dtu: str, B6: str, C6: str | None):
    """``h_t = Exp(dt_t A) h_{t-1} + dt_t u_t B_t`` down the Q positions of every chunk at once,
    the state (b, K, g, n, d/g) from ``h0``; the last states and, with C, ``y_t = C_t h_t``
    (Q, b, K, g, 1, d/g). A rides along as a loop-carried value (``functions.py`` says why)."""
    nodes = [
        helper.make_node("Identity", ["A_prev"], ["A_next"]),
        helper.make_node("Mul", ["dt_s", "A_prev"], ["rate"]),
        helper.make_node("Exp", ["rate"], ["decay"]),
        helper.make_node("Mul", ["decay", "h_prev"], ["carried"]),
        helper.make_node("Mul", ["dtu_s", "B_s"], ["drive"]),
        helper.make_node("Add", ["carried", "drive"], ["h_next"]),
    ]
    inputs = [("h_prev", 5), ("A_prev", 3), ("dt_s", 5), ("dtu_s", 5), ("B_s", 5)]
    outputs = [("h_next", 5), ("A_next", 3)]
    scanned = [h0, A3, dt, dtu, B6]
    if C6 is not None:
        nodes.append(helper.make_node("MatMul", ["C_s", "h_next"], ["y_s"]))
        inputs.append(("C_s", 5))
        outputs.append(("y_s", 5))
        scanned.append(C6)
    step = helper.make_graph(
        nodes, "selective_scan_chunk_step", [scan_value(v, r) for v, r in inputs],
        [scan_value(v, r) for v, r in outputs],
    )
    return body.op("Scan", *scanned, outputs=len(outputs), body=step,
                   num_scan_inputs=len(scanned) - 2)


def _function(op_type: str, body: _Body) -> onnx.FunctionProto:
    return step_function(CHAIN, op_type, body.nodes, OPSET)


def _by_state(body: _Body, c: _Chunks, h: str, leading) -> str:
    """A (*leading, g, n, d/g) state as (*leading, n, d)."""
    rank = len(leading)
    perm = [*range(rank), rank + 1, rank, rank + 2]
    return body.op("Reshape", body.op("Transpose", h, perm=perm), concat_dims(body, *leading, c.n,
                                                                          c.d))


def chunk_state_function() -> onnx.FunctionProto:
    body = _Body("sc_cs")
    c = _Chunks(body, "u", "A", "B")
    _, A3, dt, dtu, B6 = _steps(body, c)
    zeros = body.op(
        "ConstantOfShape", concat_dims(body, c.b, c.K, c.g, c.n, c.per_group),
        value=helper.make_tensor("zero", TensorProto.FLOAT, [1], [0.0]),
    )
    ends, _ = _position_scan(body, zeros, A3, dt, dtu, B6, None)
    body.nodes.append(helper.make_node(
        "Identity", [_by_state(body, c, ends, (c.b, c.K))], ["chunk_ends"]
    ))
    sums = body.op("ReduceSum", dt, body.const([0]), keepdims=0)  # (b, K, g, 1, d/g)
    body.nodes.append(helper.make_node("Reshape", [sums, concat_dims(body, c.b, c.K, c.d)],
                                       ["dt_sums"]))
    return _function("SelectiveScanChunkState", body)


def pass_states_function() -> onnx.FunctionProto:
    body = _Body("sc_ps")
    A, h0 = floats(body, "A", "initial_state")
    # exp(A dt_sum_k) as (K, b, n, d), the chunks' ends likewise
    rate = body.op("Mul", body.op("Unsqueeze", "dt_sums", body.const([2])),
                   body.op("Transpose", A, perm=[1, 0]))
    decay = body.op("Transpose", body.op("Exp", rate), perm=[1, 0, 2, 3])
    ends = body.op("Transpose", "chunk_ends", perm=[1, 0, 2, 3])
    step = helper.make_graph(
        [
            helper.make_node("Identity", ["h_prev"], ["h_start"]),
            helper.make_node("Mul", ["decay_k", "h_prev"], ["carried"]),
            helper.make_node("Add", ["carried", "S_k"], ["h_next"]),
        ],
        "selective_scan_state_passing_step",
        [scan_value(v, 3) for v in ("h_prev", "S_k", "decay_k")],
        [scan_value(v, 3) for v in ("h_next", "h_start")],
    )
    _, starts = body.op(
        "Scan", body.op("Transpose", h0, perm=[0, 2, 1]), ends, decay, outputs=2, body=step,
        num_scan_inputs=2,
    )
    body.nodes.append(
        helper.make_node("Transpose", [starts], ["chunk_starts"], perm=[1, 0, 2, 3])
    )
    return _function("SelectiveScanPassStates", body)


def chunk_scan_function() -> onnx.FunctionProto:
    body = _Body("sc_sc")
    c = _Chunks(body, "u", "A", "B")
    u, A3, dt, dtu, B6 = _steps(body, c)
    C, D, z = floats(body, "C", "D", "z")
    C6 = _positions(body, c, C, 4, (c.g, c.one, c.n))  # (Q, b, K, g, 1, n)
    starts = body.op("Reshape", "chunk_starts", concat_dims(body, c.b, c.K, c.n, c.g, c.per_group))
    h0 = body.op("Transpose", starts, perm=[0, 1, 3, 2, 4])  # (b, K, g, n, d/g)
    h_last, _, ys = _position_scan(body, h0, A3, dt, dtu, B6, C6)
    # y (Q, b, K, d) -> (b, d, K Q) -> the first l positions
    y = body.op("Transpose", body.op("Reshape", ys, concat_dims(body, c.Q, c.b, c.K, c.d)),
                perm=[1, 3, 2, 0])
    y = body.op("Reshape", y, concat_dims(body, c.b, c.d, c.padded))
    y = body.op("Slice", y, body.const([0]), c.l, body.const([2]))
    y = body.op("Add", y, body.op("Mul", body.op("Unsqueeze", D, body.const([1])), u))
    body.gate_if("has_z", y, z, "y_gated")
    body.nodes.append(helper.make_node("CastLike", ["y_gated", "u"], ["out"]))
    # the last chunk's end (b, 1, g, n, d/g) -> (b, d, n)
    last = body.op("Slice", h_last, body.const([-1]), body.const([INT64_MAX]), body.const([1]))
    last = body.op("Transpose", last, perm=[0, 1, 2, 4, 3])
    body.nodes.append(helper.make_node("Reshape", [last, concat_dims(body, c.b, c.d, c.n)],
                                       ["last_state"]))
    return _function("SelectiveScanChunkScan", body)


FUNCTIONS = {
    "SelectiveScanChunkState": chunk_state_function,
    "SelectiveScanPassStates": pass_states_function,
    "SelectiveScanChunkScan": chunk_scan_function,
}


# ---- the rewrite --------------------------------------------------------------------------


def _intermediates(node: onnx.NodeProto, dims: dict, chunk: int) -> dict[str, tuple]:
    """The dims of the chain's float32 intermediates, dims from u's and A's (the count of
    chunks K named ``cdiv(<l>,<Q>)`` when l is not a number)."""
    try:
        b, d, length = dims[node.input[0]]
        n = dims[node.input[2]][1]
    except (KeyError, ValueError, IndexError) as error:
        raise LoweringError(
            f"target 'tensorrt': SelectiveScan node {node.name!r}: the shapes of u and A are "
            f"not known ({error}); the chain's intermediates need them"
        ) from error
    K = -(-length // chunk) if isinstance(length, int) else f"cdiv({length},{chunk})"
    shapes = {"chunk_ends": (b, K, n, d), "dt_sums": (b, K, d), "chunk_starts": (b, K, n, d)}
    return shapes


CHAIN_REWRITE = NodeChain(
    op_type="SelectiveScan",
    inputs=SCAN_INPUTS,
    outputs=SCAN_OUTPUTS,
    steps=CHAIN,
    functions=FUNCTIONS,
    intermediates=_intermediates,
    register_schemas=register_chain_schemas,
    absent={"delta_softplus": 0, "has_z": 0},
)


def split_selective_scans(model: onnx.ModelProto, chunk: int = CHUNK) -> int:
    """Replace every ``SelectiveScan`` node of ``model``'s graph by its chain (in place) and add the
    chain's functions; returns how many were replaced."""
    return replace_nodes(model, CHAIN_REWRITE, chunk)
