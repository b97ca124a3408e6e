"""An op table entry: how one backend handles one ssmcc op.

Each target keeps one table from op name to ``Emitter``: ``emit`` is the backend's own hook (torch:
``emit(node, kernels)`` returns the callable the node will call; onnx: a torch.onnx translation
function emitting the ssmcc node) and ``kernel`` names the implementation for ``ssmcc coverage``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Emitter:
    kernel: str
    emit: Callable
