"""A stable text form of a program, for golden tests and ``ssmcc inspect --graph``.

Stable means: node names as the graph has them, symbolic sizes renamed ``s0, s1, ...`` in order of
first appearance, dtypes abbreviated, op names without object ids. Layout::

    ## inputs
    %input_ids: i64[s0, s1]  (user_input)
    ## nodes
    %embedding: f32[s0, s1, 32] = aten.embedding(%p_weight, %input_ids)
    ## outputs
    return (%linear,)
"""

from __future__ import annotations

import operator

import sympy
import torch
from torch.export import ExportedProgram
from torch.fx import Node

_DTYPE_NAMES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float64: "f64",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.int16: "i16",
    torch.int8: "i8",
    torch.uint8: "u8",
    torch.bool: "b8",
}


class _SymbolNames:
    """Renames free symbols to s0, s1, ... in order of first appearance."""

    def __init__(self) -> None:
        self.mapping: dict[sympy.Symbol, sympy.Symbol] = {}

    def size(self, size) -> str:
        if not isinstance(size, torch.SymInt):
            return str(int(size))
        expr = size.node.expr
        for symbol in sorted(expr.free_symbols, key=str):
            if symbol not in self.mapping:
                self.mapping[symbol] = sympy.Symbol(f"s{len(self.mapping)}", integer=True)
        return str(expr.xreplace(self.mapping))


def _describe_value(value, names: _SymbolNames) -> str:
    if isinstance(value, torch.Tensor):
        dtype = _DTYPE_NAMES.get(value.dtype, str(value.dtype).removeprefix("torch."))
        return f"{dtype}[{', '.join(names.size(s) for s in value.shape)}]"
    if isinstance(value, (list, tuple)):
        return "(" + ", ".join(_describe_value(v, names) for v in value) + ")"
    if isinstance(value, torch.SymInt):
        return f"sym {names.size(value)}"
    return "?" if value is None else type(value).__name__


def _target_name(target) -> str:
    if target is operator.getitem:
        return "getitem"
    if isinstance(target, torch._ops.OpOverload):
        overload = target._overloadname
        base = f"{target.namespace}.{target._opname}"
        return base if overload == "default" else f"{base}.{overload}"
    return getattr(target, "__name__", str(target))


def _format_arg(arg, names: _SymbolNames) -> str:
    if isinstance(arg, Node):
        return f"%{arg.name}"
    if isinstance(arg, (list, tuple)):
        inner = ", ".join(_format_arg(a, names) for a in arg)
        return f"[{inner}]" if isinstance(arg, list) else f"({inner})"
    if isinstance(arg, torch.SymInt):
        return names.size(arg)
    if isinstance(arg, torch.dtype):
        return _DTYPE_NAMES.get(arg, str(arg))
    if isinstance(arg, (torch.device, torch.layout, torch.memory_format)):
        return str(arg)
    return repr(arg)


def format_program(program: ExportedProgram) -> str:
    names = _SymbolNames()
    kinds = {getattr(s.arg, "name", None): s for s in program.graph_signature.input_specs}
    lines = ["## inputs"]
    body = ["## nodes"]
    outputs = []
    for node in program.graph.nodes:
        described = _describe_value(node.meta.get("val"), names)
        if node.op == "placeholder":
            spec = kinds.get(node.name)
            kind = spec.kind.name.lower() if spec is not None else "input"
            origin = f" {spec.target}" if spec is not None and spec.target else ""
            lines.append(f"%{node.name}: {described}  ({kind}{origin})")
        elif node.op == "call_function":
            args = [_format_arg(a, names) for a in node.args]
            args += [f"{k}={_format_arg(v, names)}" for k, v in node.kwargs.items()]
            body.append(
                f"%{node.name}: {described} = {_target_name(node.target)}({', '.join(args)})"
            )
        elif node.op == "output":
            outputs = [_format_arg(a, names) for a in node.args[0]]
        else:
            body.append(f"%{node.name}: {described} = {node.op} {node.target}")
    return "\n".join(lines + body + ["## outputs", f"return ({', '.join(outputs)},)"]) + "\n"


def op_histogram(program: ExportedProgram) -> dict[str, int]:
    """Count of call_function nodes by printed op name."""
    counts: dict[str, int] = {}
    for node in program.graph.nodes:
        if node.op == "call_function":
            name = _target_name(node.target)
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))
