"""The torch target's saved form: programs without weights, and one memory-mapped weights file.

``strip_weights(program)`` returns a copy of the program whose parameters, buffers and constants
are meta tensors (so ``torch.export.save`` writes the graph and signature only) and its tensors by
key. ``write_weights`` stores the tensors of every program in one safetensors file, each distinct
content once (the prefill, chunk and step programs share their weights; tied weights stay tied),
and returns, per program, which stored tensor each of its keys reads. ``read_weights`` maps the
file with ``mmap`` (copy-on-write) and returns tensors that view the mapped pages: opening an
artifact reads no weight until a kernel touches it, and processes sharing the file share pages.

safetensors layout: 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}}`` (offsets relative to the end of the
header), then the data.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import struct

import torch
from torch.export import ExportedProgram

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


def bind_weights(program: ExportedProgram, tensors: dict[str, torch.Tensor]) -> None:
    """Put ``tensors`` (by key) back into a program read with its weights stripped."""
    for key, value in list(program.state_dict.items()):
        real = tensors[key]
        program.state_dict[key] = (
            torch.nn.Parameter(real, requires_grad=False)
            if isinstance(value, torch.nn.Parameter)
            else real
        )
    for key, value in list(program.constants.items()):
        if isinstance(value, torch.Tensor):
            program.constants[key] = tensors[key]


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


def read_weights(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, viewing its pages through a private ``mmap``."""
    with open(path, "rb") as f:
        try:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        except (struct.error, json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ArtifactError(f"{path} is not a safetensors file: {error}") from error
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if length else None
    start = 8 + length
    tensors = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = _TORCH_DTYPES[entry["dtype"]]
        begin, end = entry["data_offsets"]
        count = (end - begin) // torch.empty((), dtype=dtype).element_size()
        if count == 0:
            tensors[name] = torch.empty(entry["shape"], dtype=dtype)
            continue
        flat = torch.frombuffer(mapped, dtype=dtype, count=count, offset=start + begin)
        tensors[name] = flat.view(entry["shape"])
    return tensors
