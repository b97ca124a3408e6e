"""The torch target's saved form: programs without weights, and one memory-mapped weights file.

``strip_weights(program)`` returns a copy of the program whose parameters, buffers and constants
are meta tensors (so ``torch.export.save`` writes the graph and signature only) and its tensors by
key. ``write_weights`` stores the tensors of every program in one safetensors file, each distinct
content once (the prefill, chunk and step programs share their weights; tied weights stay tied),
and returns, per program, which stored tensor each of its keys reads. ``read_weights`` returns
tensors that view a buffer holding the file (the loaded artifact's verified copy in memory,
``ssmcc.artifact_files``), after checking the header against the buffer: every entry's dtype,
shape and byte range must fit, or the error names the entry. ``bind_weights`` checks that each
tensor has the shape and dtype the program was saved with.

safetensors layout: 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to the end of the
header), then the data.
"""

from __future__ import annotations

import hashlib
import json
import struct

import torch
from torch.export import ExportedProgram

from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError
from ssmcc.file_pages import release_file_pages

_DTYPES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPES.items()}
ALIGN = 64


def _bytes(data: torch.Tensor):
    """The bytes of a contiguous tensor, as a numpy uint8 array (no copy)."""
    return data.reshape(-1).view(torch.uint8).numpy()


def program_tensors(program: ExportedProgram) -> dict[str, torch.Tensor]:
    """Every tensor the program reads that is not an input: parameters, buffers, constants."""
    tensors = dict(program.state_dict)
    tensors.update({k: v for k, v in program.constants.items() if isinstance(v, torch.Tensor)})
    return tensors


def strip_weights(program: ExportedProgram) -> ExportedProgram:
    """The program with every weight replaced by a meta tensor of the same shape and dtype."""

    def meta(tensor):
        empty = torch.empty_strided(
            tensor.shape, tensor.stride(), dtype=tensor.dtype, device="meta"
        )
        return (
            torch.nn.Parameter(empty, tensor.requires_grad)
            if isinstance(tensor, torch.nn.Parameter)
            else empty
        )

    return ExportedProgram(
        root=program.graph_module,
        graph=program.graph,
        graph_signature=program.graph_signature,
        state_dict={k: meta(v) for k, v in program.state_dict.items()},
        range_constraints=program.range_constraints,
        module_call_graph=program.module_call_graph,
        constants={
            k: meta(v) if isinstance(v, torch.Tensor) else v for k, v in program.constants.items()
        },
        verifiers=[program.verifier],
    )


def bind_weights(program: ExportedProgram, tensors: dict[str, torch.Tensor], where: str) -> None:
    """Put ``tensors`` (by key) back into a program read with its weights stripped; each must
    have the shape and dtype the program was saved with (``ArtifactError`` naming it)."""

    def checked(key, saved):
        real = tensors[key]
        if real.shape != saved.shape or real.dtype != saved.dtype:
            raise ArtifactError(
                f"{where}: weight {key} is {str(real.dtype).removeprefix('torch.')} "
                f"{list(real.shape)} in the weights file, the program was saved with "
                f"{str(saved.dtype).removeprefix('torch.')} {list(saved.shape)}"
            )
        return real

    for key, value in list(program.state_dict.items()):
        real = checked(key, value)
        program.state_dict[key] = (
            torch.nn.Parameter(real, requires_grad=False)
            if isinstance(value, torch.nn.Parameter)
            else real
        )
    for key, value in list(program.constants.items()):
        if isinstance(value, torch.Tensor):
            program.constants[key] = checked(key, value)


