"""Float32 linear layers that read their weights where ``weights.bin`` stores them.

ONNX Runtime gives every session its own copy of each weight it transforms at session creation:
it constant-folds a ``Transpose`` of an initializer, and ``MatMul`` pre-packs a constant B into
MLAS's panel layout. The prefill, chunk and step graphs of one model would each hold the weights
once more (mamba-130m, 490 MB of weights: 1.2 GB resident for a generation). This rewrite leaves
ONNX Runtime nothing to transform. A product of x with a float32 weight::

    MatMul(x, Transpose(W))    W a 2-D initializer (n, k), as PyTorch stores it (export keeps
                               weights' transposes: ``export._fold_rules``), or
                               W widened per call from small weights (``quantized``):
                               ssmcc.Widen(weight, scale) of 16-bit ones, DequantizeLinear of
                               int8 ones (per group between two Reshapes)
    MatMul(x, B)               B a 2-D initializer (k, n) (a transpose folded by an exporter)

becomes, on W (n, k) (B is stored transposed back to W)::

    x with few rows (a decode step, a last-token head)   ssmcc.Linear(x, W)          y = x W^T
    any other x (prefill, chunk)                          FusedMatMul(x, W, transB=1)

``ssmcc.Linear`` is the ssmcc library's matrix-vector kernel (``gemv.h``: each weight read once
per call). ``com.microsoft.FusedMatMul`` is MLAS's GEMM packing W per call, which costs nothing
measurable at 2,048 rows (mamba-130m chunk: 1.41-1.75 s with or without pre-packing on AMD EPYC
Zen 5, 2 threads) and up to 1.5x for 16 rows. The sessions then run with pre-packing off and with
the initializers handed in from one memory map of ``weights.bin`` (``runtime.SharedWeights``), so
a loaded model holds its weights once, whatever the number of graphs.

Only the ``onnx_functions="keep"`` artifact gets it (ONNX Runtime: the ``com.microsoft`` ops ship
in the stock wheel, and ``Linear``'s portable body runs where ssmcc's library is absent); the
inline artifact, for other runtimes, keeps ``MatMul``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
from onnx.defs import OpSchema

from ssmcc.kernels.cpu.linear_binding import GEMV_MAX_ROWS
from ssmcc.lowering.onnx.graph_edits import (
    names_read,
    remove_dead_nodes,
    remove_unused_initializers,
)
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

MS_DOMAIN = "com.microsoft"

SCHEMA = OpSchema(
    "Linear",
    DOMAIN,
    VERSION,
    doc="Linear layer y = x W^T reading the float32 weight (n, k) as stored (no bias).",
    inputs=[
        OpSchema.FormalParameter("x", "tensor(float)", "(..., k)"),
        OpSchema.FormalParameter("weight", "tensor(float)", "(n, k)"),
    ],
    outputs=[OpSchema.FormalParameter("y", "tensor(float)", "(..., n) = x W^T")],
)


def linear_function(opset: int) -> onnx.FunctionProto:
    """``Linear``'s portable body: ``MatMul(x, Transpose(weight))``."""
    return helper.make_function(
        DOMAIN,
        "Linear",
        ["x", "weight"],
        ["y"],
        [
            helper.make_node("Transpose", ["weight"], ["weight_t"], perm=[1, 0]),
            helper.make_node("MatMul", ["x", "weight_t"], ["y"]),
        ],
        [helper.make_opsetid("", opset)],
    )


def _shapes(graph: onnx.GraphProto) -> dict[str, list]:
    """Each value's dims as the graph records them: an int, a symbol's name, or None."""
    shapes = {}
    for value in [*graph.input, *graph.value_info, *graph.output]:
        dims = value.type.tensor_type.shape.dim
        shapes[value.name] = [
            d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims
        ]
    return shapes


def _few_rows(dims: list | None) -> bool:
    """x's rows are known to be few: x is (batch, ..., k) with every axis between the first and
    the last static, their product at most ``GEMV_MAX_ROWS`` (one token per sequence), or x is
    (m, k) with m the graph's ``batch`` or a static size at most that (any other 2-D x may hold
    any number of tokens: the experts of a MoE layer)."""
    if dims is None or len(dims) < 2:
        return False
    if len(dims) == 2:
        return dims[0] == "batch" or (isinstance(dims[0], int) and dims[0] <= GEMV_MAX_ROWS)
    rows = dims[1:-1]
    if not all(isinstance(d, int) for d in rows):
        return False
    return int(np.prod(rows, dtype=np.int64)) <= GEMV_MAX_ROWS


