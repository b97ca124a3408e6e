"""The inputs a compiled plain module takes, and the check of a call against them.

A program captured from a module other than a language model may keep dims torch.export fixed at
capture (a feature dim its weights fix, or a length its code still depends on: the compile
report's notes say which and why). ``input_dims(program)`` describes each user input as
``{"name", "dims"}``, a dim being its size where the program fixes it and None where it is
dynamic; it is kept in the compiled model's info and its artifact's manifest, and ``check_inputs``
refuses a call that does not fit with one line naming the input, the dim, the expected and the
given size, before any target sees it (where the torch target would fail on a guard).
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from ssmcc.errors import ArtifactError, InputError
from ssmcc.frontend.dynamic_length import is_static, user_input_values


def input_dims(program: ExportedProgram) -> list[dict] | None:
    """Each user input's name and dims (an int where static, None where dynamic), or None when
    an input is not a tensor (then the target checks the call)."""
    described = []
    for name, value in user_input_values(program):
        if not isinstance(value, torch.Tensor):
            return None
        dims = [int(size) if is_static(size) else None for size in value.shape]
        described.append({"name": name, "dims": dims})
    return described


def check_input_dims_entry(entry, where: str) -> list[dict] | None:
    """``entry`` (a manifest's ``input_dims``) if it has the form ``input_dims`` writes, else
    ``ArtifactError`` naming it."""
    if entry is None:
        return None
    fits = isinstance(entry, list) and all(
        isinstance(item, dict)
        and isinstance(item.get("name"), str)
        and isinstance(item.get("dims"), list)
        and all(d is None or (isinstance(d, int) and not isinstance(d, bool)) for d in item["dims"])
        for item in entry
    )
    if not fits:
        shown = repr(entry)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ArtifactError(
            f"{where}: input_dims must be a list of {{name, dims: [int or null ...]}}, got {shown}"
        )
    return entry


def _shape(dims: list) -> str:
    return "(" + ", ".join("any" if d is None else str(d) for d in dims) + ")"


def check_inputs(args: tuple, described: list[dict] | None) -> None:
    """``InputError`` (one line) when ``args`` do not fit ``described`` (``input_dims``)."""
    if described is None:
        return
    names = ", ".join(item["name"] for item in described)
    if len(args) != len(described):
        raise InputError(
            f"this compiled model takes {len(described)} input(s) ({names}), got {len(args)}"
        )
    for index, (arg, item) in enumerate(zip(args, described, strict=True)):
        name, dims = item["name"], item["dims"]
        if not isinstance(arg, torch.Tensor):
            raise InputError(
                f"input {name} (argument {index}) must be a torch.Tensor of shape {_shape(dims)}, "
                f"got {type(arg).__name__}"
            )
        if arg.dim() != len(dims):
            raise InputError(
                f"input {name} (argument {index}) must have rank {len(dims)} {_shape(dims)}, "
                f"got shape {tuple(arg.shape)}"
            )
        for axis, (expected, given) in enumerate(zip(dims, arg.shape, strict=True)):
            if expected is not None and given != expected:
                raise InputError(
                    f"input {name} (argument {index}) has size {given} in dim {axis}; this "
                    f"compiled model runs only at size {expected} there (the dim stayed static "
                    f"at capture; the compile report's notes say why), input shape {_shape(dims)}"
                )