def write_weights(path: str, programs: dict[str, ExportedProgram]) -> dict[str, dict[str, str]]:
    """Write every program's tensors to ``path``; returns ``{program: {key: stored name}}``."""
    stored: dict[bytes, str] = {}
    blobs: list[tuple[str, torch.Tensor]] = []
    index: dict[str, dict[str, str]] = {}
    for program_name, program in programs.items():
        index[program_name] = {}
        for key, tensor in program_tensors(program).items():
            data = tensor.detach().contiguous()
            if data.dtype not in _DTYPES:
                raise ArtifactError(f"weight {key} has dtype {data.dtype}, which cannot be saved")
            raw = _bytes(data).tobytes()
            digest = hashlib.sha256(raw).digest() + repr((data.dtype, tuple(data.shape))).encode()
            if digest not in stored:
                stored[digest] = key if key not in {n for n, _ in blobs} else f"{key}#{len(blobs)}"
                blobs.append((stored[digest], data))
            index[program_name][key] = stored[digest]
            release_file_pages([data])  # a memory-mapped checkpoint's pages, read once
    header, offset = {}, 0
    for name, data in blobs:
        offset += -offset % ALIGN
        size = data.numel() * data.element_size()
        header[name] = {
            "dtype": _DTYPES[data.dtype],
            "shape": list(data.shape),
            "data_offsets": [offset, offset + size],
        }
        offset += size
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % ALIGN)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        start = f.tell()
        for name, data in blobs:
            begin = header[name]["data_offsets"][0]
            f.write(b"\0" * (start + begin - f.tell()))
            if data.numel():
                f.write(memoryview(_bytes(data)))
                release_file_pages([data])
    return index


def _entry(name, entry, data_bytes: int, where: str) -> tuple[torch.dtype, list[int], int, int]:
    """(dtype, shape, begin, end) of a header entry, after checking that it fits the file."""

    def bad(what: str):
        return ArtifactError(
            f"{where}: tensor {name!r} {what}: the file was not written by ssmcc or was changed"
        )

    if not isinstance(entry, dict) or entry.get("dtype") not in _TORCH_DTYPES:
        raise bad(f"has no dtype ssmcc writes ({', '.join(_TORCH_DTYPES)})")
    dtype = _TORCH_DTYPES[entry["dtype"]]
    shape, offsets = entry.get("shape"), entry.get("data_offsets")

    def integers(value, count=None) -> bool:
        return (
            isinstance(value, list)
            and (count is None or len(value) == count)
            and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value)
        )

    if not integers(shape):
        raise bad(f"has shape {shape!r}, not a list of sizes")
    if not integers(offsets, 2) or offsets[0] > offsets[1] or offsets[1] > data_bytes:
        raise bad(f"has byte range {offsets!r} outside the file's {data_bytes} data bytes")
    size = torch.empty((), dtype=dtype).element_size()
    count = 1
    for dim in shape:
        count *= dim
    if offsets[1] - offsets[0] != count * size or offsets[0] % size:
        raise bad(f"{shape} of {entry['dtype']} does not fill its byte range {offsets}")
    return dtype, shape, offsets[0], offsets[1]


def read_weights(buffer, where: str) -> dict[str, torch.Tensor]:
    """The tensors of the safetensors bytes ``buffer`` (a writable buffer private to this
    process, e.g. ``VerifiedFiles.buffer``), each a view of it; ``where`` names the file."""
    total = len(buffer)
    if total < 8:
        raise ArtifactError(f"{where} is not a safetensors file: {total} bytes, no header")
    (length,) = struct.unpack("<Q", bytes(buffer[:8]))
    if length > total - 8:
        raise ArtifactError(
            f"{where} is not a safetensors file: its header claims {length} bytes of {total}"
        )
    header = loads_bounded(bytes(buffer[8 : 8 + length]), f"{where} (its header)")
    if not isinstance(header, dict):
        raise ArtifactError(f"{where} is not a safetensors file: its header is not an object")
    start = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _entry(name, entry, total - start, where)
        if begin == end:
            tensors[name] = torch.empty(shape, dtype=dtype)
            continue
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        flat = torch.frombuffer(buffer, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = flat.view(shape)
    return tensors
