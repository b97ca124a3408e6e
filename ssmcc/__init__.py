"""ssmcc — a compiler for state-space language models (Mamba family).

``ssmcc.capture(model, example_inputs)`` exports a model into the ssmcc IR (ATen + ssmcc ops,
dynamic batch and sequence dims); ``ssmcc.compile(model, target="torch")`` also runs the pass
pipeline and lowers the program to a target; ``ssmcc.load(dir)`` opens a saved artifact.

The package reads capture (``frontend``) -> ``passes`` -> ``lowering`` (one folder per target)
-> ``runtime``, over the op library (``ops``). Importing ``ssmcc`` registers the ops as
``torch.ops.ssmcc.*`` with ssmcc's C++ kernels as their CPU implementation; everything else loads
on first use, so ``import ssmcc.ops`` pulls in torch only.
"""

import importlib

import ssmcc.kernels.cpu.registration  # noqa: F401  (C++ kernels as the ops' CPU implementation)
import ssmcc.ops  # noqa: F401  (registers torch.ops.ssmcc.*)
from ssmcc.errors import (
    CaptureError,
    InputError,
    LoweringError,
    OptionError,
    PassError,
    SSMCCError,
    StreamingError,
)
from ssmcc.version import __version__

_LAZY = {
    "capture": "ssmcc.frontend.export",
    "capture_with_report": "ssmcc.frontend.export",
    "CaptureReport": "ssmcc.frontend.report",
    "compile": "ssmcc.api",
    "dynamo_backend": "ssmcc.dynamo",
    "enable_routes": "ssmcc.dynamo",
    "routes_enabled": "ssmcc.dynamo",
    "load": "ssmcc.api",
    "load_checkpoint": "ssmcc.frontend.checkpoints",
    "CompiledModel": "ssmcc.runtime.compiled",
    "CompileReport": "ssmcc.runtime.report",
    "PrefixCache": "ssmcc.runtime.prefix_cache",
    "State": "ssmcc.runtime.state",
    "Options": "ssmcc.options",
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'ssmcc' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_LAZY))


__all__ = [
    "CaptureError",
    "CaptureReport",
    "CompileReport",
    "CompiledModel",
    "InputError",
    "LoweringError",
    "OptionError",
    "Options",
    "PassError",
    "PrefixCache",
    "SSMCCError",
    "State",
    "StreamingError",
    "__version__",
    "capture",
    "capture_with_report",
    "compile",
    "dynamo_backend",
    "enable_routes",
    "load",
    "load_checkpoint",
    "routes_enabled",
]
