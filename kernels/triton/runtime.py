"""How ssmcc's Triton kernels run: compiled for a CUDA GPU, or in Triton's interpreter on the CPU.

``launch(kernel, grid)(*args, **meta)`` is ``kernel[grid](*args, **meta)`` when the tensors are on
a CUDA device. On the CPU it runs the same kernel source in Triton's interpreter: Triton decides
when it is imported (``TRITON_INTERPRET=1``) whether ``@triton.jit`` makes compiled or interpreted
functions, its own library (``tl.sum``, ``tl.zeros``, ``tl.cumsum``) included, and PyTorch
imports Triton early (``torch._dynamo`` does, when it is installed), so a process usually has it
compiled by the time a model is compiled. ``launch`` then wraps the kernel in Triton's
``InterpretedFunction`` and, for the call, swaps the library's ``@triton.jit`` functions for
interpreted ones (``interpreted_language``), restoring them after. With ``TRITON_INTERPRET=1`` set
before Triton was imported everything is interpreted already and nothing is swapped.

The interpreter runs every program instance one after another in Python (slow: for tests). The
kernels are self-contained, except the TensorRT plugin wrappers (``plugin_kernels.py``), which
call other kernels of this package as device functions, and kernels call the device functions of
``activations.py``: ``launch`` swaps every ``@triton.jit`` function a kernel can reach (through
its module's names, transitively) for an interpreted one for the call, too.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import sys
import threading
import types

import torch

from ssmcc.errors import OptionError

INSTALL_HINT = 'pip install -e ".[triton]" (or: pip install triton==3.9.0)'
_SWAP_LOCK = threading.RLock()


def triton_available() -> bool:
    module = sys.modules.get("triton", False)
    if module is not False:
        return module is not None  # None: an import of it was blocked
    return importlib.util.find_spec("triton") is not None


def require_triton(what: str = "the triton target") -> None:
    """``OptionError`` saying what to install when Triton is missing."""
    if not triton_available():
        raise OptionError(f"{what} needs Triton, which is not installed: {INSTALL_HINT}")


def device_for(interpret: bool) -> torch.device:
    """Where the lowered program's tensors live: the CPU when interpreting, else the current CUDA
    device (``OptionError`` without one)."""
    if interpret:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise OptionError(
            "target 'triton' runs its kernels on a CUDA GPU and this machine has none "
            f"(torch {torch.__version__}: torch.cuda.is_available() is False); pass "
            "interpret=True (command line: --interpret) to run the same kernels in Triton's "
            "interpreter on the CPU (slow: for testing), or use target 'torch' or 'onnx'"
        )
    return torch.device("cuda", torch.cuda.current_device())


@functools.cache
def _library_swaps() -> tuple:
    """(module, name, compiled, interpreted) for every ``@triton.jit`` function of Triton's
    language modules."""
    import triton.runtime.interpreter  # noqa: F401  (imported before anything is swapped)
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    with contextlib.suppress(ImportError):  # the interpreter imports it lazily; it asserts on
        import triton.experimental.gluon.language  # noqa: F401  (compiled library functions)
    swaps = []
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("triton.language"):
            continue
        for attr, value in list(vars(module).items()):
            if isinstance(value, JITFunction):
                swaps.append((module, attr, value, InterpretedFunction(value.fn)))
    return tuple(swaps)


def _language_namespaces() -> list:
    """The modules and classes Triton's interpreter patches while it runs a kernel."""
    import triton.language as tl

    found = [tl, tl.core, tl.math, tl.core.tensor, tl.core.tensor_descriptor_base]
    found += [m for n, m in sys.modules.items() if n.startswith("triton.language.") and m]
    return list({id(o): o for o in found}.values())


def _restore(namespaces: list[tuple[object, dict]]) -> None:
    """Put back every name that was there before and now differs, and remove what was added to
    a class (a patched method shadowing an inherited one). Names added to a module stay: the
    interpreter's rewritten functions live in those modules and read the helpers it put beside
    them."""
    for owner, saved in namespaces:
        current = vars(owner)
        if isinstance(owner, type):
            for name in [n for n in current if n not in saved]:
                delattr(owner, name)
        for name, value in saved.items():
            if current.get(name, _MISSING) is not value:
                setattr(owner, name, value)


_MISSING = object()


@contextlib.contextmanager
def interpreted_language():
    """Triton's library functions interpreted for the duration (one thread at a time), and
    every name of Triton's language put back afterwards: the interpreter patches the language
    for each call of a library function from inside a kernel and never restores those patches,
    which would leave later compiled builds in this process (``aot``) with interpreter
    semantics."""
    with _SWAP_LOCK:
        swaps = _library_swaps()
        saved = [(owner, dict(vars(owner))) for owner in _language_namespaces()]
        for module, attr, _, interpreted in swaps:
            setattr(module, attr, interpreted)
        try:
            yield
        finally:
            _restore(saved)