class _Weights:
    """The graph's 2-D float32 initializers and who reads them."""

    def __init__(self, graph: onnx.GraphProto):
        self.initializers = {
            t.name: t
            for t in graph.initializer
            if t.data_type == TensorProto.FLOAT and len(t.dims) == 2
        }
        self.stored = {t.name for t in graph.initializer}
        self.producer = {out: node for node in graph.node for out in node.output}
        self.readers: dict[str, list] = {}
        for node in graph.node:
            for name in names_read(node):
                self.readers.setdefault(name, []).append(node)
        for value in graph.output:
            self.readers.setdefault(value.name, []).append(None)

    def is_transpose(self, node) -> bool:
        if node is None or node.op_type != "Transpose" or node.domain:
            return False
        perm = [list(a.ints) for a in node.attribute if a.name == "perm"]
        return perm in ([[1, 0]], [])

    def _read_directly(self, name: str) -> bool:
        """Every reader of ``name`` is a node of this graph taking it as an input (not a graph
        output, not a subgraph's node), so it can be renamed."""
        return all(r is not None and name in r.input for r in self.readers.get(name, []))

    def stored_form(self, matmul: onnx.NodeProto) -> tuple[str, bool] | None:
        """(initializer name, stored as (k, n)) of a product ``x B`` whose B is read in place,
        else None. A (k, n) initializer qualifies when every reader is a product taking it as B
        or a ``Transpose`` (after the rewrite that Transpose is the stored weight itself: the
        token embedding of a tied LM head, kept by ``_share_transposed_weights``)."""
        b = matmul.input[1]
        if b in self.initializers:
            readers = self.readers[b]
            fits = all(
                r is not None
                and (
                    (r.op_type == "MatMul" and not r.domain and list(r.input).index(b) == 1)
                    or (self.is_transpose(r) and self._read_directly(r.output[0]))
                )
                for r in readers
            )
            return (b, True) if fits else None
        transpose = self.producer.get(b)
        if not self.is_transpose(transpose):
            return None
        source = transpose.input[0]
        if source in self.initializers:
            return source, False
        # a widened weight's rank is not known here: only an explicit 2-D transpose qualifies
        explicit = [list(a.ints) for a in transpose.attribute if a.name == "perm"] == [[1, 0]]
        return (source, False) if explicit and self.widened(source) else None

    def widened(self, name: str, depth: int = 4) -> bool:
        """``name`` is a float32 weight made per call from stored weights only: ``ssmcc.Widen``
        of 16-bit weights, or ``DequantizeLinear`` of int8 ones (per group: between two
        ``Reshape``s) -- ``quantized.py``'s many-row forms."""
        node = self.producer.get(name)
        if depth == 0 or node is None or (node.op_type, node.domain) not in _WIDENING:
            return False
        return all(
            i in self.stored or self._constant(i) or self.widened(i, depth - 1)
            for i in node.input
            if i
        )

    def _constant(self, name: str) -> bool:
        node = self.producer.get(name)
        return node is not None and node.op_type == "Constant" and not node.domain


# the ops of a weight widened per call (``Weights.widened``)
_WIDENING = {("Widen", DOMAIN), ("DequantizeLinear", ""), ("Reshape", "")}


def read_weights_in_place(model: onnx.ModelProto, base_dir: str = "") -> int:
    """Rewrite, in place, every float32 product ``x B`` with a constant 2-D B into ``Linear`` or
    ``FusedMatMul`` on the weight as PyTorch lays it out (module docstring); returns how many.
    Transposes and initializers left without readers are removed. A B stored (k, n) (folded by
    an exporter) is stored again transposed, in the graph (external data is read relative to
    ``base_dir``)."""
    graph = model.graph
    weights = _Weights(graph)
    shapes = _shapes(graph)
    stored_transposed: set[str] = set()
    nodes, count = [], 0
    for node in graph.node:
        form = weights.stored_form(node) if node.op_type == "MatMul" and not node.domain else None
        if form is None:
            nodes.append(node)
            continue
        name, transposed = form
        if transposed:
            stored_transposed.add(name)
        x = node.input[0]
        if _few_rows(shapes.get(x)):
            nodes.append(helper.make_node("Linear", [x, name], list(node.output), domain=DOMAIN))
        else:
            nodes.append(
                helper.make_node(
                    "FusedMatMul", [x, name], list(node.output), domain=MS_DOMAIN, transB=1
                )
            )
        count += 1
    if not count:
        return 0
    for name in stored_transposed:  # (k, n) -> (n, k): the weight as the model stores it
        tensor = weights.initializers[name]
        array = np.ascontiguousarray(numpy_helper.to_array(tensor, base_dir).T)
        tensor.CopyFrom(numpy_helper.from_array(array, name))
    stale = [v for v in graph.value_info if v.name in stored_transposed]  # its old (k, n)
    for value in stale:
        graph.value_info.remove(value)
    # a Transpose of a weight now stored transposed back is that weight
    renamed = {
        node.output[0]: node.input[0]
        for node in nodes
        if weights.is_transpose(node) and node.input[0] in stored_transposed
    }
    for node in nodes:
        for i, name in enumerate(node.input):
            if name in renamed:
                node.input[i] = renamed[name]
    del graph.node[:]
    graph.node.extend(nodes)
    remove_dead_nodes(graph)
    remove_unused_initializers(graph)
    if any(n.op_type == "Linear" and n.domain == DOMAIN for n in graph.node):
        if not any(f.name == "Linear" and f.domain == DOMAIN for f in model.functions):
            model.functions.append(linear_function(_opset(model)))
        if not any(o.domain == DOMAIN for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid(DOMAIN, VERSION))
    if not any(o.domain == MS_DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(MS_DOMAIN, 1))
    return count


def _opset(model: onnx.ModelProto) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
