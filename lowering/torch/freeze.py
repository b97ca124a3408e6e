"""Freezing a lowered module's weights: fold weight-only expressions, flatten weight access.

Compilation treats the weights as constants, so any subexpression that reads only weights
(``-exp(A_log)``, a squeezed conv kernel, a transposed tied embedding) has the same value on
every call. ``fold_weight_expressions`` evaluates each such expression once, at lowering, and
binds its value as a module attribute, so the per-call graph holds only the work that depends on
the inputs. This matters most for the one-token step program, where these small ops cost as much
as the arithmetic around them.

A folded value that is a view of a weight costs no memory. One that is new memory is folded only
up to ``MAX_NEW_BYTES`` (a whole transposed copy of a large weight is not worth holding twice);
larger ones stay in the graph. A small view of a large temporary is copied, so the temporary is
not held.

``flatten_weight_attributes`` rebinds every ``get_attr`` to one flat attribute of the root
module, so reading a weight is one attribute lookup instead of a walk down the module tree.
"""

from __future__ import annotations

import torch
from torch import fx

MAX_NEW_BYTES = 4 << 20


def _fetch(module: torch.nn.Module, target: str):
    for name in target.split("."):
        module = getattr(module, name)
    return module


def _is_view_of_weight(value: torch.Tensor, weights: list[torch.Tensor]) -> bool:
    storage = value.untyped_storage().data_ptr()
    return any(w.untyped_storage().data_ptr() == storage for w in weights)


def fold_weight_expressions(module: fx.GraphModule) -> int:
    """Replace weight-only subexpressions that feed input-dependent nodes by their values.

    Returns the number of folded nodes. Side-effect-free ATen ops only; ssmcc ops, getitem of
    multi-output nodes and anything impure stay in the graph.
    """
    graph = module.graph
    values: dict[fx.Node, object] = {}
    weights = []
    with torch.no_grad():
        for node in graph.nodes:
            if node.op == "get_attr":
                values[node] = _fetch(module, node.target)
                if isinstance(values[node], torch.Tensor):
                    weights.append(values[node])
            elif (
                node.op == "call_function"
                and isinstance(node.target, torch._ops.OpOverload)
                and node.target.namespace == "aten"
                and not node.is_impure()
                and node.all_input_nodes
                and all(arg in values for arg in node.all_input_nodes)
            ):
                args = fx.node.map_arg(node.args, values.__getitem__)
                kwargs = fx.node.map_arg(node.kwargs, values.__getitem__)
                values[node] = node.target(*args, **kwargs)
    folded = 0
    for node in list(graph.nodes):
        value = values.get(node)
        if node.op != "call_function" or not isinstance(value, torch.Tensor):
            continue
        if all(user in values for user in node.users):
            continue  # only weight-only nodes use it; they are folded or dead
        if not _is_view_of_weight(value, weights):
            if value.nbytes > MAX_NEW_BYTES:
                continue
            if value.untyped_storage().nbytes() > value.nbytes:
                value = value.clone()  # a small view of a large temporary: keep only the view
        name = f"_folded_{folded}"
        module.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            constant = graph.get_attr(name)
        constant.meta = dict(node.meta)
        node.replace_all_uses_with(constant)
        folded += 1
    graph.eliminate_dead_code()
    module.recompile()
    return folded


def flatten_weight_attributes(module: fx.GraphModule) -> None:
    """Bind every tensor a ``get_attr`` reads as one flat attribute of ``module``."""
    flat: dict[int, str] = {}
    for node in module.graph.nodes:
        if node.op != "get_attr" or "." not in node.target:
            continue
        value = _fetch(module, node.target)
        if not isinstance(value, torch.Tensor):
            continue
        name = flat.get(id(value))
        if name is None:
            name = flat[id(value)] = f"_weight_{len(flat)}"
            if isinstance(value, torch.nn.Parameter):
                module.register_parameter(name, value)
            else:
                module.register_buffer(name, value, persistent=False)
        node.target = name
    module.recompile()
