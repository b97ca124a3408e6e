"""The ONNX backend's emitters, registered against the ops (``ssmcc.ops.backends``) next to their
code::

    @onnx_emitter("rmsnorm_gated", "ssmcc.RmsNormGated node + portable body", node="RmsNormGated")
    def emit_rmsnorm_gated(x, z, weight, group_size, eps=1e-6, norm_before_gate=False): ...

At import, an emitter must take the op's arguments by name, first and in order; with ``node``
(the ``ssmcc``-domain node it writes), that node's schema (``schemas.SCHEMAS``) must carry every
argument of the op as an input or an attribute of the same name, except those the emitter says
go ``elsewhere`` (argument -> where). Either failing is an ``OpDefinitionError`` naming the op,
the backend and what disagrees. ``emitters.ONNX_TABLE`` reads the registrations.
"""

from __future__ import annotations

from ssmcc.lowering.onnx.schemas import SCHEMAS
from ssmcc.ops.backends import implements, takes_op_arguments

BACKEND = "onnx"


def schema_disagreement(definition, node: str, elsewhere: dict) -> str | None:
    """Why ``node``'s schema does not carry ``definition``'s arguments, or None."""
    schemas = {schema.name: schema for schema in SCHEMAS}
    if node not in schemas:
        return f"it emits ssmcc.{node}, which has no schema in lowering/onnx/schemas.py"
    schema = schemas[node]
    carried = {p.name for p in schema.inputs} | set(schema.attributes)
    missing = [a for a in definition.arguments if a not in carried and a not in elsewhere]
    if not missing:
        return None
    return (
        f"the schema of ssmcc.{node} has no input or attribute for {', '.join(missing)} "
        f"(it has {', '.join(sorted(carried))}); name them alike, or say where they go "
        "(elsewhere=)"
    )


def onnx_emitter(op: str, description: str, *, node: str | None = None, elsewhere=None):
    """Register the decorated function as op ``op``'s ONNX emitter (module docstring)."""
    elsewhere = dict(elsewhere or {})

    def check(definition, emit):
        problem = takes_op_arguments(definition, emit)
        if problem is None and node is not None:
            problem = schema_disagreement(definition, node, elsewhere)
        return problem

    return implements(BACKEND, op, description=description, check=check)
