"""The C++ kernels as the CPU implementation of ``torch.ops.ssmcc.*`` (``torch.library``).

Importing this module registers, for every op with a C++ kernel, a CPU kernel that runs the C++
entry point (with the op's own argument checks) when the kernel library builds here, and the op
library's PyTorch reference otherwise. So eager calls such as ``torch.ops.ssmcc.selective_scan``,
programs run through ``ExportedProgram.module()`` and graphs compiled by ``torch.compile`` all
reach the C++ kernels. The library is built on the first call, not at import (the build takes
seconds and is cached). ``CALLS`` counts which implementation each call ran, by op.

The torch target's lowering binds its kernels directly (without the per-call argument checks: the
IR verifier checked the program), through ``torch_binding.VERIFIED_PROGRAM_KERNELS``.
"""

from __future__ import annotations

from collections import Counter

import torch

from ssmcc.kernels.cpu import torch_binding
from ssmcc.ops import SSMCC_OPS, SSMCC_REFERENCES

CALLS: Counter = Counter()  # (op, "cpp" | "reference") -> calls


def _implementation(name: str):
    kernel, reference = torch_binding.KERNELS[name], SSMCC_REFERENCES[name]

    def run(*args, **kwargs):
        if torch_binding.available():
            CALLS[name, "cpp"] += 1
            return kernel(*args, **kwargs)
        CALLS[name, "reference"] += 1
        return reference(*args, **kwargs)

    run.__name__ = f"{name}_cpu"
    return run


for _name in torch_binding.KERNELS:
    torch.library.register_kernel(SSMCC_OPS[_name], "cpu", _implementation(_name))
