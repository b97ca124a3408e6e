"""One definition per op: the table every layer reads the ops from.

An op's module declares it once, below its custom op and fake::

    RMSNORM_GATED = define(rmsnorm_gated, rmsnorm_gated_ref)

``define`` checks that the reference takes the op's arguments by the schema's names, in its
order (the reference is the oracle every backend is tested against and the fallback wherever no
kernel runs), and records an ``OpDefinition`` under the op's short name. ``SSMCC_OPS`` (name ->
the OpOverload captured graphs hold) and ``SSMCC_REFERENCES`` (name -> reference) are live views
of the definitions: an op defined later (a plug-in, a test) is in them as soon as its module is
imported, with no table edited by hand.

Backends register their implementations against a definition (``ssmcc.ops.backends``).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Iterator, Mapping

from ssmcc.errors import SSMCCError


class OpDefinitionError(SSMCCError):
    """An op or a backend registration that does not fit the op library; the message names it."""


@dataclasses.dataclass(frozen=True)
class OpDefinition:
    """An ssmcc op: its name (``torch.ops.ssmcc.<name>``), its custom op, its reference, and for
    an op with many arguments (the fused mixers) the dataclass that names them."""

    name: str
    op: object  # torch.library.CustomOpDef
    reference: Callable
    arguments_class: type | None = None

    @property
    def overload(self):
        """The OpOverload as captured graphs hold it."""
        return self.op._opoverload

    @property
    def schema_arguments(self) -> list[str]:
        return [a.name for a in self.overload._schema.arguments]

    @property
    def arguments(self) -> list[str]:
        """The op's argument names, in order: its dataclass's fields, else its schema's."""
        if self.arguments_class is not None:
            return [f.name for f in dataclasses.fields(self.arguments_class)]
        return self.schema_arguments


DEFINITIONS: dict[str, OpDefinition] = {}


def define(op, reference: Callable, arguments: type | None = None) -> OpDefinition:
    """Record ``op`` (a ``torch.library.custom_op`` in the ``ssmcc`` namespace) with its
    reference (and its arguments' dataclass); ``OpDefinitionError`` naming the op where they
    disagree or it is defined twice."""
    namespace, name = getattr(op, "_namespace", None), getattr(op, "_name", None)
    if namespace != "ssmcc" or not name:
        raise OpDefinitionError(
            f"define() takes a torch.library.custom_op in the ssmcc namespace, got {op!r}"
        )
    definition = OpDefinition(name, op, reference, arguments)
    if arguments is not None and definition.arguments != definition.schema_arguments:
        raise OpDefinitionError(
            f"ssmcc.{name}: its arguments dataclass {arguments.__name__} has fields "
            f"({', '.join(definition.arguments)}), the schema "
            f"({', '.join(definition.schema_arguments)})"
        )
    wanted = definition.arguments
    have = list(inspect.signature(reference).parameters)
    if have != wanted:
        raise OpDefinitionError(
            f"ssmcc.{name}: its reference {reference.__name__} takes ({', '.join(have)}), the "
            f"schema ({', '.join(wanted)}); a reference takes the op's arguments by name, in order"
        )
    earlier = DEFINITIONS.get(name)
    if earlier is not None and earlier.op is not op:
        raise OpDefinitionError(f"ssmcc.{name} is defined twice ({earlier.reference.__module__})")
    DEFINITIONS[name] = definition
    return definition


def definition_of(op) -> OpDefinition:
    """The definition of ``op``: an ``OpDefinition``, its name, custom op or OpOverload;
    ``OpDefinitionError`` listing the defined ops otherwise."""
    if isinstance(op, OpDefinition):
        return op
    for definition in DEFINITIONS.values():
        if op in (definition.name, definition.op) or op is definition.overload:
            return definition
    raise OpDefinitionError(
        f"no ssmcc op {getattr(op, '__name__', op)!r} is defined; defined: "
        f"{', '.join(DEFINITIONS)}"
    )


class OpTable(Mapping):
    """A read-only view of the definitions: name -> ``field(definition)``, in definition order."""

    def __init__(self, field: Callable[[OpDefinition], object]):
        self._field = field

    def __getitem__(self, name: str):
        return self._field(DEFINITIONS[name])

    def __iter__(self) -> Iterator[str]:
        return iter(list(DEFINITIONS))

    def __len__(self) -> int:
        return len(DEFINITIONS)

    def __repr__(self) -> str:
        return f"OpTable({dict(self)!r})"
