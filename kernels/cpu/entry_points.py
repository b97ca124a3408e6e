"""The ctypes signatures of libssmcc_kernels.so's entry points, read from their declarations in
``torch_entry.h`` — the one place they are written — so a parameter added, removed or retyped in
C++ cannot leave the Python side passing the old list (which would corrupt memory silently).

Every ``SSMCC_EXPORT int ssmcc_<name>(...);`` declaration becomes ``name -> [(parameter,
ctypes type)]``: any pointer -> ``c_void_p``, ``int64_t`` -> ``c_int64``, ``int32_t`` ->
``c_int32``, ``float`` -> ``c_float``. A parameter of another type is an ``ImportError`` naming
the entry point and the parameter.
"""

from __future__ import annotations

import ctypes
import functools
import pathlib
import re

HEADER = pathlib.Path(__file__).resolve().parent / "torch_entry.h"
_DECLARATION = re.compile(r"SSMCC_EXPORT\s+int\s+(ssmcc_\w+)\s*\(([^)]*)\)\s*;", re.S)
_SCALARS = {"int64_t": ctypes.c_int64, "int32_t": ctypes.c_int32, "float": ctypes.c_float}


def _parameter(entry: str, text: str) -> tuple[str, type]:
    words = " ".join(text.split())
    name = re.findall(r"\w+", words)[-1]
    kind = words[: -len(name)].replace("const", "").strip()
    if "*" in kind:
        return name, ctypes.c_void_p
    if kind in _SCALARS:
        return name, _SCALARS[kind]
    raise ImportError(
        f"{HEADER.name}: {entry}'s parameter {name!r} has type {kind!r}, which ctypes is not "
        f"given here (pointers, {', '.join(_SCALARS)})"
    )


def parse(text: str) -> dict[str, list[tuple[str, type]]]:
    """Entry point -> its parameters (name, ctypes type), in order, from a header's text."""
    found = {}
    for entry, parameters in _DECLARATION.findall(re.sub(r"//[^\n]*", "", text)):
        found[entry] = [_parameter(entry, p) for p in parameters.split(",") if p.strip()]
    return found


@functools.cache
def signatures() -> dict[str, list[tuple[str, type]]]:
    """``torch_entry.h``'s entry points (module docstring)."""
    return parse(HEADER.read_text())
