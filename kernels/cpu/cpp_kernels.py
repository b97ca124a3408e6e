"""The C++ kernels' Python bindings, registered against the ops (``ssmcc.ops.backends``) next to
their code, as two backends:

    ``cpp``           the binding with the op's own argument checks: the CPU implementation of
                      ``torch.ops.ssmcc.<op>`` (``registration.py``)
    ``cpp-verified``  the same kernel without per-call checks, for programs the IR verifier
                      checked against the ops' fake implementations (the torch target's lowering)

``@cpp_kernel("op")`` / ``@cpp_kernel("op", verified=True)`` on a binding checks at import that
it takes the op's arguments by name, first and in order (an error names the op and the binding).
"""

from __future__ import annotations

from ssmcc.ops.backends import implementations, implements, takes_op_arguments

CHECKED, VERIFIED = "cpp", "cpp-verified"


def cpp_kernel(op: str, *, verified: bool = False):
    """Register the decorated binding as op ``op``'s C++ kernel (module docstring)."""
    backend = VERIFIED if verified else CHECKED

    def decorate(binding):
        description = f"C++ (kernels/cpu, OpenMP): {binding.__module__}.{binding.__name__}"
        return implements(backend, op, description=description, check=takes_op_arguments)(binding)

    return decorate


def checked_kernels():
    """op -> its checked binding (live)."""
    return implementations(CHECKED)


def verified_kernels():
    """op -> its binding without per-call checks (live)."""
    return implementations(VERIFIED)
