"""Make a token program captured at a static length dynamic again, when nothing in it still
depends on that length.

A Python loop over time (a model's own scan, captured with routing off) fixes the length at
export. Once ``detect_selective_scan`` and ``detect_causal_conv1d`` have replaced the loop and the
cut convolution with ssmcc ops, the program may hold no other use of the length: then running its
graph at another length and exporting that with a symbolic ``seq`` dim succeeds, and the program
runs at any length, with prefill/step/generate like a routed capture. When some node still
depends on the captured length (an unrecognised loop, a view with the length written in), the
export fails and the program stays static; the reason is returned.

Any other module (``relax_static_dims``) is captured with ``Dim.AUTO`` on every dim, and
torch.export fixes the dims its code fixes (a loop over time: the length). After the passes, each
group of such dims (the input dims of one captured size, e.g. every input's length) is tried the
same way, with that size symbolic; a group whose re-export fails stays static (a feature dim the
weights fix, or a length something else still uses), with the reason.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import math

import sympy
import torch
from torch import nn
from torch.export import Dim, ExportedProgram

aten = torch.ops.aten
_VIEWS = {aten.view.default, aten.reshape.default, aten._unsafe_view.default}


def _expr(size):
    return sympy.Integer(size) if isinstance(size, int) else size.node.expr


def _product(sizes) -> sympy.Expr:
    return sympy.expand(math.prod((_expr(s) for s in sizes), start=sympy.Integer(1)))


def _generalised_sizes(node, source: torch.Tensor, sizes: list, length: int) -> list:
    """``sizes`` of a view with the captured ``length`` replaced where it is a time dim."""
    captured_in = tuple(node.args[0].meta["val"].shape)
    captured_out = tuple(node.meta["val"].shape)
    time_dims = [
        i
        for i, size in enumerate(captured_in)
        if isinstance(size, int)
        and size == length
        and not (isinstance(source.shape[i], int) and source.shape[i] == length)
    ]
    sizes = list(sizes)
    for j, size in enumerate(sizes):
        if not (isinstance(size, int) and size == length):
            continue
        before = _product(captured_out[:j])
        for i in time_dims:
            if _product(captured_in[:i]) == before:
                sizes[j] = source.shape[i]
                break
    return sizes


class _LengthFree(torch.fx.Interpreter):
    """Runs a graph captured at ``length`` at another length (see the module docstring)."""

    def __init__(self, module, length: int):
        super().__init__(module)
        self.length = length

    def run_node(self, node):
        if node.op == "call_function" and node.target in _VIEWS:
            (source, sizes), _ = self.fetch_args_kwargs_from_env(node)
            return node.target(source, _generalised_sizes(node, source, sizes, self.length))
        return super().run_node(node)


class _RunGraph(nn.Module):
    """Runs a program's graph as a plain function of ``input_ids`` (no input-shape guard)."""

    def __init__(self, program: ExportedProgram, length: int):
        super().__init__()
        self.inner = program.module(check_guards=False)
        self.length = length

    def forward(self, input_ids):
        result = _LengthFree(self.inner, self.length).run(input_ids)
        return result[0] if isinstance(result, (tuple, list)) else result


def relax_static_length(
    program: ExportedProgram, length: int, vocab_size: int
) -> tuple[ExportedProgram | None, str]:
    """``(program with a dynamic seq dim, "")``, or ``(None, why it stays static)``."""
    example = torch.randint(0, vocab_size, (2, length + 3))  # a length it was not captured at
    shapes = {"input_ids": {0: Dim("batch", min=1), 1: Dim("seq", min=1)}}
    try:
        relaxed = torch.export.export(
            _RunGraph(program, length), (example,), dynamic_shapes=shapes, strict=False
        )
    except Exception as error:  # torch.export's own exception types
        text = str(error).strip()
        return None, f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
    return relaxed, ""


def is_static(size) -> bool:
    """A dim the program fixes: an int, or a symbol torch.export specialised to a number."""
    return not isinstance(size, torch.SymInt) or size.node.expr.is_number


def user_input_values(program: ExportedProgram) -> list[tuple[str, object]]:
    """``(name, meta value)`` of each user input, in order."""
    values = {n.name: n.meta.get("val") for n in program.graph.nodes if n.op == "placeholder"}
    return [(name, values[name]) for name in program.graph_signature.user_inputs]


def static_input_dims(program: ExportedProgram) -> list[tuple[str, int, int]]:
    """``(input, axis, size)`` of every user-input tensor dim the program fixes."""
    return [
        (name, axis, int(size))
        for name, value in user_input_values(program)
        if isinstance(value, torch.Tensor)
        for axis, size in enumerate(value.shape)
        if is_static(size)
    ]


def takes_flat_tensors(program: ExportedProgram) -> bool:
    """The program is called with its user inputs as positional tensors (no nesting, no
    keyword arguments, no non-tensor input): a re-export can take the same call."""
    spec = program.call_spec.in_spec
    if spec is None or spec.num_children != 2:
        return False
    args, kwargs = spec.children()
    values = user_input_values(program)
    return (
        kwargs.num_children == 0
        and all(child.is_leaf() for child in args.children())
        and args.num_children == len(values)
        and all(isinstance(value, torch.Tensor) for _, value in values)
    )


