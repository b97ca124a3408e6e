"""Backend registrations: each backend's implementation of an op, declared next to the
implementation, against the op's definition (``definition.py``)::

    @implements("triton", "rmsnorm_gated", check=takes_op_arguments)
    def rmsnorm_gated_fwd(x, z, weight, group_size, eps=1e-6, norm_before_gate=False): ...

A registration naming an op that is not defined, a second implementation of the same op for the
same backend, or one its ``check`` refuses (a launcher that does not take the op's arguments, an
emitter whose schema disagrees with the op's) is an ``OpDefinitionError`` when its module is
imported, naming the op and the backend. ``implementations(backend)`` is the live table a target
reads (name -> implementation); ``description(backend, name)`` what ``ssmcc coverage`` prints.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping

from ssmcc.ops.definition import OpDefinition, OpDefinitionError, definition_of

Check = Callable[[OpDefinition, object], "str | None"]  # why the implementation does not fit


@dataclasses.dataclass(frozen=True)
class Registration:
    implementation: object
    description: str
    check: Check | None = None  # kept to check the implementation again (``recheck``)


REGISTRY: dict[str, dict[str, Registration]] = {}


def register(
    backend: str, op, implementation, *, description: str = "", check: Check | None = None
):
    """Record ``implementation`` as ``backend``'s for ``op`` (a definition, its name, custom op or
    OpOverload); returns the implementation."""
    try:
        definition = definition_of(op)
    except OpDefinitionError as error:
        raise OpDefinitionError(f"backend {backend!r}: {error}") from None
    name = definition.name
    what = getattr(implementation, "__name__", type(implementation).__name__)
    if check is not None:
        problem = check(definition, implementation)
        if problem:
            raise OpDefinitionError(f"backend {backend!r}, {what} for ssmcc.{name}: {problem}")
    table = REGISTRY.setdefault(backend, {})
    earlier = table.get(name)
    if earlier is not None and earlier.implementation is not implementation:
        raise OpDefinitionError(
            f"backend {backend!r} registers two implementations of ssmcc.{name}: "
            f"{getattr(earlier.implementation, '__name__', earlier.implementation)} and {what}"
        )
    table[name] = Registration(implementation, description or what, check)
    return implementation


def implements(backend: str, op, *, description: str = "", check: Check | None = None):
    """``register`` as a decorator."""

    def decorate(implementation):
        return register(backend, op, implementation, description=description, check=check)

    return decorate


class _Implementations(Mapping):
    def __init__(self, backend: str):
        self._backend = backend

    def _table(self) -> dict[str, Registration]:
        return REGISTRY.get(self._backend, {})

    def __getitem__(self, name: str):
        return self._table()[name].implementation

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._table()))

    def __len__(self) -> int:
        return len(self._table())


def implementations(backend: str) -> Mapping:
    """``backend``'s implementations by op name (live: later registrations appear)."""
    return _Implementations(backend)


def description(backend: str, name: str) -> str | None:
    """What ``backend`` registered for op ``name`` (for ``ssmcc coverage``), or None."""
    registration = REGISTRY.get(backend, {}).get(name)
    return None if registration is None else registration.description


def takes_op_arguments(definition: OpDefinition, implementation) -> str | None:
    """A launcher takes the op's arguments by the schema's names, first and in order (it may
    take more after them)."""
    have = list(inspect.signature(implementation).parameters)
    wanted = definition.arguments
    if have[: len(wanted)] == wanted:
        return None
    return f"takes ({', '.join(have)}); the op's arguments are ({', '.join(wanted)}), first"


def recheck(definition: OpDefinition) -> list[str]:
    """Every registered implementation of ``definition``'s op checked again against it (e.g. a
    definition whose arguments changed): one line per binding that no longer fits, naming it."""
    problems = []
    for backend, table in REGISTRY.items():
        registration = table.get(definition.name)
        if registration is None or registration.check is None:
            continue
        problem = registration.check(definition, registration.implementation)
        if problem:
            what = getattr(registration.implementation, "__qualname__", registration.implementation)
            module = getattr(registration.implementation, "__module__", "?")
            problems.append(f"backend {backend!r}, {module}.{what}: {problem}")
    return problems
