"""The chunk graph derived from the prefill graph, instead of exported again.

``chunk_state_passing`` turns the stateful prefill program into the chunk program by running the
language-model head on the last position only: ``logits = head(h[:, -1:])[:, -1]``. On the ONNX
graph of the prefill program the same edit is two nodes, so the ONNX target derives
``chunk.onnx`` from ``prefill.onnx`` rather than exporting the chunk program to ONNX (a third
export of the whole model):

    h (b, l, d) -> [head] -> position-wise ops -> logits (b, l, v)

becomes

    h (b, l, d) -> Slice(h, -1:, axis 1) (b, 1, d) -> [head] -> position-wise ops
                -> Gather(-1, axis 1) -> logits (b, v)

where the head is a ``MatMul`` on a float32 weight as stored (or an ``ssmcc`` product node)
reading ``h`` as its first input, and a position-wise op is an elementwise op whose other inputs
are constants of rank 0 or 1 (which broadcast along the last axis alike for ``l`` positions and
for one). Every other node and every state output is the prefill graph's, and the head's input is
recorded as one row per sequence (so ``read_weights_in_place`` makes it the matrix-vector
``Linear``, as in the exported chunk graph): the same graph as the chunk program's export.
Where the logits are not reached that way, nothing is derived (``None``) and the ONNX target
exports the chunk program as before.
"""

from __future__ import annotations

import onnx
from onnx import helper

from ssmcc.lowering.onnx.graph_edits import names_read
from ssmcc.lowering.onnx.schemas import DOMAIN

LOGITS = "logits"
_POSITIONWISE = {"Cast", "Mul", "Div", "Add", "Sub", "Tanh", "Identity"}
_HEADS = {("", "MatMul"), (DOMAIN, "Linear"), (DOMAIN, "QuantizedLinear"), (DOMAIN, "HalfLinear")}


def _rank(value: onnx.ValueInfoProto) -> int:
    return len(value.type.tensor_type.shape.dim)


def _only_on_the_path(graph: onnx.GraphProto, path: list[onnx.NodeProto]) -> bool:
    """Each value from the head to the logits is read by the next node of the path alone (and is
    no graph output), and nothing reads the logits: moving the head changes nothing else."""
    outputs = {value.name for value in graph.output}
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in names_read(node):  # subgraphs' reads of outer values included
            readers[name] = readers.get(name, 0) + 1
    inner = [name for node in path[:-1] for name in node.output]
    if any(readers.get(name, 0) != 1 or name in outputs for name in inner):
        return False
    return readers.get(LOGITS, 0) == 0 and all(len(node.output) == 1 for node in path)


def _constant_ranks(graph: onnx.GraphProto) -> dict[str, int]:
    """The rank of every initializer and ``Constant`` node output, by value name."""
    ranks = {tensor.name: len(tensor.dims) for tensor in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.domain == "":
            value = next((a for a in node.attribute if a.name == "value"), None)
            ranks[node.output[0]] = len(value.t.dims) if value is not None else 0
    return ranks


def _reads_a_float_weight(head: onnx.NodeProto, producers: dict, constants: dict) -> bool:
    """A ``MatMul`` head reads its weight as stored: an initializer or its ``Transpose``. One
    that widens stored-small weights first is left to the chunk program's export, whose head on
    one row is the product node that reads them small (``QuantizedLinear``, ``HalfLinear``)."""
    if head.domain:
        return True
    weight = head.input[1]
    source = producers.get(weight)
    if source is not None and source.op_type == "Transpose" and not source.domain:
        weight = source.input[0]
    return weight in constants and weight not in producers


def _head_path(graph: onnx.GraphProto) -> list[onnx.NodeProto] | None:
    """The nodes from the head to the logits output (head first), or None."""
    producers = {name: node for node in graph.node for name in node.output}
    constants = _constant_ranks(graph)
    path, value = [], LOGITS
    while value in producers:
        node = producers[value]
        path.append(node)
        if (node.domain, node.op_type) in _HEADS:
            return path[::-1] if _reads_a_float_weight(node, producers, constants) else None
        if node.domain != "" or node.op_type not in _POSITIONWISE:
            return None
        others = [name for name in node.input[1:] if name]
        if any(constants.get(name, 2) > 1 for name in others):
            return None
        value = node.input[0]
    return None


def chunk_from_prefill(prefill: onnx.ModelProto) -> onnx.ModelProto | None:
    """The chunk graph of a prefill graph (see the module docstring), or None where its logits
    are not a head on the hidden states through position-wise ops. ``prefill`` is not changed."""
    graph = prefill.graph
    if not graph.output or graph.output[0].name != LOGITS:
        return None
    if _rank(graph.output[0]) != 3:
        return None
    path = _head_path(graph)
    if path is None or not _only_on_the_path(graph, path):
        return None
    hidden_infos = [v for v in graph.value_info if v.name == path[0].input[0]]
    if not hidden_infos or _rank(hidden_infos[0]) != 3:
        return None  # the hidden states are not (b, l, d): slicing axis 1 would cut elsewhere
    hidden = path[0].input[0]
    names = {
        "starts": "chunk.last_position.starts",
        "ends": "chunk.last_position.ends",
        "axes": "chunk.last_position.axes",
        "index": "chunk.last_position.index",
        "sliced": f"{hidden}.last_position",
        "logits": "chunk.last_position.logits",
    }
    taken = {name for node in graph.node for name in [*names_read(node), *node.output]}
    taken |= {tensor.name for tensor in graph.initializer}
    if taken & set(names.values()):
        return None
    chunk = onnx.ModelProto()
    chunk.CopyFrom(prefill)
    graph = chunk.graph
    head = next(n for n in graph.node if list(n.output) == list(path[0].output))
    last = next(n for n in graph.node if LOGITS in n.output)
    graph.initializer.extend(
        [
            helper.make_tensor(names["starts"], onnx.TensorProto.INT64, [1], [-1]),
            helper.make_tensor(names["ends"], onnx.TensorProto.INT64, [1], [2**63 - 1]),
            helper.make_tensor(names["axes"], onnx.TensorProto.INT64, [1], [1]),
            helper.make_tensor(names["index"], onnx.TensorProto.INT64, [], [-1]),
        ]
    )
    position = list(graph.node).index(head)
    graph.node.insert(
        position,
        helper.make_node(
            "Slice",
            [hidden, names["starts"], names["ends"], names["axes"]],
            [names["sliced"]],
            name="chunk.last_position.slice",
        ),
    )
    head.input[0] = names["sliced"]
    last.output[list(last.output).index(LOGITS)] = names["logits"]
    graph.node.append(
        helper.make_node(
            "Gather", [names["logits"], names["index"]], [LOGITS], axis=1, name="chunk.logits"
        )
    )
    # the values from the head to the logits now hold one position: their recorded shapes go
    changed = {name for node in path for name in node.output} | {names["logits"]}
    kept = [v for v in graph.value_info if v.name not in changed]
    del graph.value_info[:]
    graph.value_info.extend(kept)
    # the head's input is one row per sequence: ``read_weights_in_place`` reads that as a
    # product to run as matrix-vector (as in the chunk program's export)
    sliced = graph.value_info.add()
    sliced.CopyFrom(hidden_infos[0])
    sliced.name = names["sliced"]
    position_dim = sliced.type.tensor_type.shape.dim[1]
    position_dim.Clear()
    position_dim.dim_value = 1
    logits = graph.output[0].type.tensor_type.shape
    del logits.dim[1]
    return chunk
