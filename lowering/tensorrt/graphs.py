"""The TensorRT target's ONNX graphs: the ONNX lowering's ``portable`` form (one ``ssmcc`` node
per ssmcc op, its standard-op body as a model-local function, nothing specific to ONNX Runtime)
with every ssmcc node bound to its plugin.

TensorRT's ONNX parser takes a node it has no importer for to the plugin registry: plugin name =
the node's ``op_type``, namespace = its ``plugin_namespace`` attribute, version = its
``plugin_version`` attribute (default "1"). Where a model-local function of the node's name
exists the parser expands the function instead, unless ``plugin_namespace`` is set — so the
bound graphs keep their bodies: ONNX Runtime (and any runtime that expands functions) still runs
them, TensorRT runs the plugins."""

from __future__ import annotations

import onnx
from onnx import helper

from ssmcc.errors import LoweringError
from ssmcc.lowering.tensorrt.scan_chain import split_selective_scans
from ssmcc.lowering.tensorrt.specs import NAMESPACE, ONNX_DOMAIN, PLUGIN_VERSION, SPECS
from ssmcc.lowering.tensorrt.ssd_chain import split_ssd_scans


def plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == ONNX_DOMAIN]


def bind_plugins(graph: str, model: onnx.ModelProto) -> None:
    """Replace each ``SelectiveScan`` and ``SsdScan`` node by its chain of plugin nodes
    (``scan_chain.py``, ``ssd_chain.py``), then give every ssmcc node of ``model`` the attributes
    that bind it to its plugin, or ``LoweringError`` naming the first node no plugin exists for."""
    split_selective_scans(model)
    split_ssd_scans(model)
    for node in plugin_nodes(model):
        if node.op_type not in SPECS:
            raise LoweringError(
                f"target 'tensorrt': node {node.name!r} of the {graph} graph is an "
                f"ssmcc.{node.op_type}, which has no TensorRT plugin yet (plugins: "
                f"{', '.join(sorted(SPECS))}); compile with target='onnx' or 'triton'"
            )
        node.attribute.extend(
            [
                helper.make_attribute("plugin_namespace", NAMESPACE),
                helper.make_attribute("plugin_version", PLUGIN_VERSION),
            ]
        )


def node_attributes(node: onnx.NodeProto) -> dict:
    """The node's attributes the plugin's kernel is specialised on, as their spec types."""
    spec = SPECS[node.op_type]
    found = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    return {name: kind(found.get(name, 0)) for name, kind in spec.attributes}