class _RunFlat(nn.Module):
    """Runs a program's graph as a function of its user inputs, positional (no input-shape
    guard); ``named`` gives it a forward whose parameters carry the program's input names."""

    def __init__(self, program: ExportedProgram, length: int):
        super().__init__()
        self.inner = program.module(check_guards=False)
        self.length = length

    def forward(self, *inputs):
        result = _LengthFree(self.inner, self.length).run(*inputs)
        outputs = list(result) if isinstance(result, (tuple, list)) else [result]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @classmethod
    def named(cls, program: ExportedProgram, length: int) -> _RunFlat:
        def forward(self, *inputs):
            return cls.forward(self, *inputs)

        positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
        names = ["self", *program.graph_signature.user_inputs]
        forward.__signature__ = inspect.Signature([inspect.Parameter(n, positional) for n in names])
        return type(cls.__name__, (cls,), {"forward": forward})(program, length)


def _free_size(taken: set[int], size: int) -> int:
    """A size other than ``size`` and every size in ``taken`` (so that torch.export does not
    take the dim for another of the same size)."""
    candidate = size + 3
    while candidate in taken:
        candidate += 1
    return candidate


@contextlib.contextmanager
def _torch_logs_silenced():
    """torch's loggers off: a re-export that fails (the expected answer for a dim the weights
    fix) logs the fake-tensor error with its traceback before raising, which ssmcc reports as
    one line instead."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.root.manager.loggerDict)
        if name == "torch" or name.startswith("torch.")
    ]
    before = [logger.disabled for logger in loggers]
    for logger in loggers:
        logger.disabled = True
    try:
        yield
    finally:
        for logger, disabled in zip(loggers, before, strict=True):
            logger.disabled = disabled


def _relax_group(program: ExportedProgram, members: set[tuple[str, int]], size: int):
    """``program`` re-exported with the user-input dims ``members`` (``(input, axis)``, each of
    static ``size``) one symbolic dim, the dims already symbolic kept so; raises what
    torch.export raises when it cannot."""
    values = user_input_values(program)
    hints = [
        [int(s) if is_static(s) else int(s.node.hint) for s in value.shape] for _, value in values
    ]
    relaxed = _free_size({s for shape in hints for s in shape}, size)
    dim = Dim(f"size{size}", min=1)
    examples, shapes = [], []
    for (name, value), hint in zip(values, hints, strict=True):
        spec = {}
        for axis, s in enumerate(value.shape):
            if not is_static(s):
                spec[axis] = Dim.AUTO
            elif (name, axis) in members:
                spec[axis], hint[axis] = dim, relaxed
        examples.append(torch.zeros(hint, dtype=value.dtype))
        shapes.append(spec)
    with _torch_logs_silenced():
        return torch.export.export(
            _RunFlat.named(program, size),
            tuple(examples),
            dynamic_shapes=tuple(shapes),
            strict=False,
        )


def _groups(program: ExportedProgram):
    """``(size, dims of that size, the same split by axis)`` per static size; the split (tried
    when all together fail: a length equal to a feature width) is empty for dims at one axis."""
    found = []
    for size in sorted({size for _, _, size in static_input_dims(program) if size > 0}):
        whole = {(n, a) for n, a, s in static_input_dims(program) if s == size}
        axes = sorted({a for _, a in whole})
        split = [{(n, a) for n, a in whole if a == axis} for axis in axes] if len(axes) > 1 else []
        found.append((size, whole, split))
    return found


def _describe(members: set[tuple[str, int]], size: int) -> str:
    dims = ", ".join(f"{n} dim {a}" for n, a in sorted(members, key=lambda m: (m[1], m[0])))
    return f"{dims} ({size})"


def relax_static_dims(program: ExportedProgram) -> tuple[ExportedProgram, list[str], list[str]]:
    """``(program, made dynamic, kept static)``: the static user-input dims of each size tried
    symbolic together, and where that fails and they sit at several axes, axis by axis (see the
    module docstring); the lists describe the dims (``x dim 1 (7)``), the kept ones with why.
    Only for programs called with flat tensors (``takes_flat_tensors``)."""
    made, kept = [], []

    def attempt(members: set[tuple[str, int]], size: int) -> str | None:
        nonlocal program
        try:
            program = _relax_group(program, members, size)
        except Exception as error:  # torch.export's own exception types, or the graph's
            text = str(error).strip()
            return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
        made.append(_describe(members, size))
        return None

    for size, whole, split in _groups(program):
        why = attempt(whole, size)
        if why is None:
            continue
        if not split:
            kept.append(f"{_describe(whole, size)}: {why}")
        for members in split:
            why = attempt(members, size)
            if why is not None:
                kept.append(f"{_describe(members, size)}: {why}")
    return program, made, kept
