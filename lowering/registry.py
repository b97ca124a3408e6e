"""The target registry: every target is one folder ``lowering/<name>/`` declaring one ``TARGET``.

A target's package ``__init__`` holds a ``Target`` (cheap to import: no backend library is loaded)
naming the module that implements it. That module provides::

    lower(programs: ProgramSet, options: Options) -> Executable
    save(executable, folder: str) -> dict            # files written into folder; manifest entries
    load(folder: str, manifest: dict, options: Options) -> Executable
    native_ops() -> dict[str, str]                   # op -> the kernel that runs it
    unsupported_ops() -> dict[str, str]              # op -> why this target cannot run it

An ``Executable`` runs the target's form of the programs::

    graphs: tuple[str, ...]          # of "forward", "prefill", "chunk", "step"
    specs: list[StateSpec]           # the states prefill/chunk/step take and return
    run(graph, *inputs) -> list[Tensor]
        forward: the model's own inputs -> its outputs
        prefill/chunk/step: (input_ids, *states) -> (logits, *new states)
    decode_session(batch, sampling) -> session or None     # optional: decoding on the device
        (``runtime/generation.py``'s ``stream``; the triton target's CUDA graphs)

``compile``, ``load``, ``save``, the command line's choices and ``ssmcc coverage`` read this
registry: a new target is a new folder, nothing else. ``PLANNED`` names targets the design card
promises that no folder provides yet (a folder of that name takes precedence).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from types import ModuleType

from ssmcc.errors import OptionError
from ssmcc.options import OptionSpec

PLANNED: dict[str, str] = {}


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    summary: str
    implementation: str  # module providing lower/save/load/native_ops/unsupported_ops
    options: tuple[OptionSpec, ...] = ()
    dtypes: tuple[str, ...] = ()  # values of the dtype option it implements (None always is)
    quantize: tuple[str, ...] = ("none",)
    builds_on: tuple[str, ...] = ()  # targets whose lowering/artifact this one reuses

    def module(self) -> ModuleType:
        return importlib.import_module(self.implementation)


@functools.cache
def _discover() -> dict[str, Target]:
    import ssmcc.lowering as package

    found = {}
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        target = getattr(module, "TARGET", None)
        if isinstance(target, Target):
            found[target.name] = target
    return found


def targets() -> list[Target]:
    """Every registered target, by name."""
    return list(_discover().values())


def target_names() -> list[str]:
    return list(_discover())


def planned() -> dict[str, str]:
    """Targets the design names that no folder provides yet, with the reason."""
    return {name: why for name, why in PLANNED.items() if name not in _discover()}


def get_target(name: str) -> Target:
    """The registered target ``name``, or ``OptionError`` saying what is available."""
    found = _discover()
    if isinstance(name, str) and name in found:
        return found[name]
    available = ", ".join(found)
    if name in planned():
        raise OptionError(
            f"target {name!r} is not available in this version ({PLANNED[name]}); "
            f"available: {available}"
        )
    raise OptionError(f"unknown target {name!r}; available: {available}")


def coverage() -> list[dict[str, str]]:
    """One row per (op, target): ``supported`` with the kernel, or ``unsupported`` with why."""
    from ssmcc.ops import SSMCC_OPS

    rows = []
    tables = {t.name: (t.module().native_ops(), t.module().unsupported_ops()) for t in targets()}
    for op in SSMCC_OPS:
        for name, (native, unsupported) in tables.items():
            if op in native:
                rows.append(
                    {"op": op, "backend": name, "status": "supported", "detail": native[op]}
                )
            else:
                why = unsupported.get(op, "no emitter registered")
                rows.append({"op": op, "backend": name, "status": "unsupported", "detail": why})
        for name, why in planned().items():
            rows.append({"op": op, "backend": name, "status": "unsupported", "detail": why})
    return rows
