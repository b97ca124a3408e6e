"""The ssmcc op library: ``torch.library`` custom ops in the ``ssmcc`` namespace.

Each op has a schema, a pure-PyTorch reference (``*_ref``, the oracle), a fake implementation
(shape rules on symbolic sizes) and a docstring with shapes and math, and its module declares it
once (``definition.define``). Importing this package imports every module of it, which registers
the ops as ``torch.ops.ssmcc.<name>``; ``SSMCC_OPS``, ``SSMCC_REFERENCES``, this package's names
(``ssmcc.ops.<name>``, ``ssmcc.ops.<name>_ref``) and ``__all__`` are built from those
declarations, so a new op is one new module here. Backends register kernels against these ops
(``backends.py``); this package imports no pass, lowering or kernel.
"""

import importlib
import pkgutil

from ssmcc.ops.definition import DEFINITIONS, OpDefinition, OpTable, define, definition_of

for _module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
    importlib.import_module(f"{__name__}.{_module}")

# Live views of the definitions: name -> the OpOverload as captured graphs hold it, and name ->
# the op's pure-PyTorch reference (the oracle, and the fallback wherever no kernel runs). An op
# defined after this import (a plug-in, a test) is in both.
SSMCC_OPS = OpTable(lambda definition: definition.overload)
SSMCC_REFERENCES = OpTable(lambda definition: definition.reference)

# ssmcc.ops.<name> is the op, ssmcc.ops.<name>_ref its reference (over the submodule of the name)
globals().update({d.name: d.op for d in DEFINITIONS.values()})
globals().update({f"{d.name}_ref": d.reference for d in DEFINITIONS.values()})


def is_ssmcc_op(target) -> bool:
    """True for an OpOverload in the ``ssmcc`` namespace."""
    return getattr(target, "namespace", None) == "ssmcc"


__all__ = [  # built from the definitions
    *DEFINITIONS,
    *(f"{name}_ref" for name in DEFINITIONS),
    "DEFINITIONS",
    "OpDefinition",
    "SSMCC_OPS",
    "SSMCC_REFERENCES",
    "define",
    "definition_of",
    "is_ssmcc_op",
]
