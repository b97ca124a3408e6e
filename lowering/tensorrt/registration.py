"""The TensorRT backend's plugins, registered against the ops (``ssmcc.ops.backends``) where they
are declared (``specs.py``)::

    plugin(PluginSpec(op="rmsnorm_gated", op_type="RmsNormGated", inputs=("x", "z", "weight"), ...))

One op's plugins — one, or a chain in order (``part_of`` the ONNX node the chain replaces) — are
one registration. At import a spec must name a defined op, and agree with the ``ssmcc`` ONNX node
it binds to (``lowering/onnx/schemas.py``): a whole node's plugin reads the node's inputs and
writes its outputs, by name and in the schema's order, and is specialised only on attributes the
node has; a chain's plugin names a node that has a schema. Either failing is an
``OpDefinitionError`` naming the op, the plugin and what disagrees. ``SPECS`` (plugin name ->
spec) and ``OP_PLUGINS`` (op -> plugin names) are read from the registrations (import them
from ``specs.py``, which declares ssmcc's plugins).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping

from ssmcc.lowering.onnx.schemas import SCHEMAS
from ssmcc.ops.backends import implementations, register
from ssmcc.ops.definition import OpDefinitionError

BACKEND = "tensorrt"


@dataclasses.dataclass
class PluginChain:
    """The plugins that compute one op, in launch order."""

    op: str
    specs: list

    @property
    def op_types(self) -> tuple[str, ...]:
        return tuple(spec.op_type for spec in self.specs)


def _names(parameters) -> tuple[str, ...]:
    return tuple(parameter.name for parameter in parameters)


def schema_disagreement(spec) -> str | None:
    """Why ``spec`` does not fit the ONNX node it binds to, or None."""
    schemas = {schema.name: schema for schema in SCHEMAS}
    node = spec.part_of or spec.op_type
    if node not in schemas:
        return f"it binds ssmcc.{node}, which has no schema in lowering/onnx/schemas.py"
    if spec.part_of:
        return None  # one step of a chain: its tensors are the chain's own (scan_chain.py)
    schema = schemas[node]
    for what, have, want in (
        ("inputs", spec.inputs, _names(schema.inputs)),
        ("outputs", spec.outputs, _names(schema.outputs)),
    ):
        if tuple(have) != want:
            return f"its {what} are ({', '.join(have)}), the node's ({', '.join(want)})"
    unknown = [name for name, _ in spec.attributes if name not in schema.attributes]
    if unknown:
        return f"the node has no attribute {', '.join(unknown)}"
    return None


def plugin(spec):
    """Register ``spec`` as (the next step of) its op's TensorRT plugins; returns it."""
    problem = schema_disagreement(spec)
    if problem:
        raise OpDefinitionError(
            f"backend {BACKEND!r}, plugin {spec.op_type} for ssmcc.{spec.op}: {problem}"
        )
    registered = implementations(BACKEND)
    chain = registered[spec.op] if spec.op in registered else PluginChain(spec.op, [])
    if any(known.op_type == spec.op_type for known in chain.specs):
        raise OpDefinitionError(f"backend {BACKEND!r}: plugin {spec.op_type} registered twice")
    if chain.specs and not (spec.part_of and chain.specs[0].part_of == spec.part_of):
        raise OpDefinitionError(
            f"backend {BACKEND!r} registers two plugins for ssmcc.{spec.op} "
            f"({chain.op_types[0]} and {spec.op_type}) that are not one chain (part_of)"
        )
    chain.specs.append(spec)
    register(BACKEND, spec.op, chain, description=" -> ".join(chain.op_types))
    return spec


class _Live(Mapping):
    """A table read from the registrations each time (a plugin registered later appears)."""

    def __init__(self, build):
        self._build = build

    def __getitem__(self, key):
        return self._build()[key]

    def __iter__(self) -> Iterator:
        return iter(self._build())

    def __len__(self) -> int:
        return len(self._build())


def _specs() -> dict:
    return {
        spec.op_type: spec for chain in implementations(BACKEND).values() for spec in chain.specs
    }


def _op_plugins() -> dict[str, tuple[str, ...]]:
    return {op: chain.op_types for op, chain in implementations(BACKEND).items()}


SPECS: Mapping = _Live(_specs)  # plugin name -> spec
OP_PLUGINS: Mapping = _Live(_op_plugins)  # op -> its plugins (one, or a chain in order)