def _callee_namespaces(kernel) -> list[tuple[dict, str, object]]:
    """(namespace, name, function) of every ``@triton.jit`` function ``kernel`` can reach: those
    named in its module, in the modules of this package its module names (``activations`` in
    ``activations.activate``), and so on through each callee's own module."""
    from triton.runtime.jit import JITFunction

    found, seen, pending = [], set(), [kernel.fn.__globals__]
    while pending:
        names = pending.pop()
        if id(names) in seen:
            continue
        seen.add(id(names))
        for name, value in list(names.items()):
            if isinstance(value, JITFunction) and value is not kernel:
                found.append((names, name, value))
                pending.append(value.fn.__globals__)
            elif isinstance(value, types.ModuleType) and value.__name__.startswith(__package__):
                pending.append(vars(value))
    return found


@contextlib.contextmanager
def _callees_interpreted(kernel):
    """The ``@triton.jit`` functions ``kernel`` can reach (``_callee_namespaces``), interpreted
    for the duration (the interpreter runs a function's rewritten source in its module's
    namespace, and calls what that namespace holds)."""
    callees = _callee_namespaces(kernel)
    interpreted = [_interpreted(value) for _, _, value in callees]  # hashed before any swap
    for (names, name, _), function in zip(callees, interpreted, strict=True):
        names[name] = function
    try:
        yield
    finally:
        for names, name, value in callees:
            names[name] = value


@functools.cache
def _interpreted(kernel):
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(kernel.fn)


def _device_of(args) -> torch.device:
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg.device
    raise OptionError("a Triton kernel was launched without a tensor argument")


def _scan_by_slices(self, input):
    """The interpreter's scan with a combine function of its own (``tl.associative_scan``), one
    slice across the axis at a time: the same combine, elementwise over whole slices, in the same
    order. Triton's own ``generic_scan`` calls the combine once per element in Python (~90 us:
    a [16, 16, 16] tile took 0.4 s)."""
    import numpy as np
    from triton.language.core import tensor

    data = [np.moveaxis(arg.handle.data, self.axis, 0) for arg in input]
    out = [np.empty_like(d) for d in data]
    acc = None
    for i in range(data[0].shape[0]):
        current = tuple(self.to_tensor(d[i], arg.dtype) for d, arg in zip(data, input, strict=True))
        acc = current if acc is None else self.combine_fn.fn(*acc, *current)
        acc = acc if isinstance(acc, tuple) else (acc,)
        for o, value in zip(out, acc, strict=True):
            value = np.asarray(value.handle.data if isinstance(value, tensor) else value)
            o[i] = value.reshape(o.shape[1:]) if value.size == o[i].size else value
    outputs = zip(out, input, strict=True)
    return [self.to_tensor(np.moveaxis(o, 0, self.axis), arg.dtype) for o, arg in outputs]


@contextlib.contextmanager
def scans_by_slices():
    """Triton's interpreter scanning slice by slice (``_scan_by_slices``) for the duration."""
    from triton.runtime.interpreter import ScanOps

    with _SWAP_LOCK:
        original = ScanOps.generic_scan
        ScanOps.generic_scan = _scan_by_slices
        try:
            yield
        finally:
            ScanOps.generic_scan = original


# While ``aot.record_launches`` runs: the launches, recorded instead of run.
RECORDED: list | None = None


def launch(kernel, grid: tuple):
    """``kernel[grid]``: compiled for CUDA tensors, interpreted for CPU tensors (recorded, not
    run, while ``RECORDED`` is a list)."""
    from triton.runtime.interpreter import InterpretedFunction

    def run(*args, **meta):
        if RECORDED is not None:
            RECORDED.append((kernel, tuple(grid), args, meta))
            return None
        if isinstance(kernel, InterpretedFunction):  # TRITON_INTERPRET=1 at import
            with scans_by_slices():
                return kernel[grid](*args, **meta)
        device = _device_of(args)
        if device.type == "cuda":
            return kernel[grid](*args, **meta)
        if device.type != "cpu":
            raise OptionError(
                f"Triton kernels run on CUDA or (interpreted) CPU tensors, got {device}"
            )
        interpreted = _interpreted(kernel)
        with interpreted_language(), _callees_interpreted(kernel), scans_by_slices():
            return interpreted[grid](*args, **meta)

    return run


def next_power_of_2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()
