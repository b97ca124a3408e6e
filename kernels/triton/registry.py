"""Every ssmcc op's Triton launcher, by op name: what the triton target's lowered program calls.

A launcher takes the op's arguments as the op does (``ssmcc.ops``) and returns its outputs; the
kernels are compiled for the tensors' CUDA device or run in Triton's interpreter on CPU tensors
(``runtime.py``). Each launcher registers itself (``catalog.launcher``); this module imports the
modules that hold them and reads the registrations. Importing it imports Triton.
"""

from __future__ import annotations

import importlib

from ssmcc.kernels.triton.catalog import launchers
from ssmcc.ops.backends import implementations

for _file in sorted({file for file, _ in launchers().values()}):
    importlib.import_module(f"ssmcc.kernels.triton.{_file[:-3]}")

TRITON_KERNELS = implementations("triton")  # op name -> launcher (live)
