"""Canonical forms of one step's expression in an unrolled loop, to tell whether all steps compute
the same update: ops and step-invariant inputs by structure, slices at the step's own index as
``("slice", X, axis, keepdim)``, and named tokens (``H`` for the carried state) where given.
Equal forms mean equal steps; ``first_difference`` and ``describe`` say where two differ.
"""

from __future__ import annotations

from torch.fx import Node

from ssmcc.passes.scan_factoring import require


class StepForms:
    """Canonical form of a step's expression: ops and invariant inputs by name, slices of the
    step's own index as ``@``, the carried state as ``H`` — equal forms mean equal steps."""

    def __init__(self, owner: dict, slices: dict):
        self.owner, self.slices = owner, slices
        self.invariant_forms: dict = {}

    def invariant(self, node: Node) -> object:
        """Structural form of a step-free value (so per-step copies of ``B[:, None]`` agree)."""
        if node not in self.invariant_forms:
            result: tuple
            if node.op in ("placeholder", "get_attr"):
                result = ("input", node.name)
            else:
                args = tuple(
                    self.invariant(a) if isinstance(a, Node) else repr(a) for a in node.args
                )
                kwargs = tuple(sorted((k, repr(v)) for k, v in node.kwargs.items()))
                result = (str(node.target), args, kwargs)
            self.invariant_forms[node] = result
        return self.invariant_forms[node]

    def of(self, node, t: int, tokens: dict) -> object:
        memo: dict = {}

        def form(n):
            if isinstance(n, (list, tuple)):
                return tuple(form(x) for x in n)
            if not isinstance(n, Node):
                return repr(n)
            if n in tokens:
                return tokens[n]
            if n in memo:
                return memo[n]
            if n in self.slices:
                source, axis, keep, index = self.slices[n]
                require(index == t, f"step {t} reads {n.name}, the slice at index {index}")
                result = ("slice", self.invariant(source), axis, keep)
            elif self.owner.get(n) is None:
                result = self.invariant(n)
            else:
                require(
                    self.owner[n] == t,
                    f"step {t} reads {n.name} of step {self.owner[n]} (a scan reads only the "
                    "state of the step before)",
                )
                kwargs = tuple(sorted((k, form(v)) for k, v in n.kwargs.items()))
                result = (str(n.target), form(n.args), kwargs)
            memo[n] = result
            return result

        return form(node)


def first_difference(a, b):
    """The outermost sub-expressions at which two forms differ."""
    while (
        isinstance(a, tuple)
        and isinstance(b, tuple)
        and len(a) == len(b) == 3
        and isinstance(a[0], str)
        and a[0] == b[0]
        and len(a[1]) == len(b[1])
        and a[2] == b[2]
    ):
        differing = [(x, y) for x, y in zip(a[1], b[1], strict=True) if x != y]
        if len(differing) != 1:
            break
        a, b = differing[0]
    return a, b


def describe(form, depth: int = 4) -> str:
    if isinstance(form, str):
        return form
    if isinstance(form, tuple) and form and form[0] in ("slice", "input"):
        return f"{describe(form[1], 1)}[t]" if form[0] == "slice" else form[1]
    if isinstance(form, tuple) and len(form) == 3 and isinstance(form[0], str):
        name = form[0].replace("aten.", "").split(".")[0]
        if depth == 0:
            return f"{name}(...)"
        args = [describe(a, depth - 1) for a in form[1] if a != "None"]
        return f"{name}({', '.join(args)})"
    if isinstance(form, tuple):
        return "[" + ", ".join(describe(a, depth) for a in form) + "]"
    return str(form)
