"""ssmcc — a compiler for state-space language models (Mamba family).

``ssmcc.capture(model, example_inputs)`` exports a model into the ssmcc IR (ATen + ssmcc ops,
dynamic batch and sequence dims); ``ssmcc.compile(model, target="torch")`` also runs the pass
pipeline and lowers the program to a backend.
"""

from ssmcc import ops  # noqa: F401  (registers torch.ops.ssmcc.*)
from ssmcc.capture import CaptureReport, capture, capture_with_report
from ssmcc.compile_api import compile
from ssmcc.compiled import CompiledModel, CompileReport
from ssmcc.errors import CaptureError, InputError, LoweringError, PassError, SSMCCError
from ssmcc.onnx_target import load
from ssmcc.prefix_cache import PrefixCache
from ssmcc.state import State

__version__ = "0.1.0"

__all__ = [
    "CaptureError",
    "CaptureReport",
    "CompileReport",
    "CompiledModel",
    "InputError",
    "LoweringError",
    "PassError",
    "PrefixCache",
    "SSMCCError",
    "State",
    "__version__",
    "capture",
    "capture_with_report",
    "compile",
    "load",
]
