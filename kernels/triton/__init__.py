"""ssmcc's Triton kernels: one file per op family, each in the order math docstring ->
``@triton.jit`` kernel(s) -> launcher (shapes, strides, grid and meta-parameters in one place).

Triton is an optional dependency (``pip install -e ".[triton]"``): importing this package does not
import it; ``runtime.require_triton()`` says what to install when it is missing. A launcher runs its
kernel compiled for the GPU when the tensors are on a CUDA device and in Triton's interpreter when
they are on the CPU (slow; for tests): the same kernel source either way (``runtime.launch``).
``registry.TRITON_KERNELS`` maps every ssmcc op to its launcher; ``aot`` compiles the
specialisations a model needs ahead of time to PTX and cubin.
"""
