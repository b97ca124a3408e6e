"""Helpers to copy and rebuild an ``ExportedProgram`` around an edited graph.

Passes edit a copy of the program's ``GraphModule``; weights (state_dict, constants) are shared,
never copied. After an edit the graph signature is re-synchronised with the graph: the output specs
take the names of the output node's arguments, and placeholders that no longer exist are dropped
from the input specs (and their weights from the state dict of the new program).
"""

from __future__ import annotations

import contextlib
import copy
import warnings

from torch.export import ExportedProgram
from torch.export.graph_signature import ExportGraphSignature, TensorArgument
from torch.fx import GraphModule, Node

from ssmcc.passes.call_args import list_arg


@contextlib.contextmanager
def _quiet_pytree_deprecation():
    """Deep-copying export metadata trips a FutureWarning inside torch's own pytree code."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        yield


def clone_program(program: ExportedProgram) -> ExportedProgram:
    """A program with a copied graph module and shared weights."""
    with _quiet_pytree_deprecation():
        graph_module = copy.deepcopy(program.graph_module)
        signature = copy.deepcopy(program.graph_signature)
    # Copying a graph may rename a placeholder whose name shadows a builtin (input -> input_1).
    placeholders = [n for n in graph_module.graph.nodes if n.op == "placeholder"]
    for spec, node in zip(signature.input_specs, placeholders, strict=True):
        if hasattr(spec.arg, "name"):
            spec.arg.name = node.name
    with _quiet_pytree_deprecation():
        return program._update(graph_module, signature)


def output_nodes(graph_module: GraphModule) -> list:
    return list_arg(graph_module.graph.output_node(), 0)


def rebuild_program(program: ExportedProgram, graph_module: GraphModule) -> ExportedProgram:
    """A new program around ``graph_module`` with its signature re-synchronised to the graph."""
    graph_module.recompile()
    placeholders = {n.name for n in graph_module.graph.nodes if n.op == "placeholder"}
    signature = program.graph_signature
    input_specs = [
        spec for spec in signature.input_specs if getattr(spec.arg, "name", None) in placeholders
    ]
    outputs = output_nodes(graph_module)
    output_specs = []
    for spec, value in zip(signature.output_specs, outputs, strict=True):
        spec = copy.copy(spec)
        if isinstance(value, Node):
            spec.arg = TensorArgument(name=value.name)
        output_specs.append(spec)
    kept_targets = {spec.target for spec in input_specs}
    state_dict = {k: v for k, v in program.state_dict.items() if k in kept_targets}
    all_targets = {spec.target for spec in signature.input_specs}
    constants = {
        k: v for k, v in program.constants.items() if k in kept_targets or k not in all_targets
    }
    new_signature = ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)
    with _quiet_pytree_deprecation():
        return program._update(
            graph_module, new_signature, state_dict=state_dict, constants=constants
        )
