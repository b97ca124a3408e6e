"""One ssmcc ONNX node rewritten as a chain of ssmcc nodes, one plugin (one kernel) each: what
the TensorRT target's chunked scans share (``scan_chain.py``: ``SelectiveScan``, ``ssd_chain.py``:
``SsdScan``). A ``NodeChain`` is data: the node it replaces (its input and output names in node
order) and its steps ``(op_type, inputs, outputs, attributes)``, each name one of the node's
inputs / outputs or an intermediate, which becomes a float32 graph value named
``<node name>/<intermediate>`` with the dims ``intermediates(node, dims, chunk)`` gives.
Attributes are the node's own, and ``chunk`` (the chain's chunk length Q, a constant of every
plugin's specialisation). ``replace_nodes`` rewrites a graph and adds the steps' model-local
functions, dropping the replaced node's function once nothing calls it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import onnx
from onnx import TensorProto, helper

from ssmcc.lowering.onnx.schemas import DOMAIN

Step = tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]


@dataclasses.dataclass(frozen=True)
class NodeChain:
    op_type: str  # the node the chain replaces
    inputs: tuple[str, ...]  # its inputs' names, in the node's order
    outputs: tuple[str, ...]
    steps: tuple[Step, ...]
    functions: Mapping[str, Callable[[], onnx.FunctionProto]]  # step op_type -> its body
    # (node, known dims, chunk) -> {intermediate: dims (ints or dim names)}; raises LoweringError
    intermediates: Callable[[onnx.NodeProto, dict, int], dict[str, tuple]]
    register_schemas: Callable[[], None]
    absent: Mapping[str, object] = dataclasses.field(default_factory=dict)  # attribute defaults


def register_schemas(schemas) -> None:
    """Register the chain's node schemas with ONNX (once: a registered name is left alone)."""
    for schema in schemas:
        if not onnx.defs.has(schema.name, schema.domain):
            onnx.defs.register_schema(schema)


def floats(body, *names: str) -> list[str]:
    """``names`` cast to float32 in a function ``body`` (``lowering/onnx/functions._Body``)."""
    return [body.op("Cast", n, to=TensorProto.FLOAT) for n in names]


def concat_dims(body, *dims: str) -> str:
    """A shape from 1-element int64 dims in a function ``body``."""
    return body.op("Concat", *dims, axis=0)


def step_function(steps: tuple[Step, ...], op_type: str, nodes, opset: int) -> onnx.FunctionProto:
    """The model-local function of step ``op_type``: its inputs, outputs and attributes as the
    chain declares them, ``nodes`` its body."""
    _, inputs, outputs, attributes = next(s for s in steps if s[0] == op_type)
    return helper.make_function(
        DOMAIN, op_type, list(inputs), list(outputs), nodes,
        [helper.make_opsetid("", opset)], attributes=list(attributes),
    )


def known_dims(model: onnx.ModelProto) -> dict[str, list]:
    """Dims (int or name) of every graph value the model declares, shape inference's where not."""
    found = {}
    for graph in (model.graph, onnx.shape_inference.infer_shapes(model).graph):
        for value in (*graph.input, *graph.value_info, *graph.output):
            dims = value.type.tensor_type.shape.dim
            found.setdefault(
                value.name, [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims]
            )
    return found


def chain_nodes(chain: NodeChain, node: onnx.NodeProto, chunk: int) -> list[onnx.NodeProto]:
    """The chain's nodes computing what ``node`` does, in order."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    values = dict(zip(chain.inputs, node.input, strict=True))
    values.update(zip(chain.outputs, node.output, strict=True))
    stem = node.name or node.output[0]
    made = []
    for op_type, inputs, outputs, attributes in chain.steps:
        names = {v: values.get(v, f"{stem}/{v}") for v in (*inputs, *outputs)}
        kwargs = {
            a: chunk if a == "chunk" else (given[a] if a in given else chain.absent[a])
            for a in attributes
        }
        made.append(
            helper.make_node(
                op_type, [names[v] for v in inputs], [names[v] for v in outputs],
                name=f"{stem}/{op_type}", domain=DOMAIN, **kwargs,
            )
        )
    return made


def intermediate_values(chain: NodeChain, node: onnx.NodeProto, dims: dict, chunk: int) -> list:
    """Value infos of the chain's float32 intermediates for ``node``."""
    stem = node.name or node.output[0]
    return [
        helper.make_tensor_value_info(f"{stem}/{name}", TensorProto.FLOAT, list(shape))
        for name, shape in chain.intermediates(node, dims, chunk).items()
    ]


def replace_nodes(model: onnx.ModelProto, chain: NodeChain, chunk: int) -> int:
    """Replace every ``chain.op_type`` node of ``model``'s graph by the chain (in place) and add
    the steps' functions; returns how many were replaced."""
    chain.register_schemas()

    def replaced_kind(n: onnx.NodeProto) -> bool:
        return n.domain == DOMAIN and n.op_type == chain.op_type

    if not any(replaced_kind(n) for n in model.graph.node):
        return 0
    dims = known_dims(model)
    nodes, replaced = [], 0
    for node in model.graph.node:
        if replaced_kind(node):
            nodes.extend(chain_nodes(chain, node, chunk))
            model.graph.value_info.extend(intermediate_values(chain, node, dims, chunk))
            replaced += 1
        else:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    have = {f.name for f in model.functions if f.domain == DOMAIN}
    model.functions.extend(make() for name, make in chain.functions.items() if name not in have)
    if not any(replaced_kind(n) for f in model.functions for n in f.node):
        kept = [f for f in model.functions if not (f.domain == DOMAIN and f.name == chain.op_type)]
        del model.functions[:]
        model.functions.extend(kept)
    return replaced
