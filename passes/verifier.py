"""The IR verifier: what every program must satisfy between passes.

1. ``graph.lint()`` passes (topological order, well-formed nodes).
2. Every ``call_function`` target is an ATen / prims / ssmcc ``OpOverload``, a higher-order op,
   ``operator.getitem``, or arithmetic on symbolic sizes (``operator.mul/add/floordiv/...`` and
   ``torch.sym_*``, as ``torch.export`` emits with dynamic dims) whose operands and result are
   all scalars (SymInt/SymFloat/SymBool or Python numbers), never tensors.
3. Every node with users carries ``meta["val"]`` (shapes and dtypes for printing and lowering).
4. The graph signature matches the graph: one input spec per placeholder, in order, and output
   specs naming the output node's arguments.
5. Every ssmcc node's recorded output shapes and dtypes equal what the op's fake implementation
   computes from its inputs' metadata.
"""

from __future__ import annotations

import math
import operator

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ssmcc.errors import PassError
from ssmcc.ops import is_ssmcc_op
from ssmcc.passes.rules import fake_mode_of

ALLOWED_NAMESPACES = {"aten", "prims", "ssmcc"}
SYMBOLIC_ARITHMETIC = {
    operator.add, operator.sub, operator.mul, operator.truediv, operator.floordiv,
    operator.mod, operator.pow, operator.neg, operator.pos, operator.abs, operator.eq,
    operator.ne, operator.lt, operator.le, operator.gt, operator.ge, operator.and_,
    operator.or_, operator.not_, math.ceil, math.floor, math.trunc, torch.sym_float,
    torch.sym_int, torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_ite, torch.sym_sqrt,
}  # fmt: skip
_SCALARS = (torch.SymInt, torch.SymFloat, torch.SymBool, int, float, bool)


def _allowed_target(target) -> bool:
    if target is operator.getitem or isinstance(target, torch._ops.HigherOrderOperator):
        return True
    if target in SYMBOLIC_ARITHMETIC:
        return True
    return isinstance(target, torch._ops.OpOverload) and target.namespace in ALLOWED_NAMESPACES


def _check_symbolic_arithmetic(node: Node) -> str | None:
    """Arithmetic on sizes must stay scalar: operands and result SymInt/SymFloat/SymBool or
    Python numbers."""
    for arg in [*node.args, *node.kwargs.values()]:
        value = arg.meta.get("val") if isinstance(arg, Node) else arg
        if not isinstance(value, _SCALARS):
            return (
                f"{node.name}: {getattr(node.target, '__name__', node.target)} takes "
                f"{_describe(value)}; symbolic-size arithmetic takes scalars only"
            )
    if not isinstance(node.meta.get("val"), _SCALARS):
        return f"{node.name}: symbolic-size arithmetic gives {_describe(node.meta.get('val'))}"
    return None


def _meta_of(arg):
    if isinstance(arg, Node):
        return arg.meta.get("val")
    if isinstance(arg, (list, tuple)):
        return type(arg)(_meta_of(a) for a in arg)
    return arg


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"{value.dtype}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_describe(v) for v in value) + ")"
    return repr(value)


def _check_ssmcc_node(node: Node, fake_mode) -> str | None:
    args = [_meta_of(a) for a in node.args]
    kwargs = {k: _meta_of(v) for k, v in node.kwargs.items()}
    target = node.target
    if not callable(target):  # a call's target is an op (fx types it as possibly a name)
        return f"{node.name}: target {target!r} is not callable"
    with fake_mode:
        recomputed = target(*args, **kwargs)
    if _describe(recomputed) != _describe(node.meta.get("val")):
        return (
            f"{node.name}: recorded {_describe(node.meta.get('val'))}, "
            f"fake implementation gives {_describe(recomputed)}"
        )
    return None


def verification_errors(program: ExportedProgram) -> list[str]:
    graph = program.graph
    errors: list[str] = []
    try:
        graph.lint()
    except Exception as error:  # lint raises plain RuntimeError with a description
        errors.append(f"graph lint: {error}")
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    input_names = [getattr(s.arg, "name", None) for s in program.graph_signature.input_specs]
    if [n.name for n in placeholders] != input_names:
        errors.append(
            f"input specs {input_names} do not match placeholders {[n.name for n in placeholders]}"
        )
    outputs = list(graph.output_node().args[0])
    output_names = [getattr(s.arg, "name", None) for s in program.graph_signature.output_specs]
    if [getattr(o, "name", None) for o in outputs] != output_names:
        errors.append(f"output specs {output_names} do not match the output node")
    fake_mode = fake_mode_of(graph)
    for node in graph.nodes:
        if node.op != "call_function":
            continue
        if not _allowed_target(node.target):
            errors.append(
                f"{node.name}: target {node.target} is not ATen, prims, ssmcc, getitem or "
                f"symbolic-size arithmetic{_foreign_op_hint(node.target)}"
            )
            continue
        if node.target in SYMBOLIC_ARITHMETIC:
            problem = _check_symbolic_arithmetic(node)
            if problem:
                errors.append(problem)
            continue
        if node.users and "val" not in node.meta:
            errors.append(f"{node.name}: no meta['val'] (shape/dtype unknown)")
        if is_ssmcc_op(node.target) and fake_mode is not None:
            mismatch = _check_ssmcc_node(node, fake_mode)
            if mismatch:
                errors.append(mismatch)
    return errors


def _foreign_op_hint(target) -> str:
    """What to do about a custom op of another library that no target can lower."""
    namespace = getattr(target, "namespace", None)
    if namespace == "transformers":
        return (
            " (a transformers custom op, e.g. its grouped experts matmul: capture with routing "
            "on, route=True, the default, so ssmcc routes the layer that calls it)"
        )
    if namespace is not None:
        return f" (a custom op of namespace {namespace!r}: no ssmcc target can lower it)"
    return ""


def verify_program(program: ExportedProgram, after: str = "capture") -> None:
    """Raise ``PassError`` listing every violated invariant; ``after`` names the last pass run."""
    errors = verification_errors(program)
    if errors:
        listed = "\n  ".join(errors)
        raise PassError(f"IR verification failed after {after}:\n  {listed}")
