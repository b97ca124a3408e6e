"""The ssmcc kernel library as seen from Python: loaded with ctypes, entry points typed, calls
checked. ``torch_binding`` (Mamba-1 ops) and ``ssd_binding`` (Mamba-2 ops) build on it.

Every entry point returns 0, or 1 with the reason in ``ssmcc_last_error()`` (its input contract,
``contracts.h``, did not hold, or an allocation failed); ``call_kernel`` turns that into
``RuntimeError``.
"""

from __future__ import annotations

import ctypes
import functools
import threading

import torch
from torch import Tensor

from ssmcc.kernels.cpu.build import build_torch_kernels
from ssmcc.kernels.cpu.entry_points import signatures

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
# Entry point -> ctypes argument types, from their declarations in torch_entry.h.
_SIGNATURES = {name: [kind for _, kind in params] for name, params in signatures().items()}
# What each parameter of an entry is: "p" a pointer, "i" an integer, "f" a float32.
KINDS = {
    name: "".join("p" if t is _P else "f" if t is _F32 else "i" for t in argtypes)
    for name, argtypes in _SIGNATURES.items()
}


@functools.cache
def library() -> ctypes.CDLL | None:
    path = build_torch_kernels()
    if path is None:
        return None
    lib = ctypes.CDLL(path)
    for name, argtypes in _SIGNATURES.items():
        getattr(lib, name).argtypes = argtypes
        getattr(lib, name).restype = ctypes.c_int
    lib.ssmcc_last_error.argtypes = []
    lib.ssmcc_last_error.restype = ctypes.c_char_p
    lib.ssmcc_replay_entry.argtypes = [ctypes.c_char_p, ctypes.POINTER(_I32)]
    lib.ssmcc_replay_entry.restype = ctypes.c_int32
    lib.ssmcc_replay.argtypes = [_P, _I64, _P, _I64]
    lib.ssmcc_replay.restype = ctypes.c_int
    return lib


class _Recording(threading.local):
    calls: list | None = None


_recording = _Recording()


def call_kernel(name: str, *args) -> None:
    """Call the C entry point ``name``; its contract violation raises ``RuntimeError``. Inside
    ``recording_calls()`` the call (name and arguments) is also appended to the recording."""
    lib = library()
    if getattr(lib, name)(*args) != 0:
        raise RuntimeError(lib.ssmcc_last_error().decode(errors="replace"))
    if _recording.calls is not None:
        _recording.calls.append((name, args))


class recording_calls:
    """``with recording_calls() as calls:`` collects this thread's ``call_kernel`` calls."""

    def __enter__(self) -> list:
        if _recording.calls is not None:
            raise RuntimeError("recording_calls() does not nest")
        _recording.calls = []
        return _recording.calls

    def __exit__(self, *exc) -> None:
        _recording.calls = None


def available() -> bool:
    return library() is not None


def as_f32(t: Tensor | None) -> Tensor | None:
    if t is None or (t.dtype == torch.float32 and t.is_contiguous()):
        return t
    return t.to(torch.float32).contiguous()


def token_rows(t: Tensor | None) -> tuple[Tensor | None, int]:
    """``t`` (batch, length, ...) as float32 rows of its packed inner dims, and the token stride:
    the elements from one position to the next (0: packed). A view whose inner dims are packed and
    whose rows lie at one stride, batch after batch (a slice of a wider projection output), is
    passed as it is; anything else is copied to a packed float32 tensor."""
    if t is None:
        return None, 0
    if t.dtype == torch.float32 and t.dim() >= 2:
        batch, length, inner = t.shape[0], t.shape[1], t.shape[2:]
        width = 1
        packed_inner = True
        for size, stride in zip(reversed(inner), reversed(t.stride()[2:]), strict=True):
            packed_inner = packed_inner and (size == 1 or stride == width)
            width *= size
        if length > 1:
            token = t.stride(1)
        else:
            token = t.stride(0) if batch > 1 else width
        if packed_inner and token >= width and (batch == 1 or t.stride(0) == length * token):
            return t, (0 if token == width else token)
    return t.to(torch.float32).contiguous(), 0


def pointer(t: Tensor | None):
    return None if t is None else t.data_ptr()
