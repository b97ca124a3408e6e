"""Give back the pages of memory-mapped weights once they have been read.

A checkpoint loaded by ``from_pretrained`` (transformers 5, safetensors) is a private mapping of
the file: a weight costs no memory until it is read, and from then on its pages count in the
process's resident memory although the file holds the same bytes. Compiling reads every weight
(the float reference run, the conversion to bf16 / int8), so without this a 2.8b fp32 checkpoint
holds its whole 11 GB resident while its 5.6 GB bf16 copy is made.

``release_file_pages(tensors)`` drops those pages from this process
(``madvise(MADV_DONTNEED)``): reading the tensor again maps them back from the page cache or the
file, with the same bytes. Only pages that are safe to drop are dropped:

- the tensor lies in one mapping of a regular file (``/proc/self/maps``: an inode and a path),
  so anonymous memory (a model built in memory, a copy) is never touched;
- no page of the tensor's span is a private copy (``/proc/self/pagemap``: a present page without
  the file-page bit is one somebody wrote, e.g. weights edited in place after loading) -- such a
  tensor is left alone, since dropping would undo the write.

Elsewhere than Linux it does nothing. ``run_releasing_weights(module, *inputs)`` runs an
unlifted program node by node and releases each weight right after its last reader, so a float
reference run of a memory-mapped model holds about one layer's weights at a time.
"""

from __future__ import annotations

import bisect
import ctypes
import functools
import mmap
import sys
from collections import defaultdict

import numpy as np
import torch
from torch import fx

PAGE = mmap.PAGESIZE
MADV_DONTNEED = 4
_PRESENT = np.uint64(1 << 63)
_FILE_PAGE = np.uint64(1 << 61)


def _file_mappings() -> list[tuple[int, int]]:
    """(start, end) of every mapping of a regular file in this process, sorted."""
    found = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or fields[4] == "0" or not fields[5].startswith("/"):
                continue
            start, end = (int(x, 16) for x in fields[0].split("-"))
            found.append((start, end))
    found.sort()
    return found


def _span(tensor) -> tuple[int, int]:
    """First and one-past-last byte address a tensor's (or contiguous array's) elements occupy."""
    if isinstance(tensor, np.ndarray):
        if not tensor.flags.c_contiguous:
            return 0, 0
        return tensor.ctypes.data, tensor.ctypes.data + tensor.nbytes
    if tensor.numel() == 0:
        return tensor.data_ptr(), tensor.data_ptr()
    pairs = zip(tensor.shape, tensor.stride(), strict=True)
    last = sum((size - 1) * stride for size, stride in pairs)
    return tensor.data_ptr(), tensor.data_ptr() + (last + 1) * tensor.element_size()


def _only_file_pages(pagemap, first: int, count: int) -> bool:
    pagemap.seek(first * 8)
    entries = np.frombuffer(pagemap.read(count * 8), dtype=np.uint64)
    present = (entries & _PRESENT) != 0
    return not bool(np.any(present & ((entries & _FILE_PAGE) == 0)))


@functools.cache
def _madvise():
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return madvise


def release_file_pages(tensors) -> int:
    """Drop the resident pages of the memory-mapped, unmodified ``tensors`` (torch tensors or
    numpy arrays); returns how many tensors' pages were dropped (see the module doc for which
    ones qualify)."""
    if not sys.platform.startswith("linux"):
        return 0
    tensors = [
        t
        for t in tensors
        if isinstance(t, np.ndarray) or (isinstance(t, torch.Tensor) and t.device.type == "cpu")
    ]
    if not tensors:
        return 0
    mappings = _file_mappings()
    starts = [start for start, _ in mappings]
    madvise = _madvise()
    released = 0
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        for tensor in tensors:
            begin, end = _span(tensor)
            where = bisect.bisect_right(starts, begin) - 1
            if end <= begin or where < 0 or end > mappings[where][1]:
                continue
            first, last = begin // PAGE, -(-end // PAGE)
            if not _only_file_pages(pagemap, first, last - first):
                continue
            if madvise(first * PAGE, (last - first) * PAGE, MADV_DONTNEED) == 0:
                released += 1
    return released


class _ReleasingInterpreter(fx.Interpreter):
    """Runs a graph module node by node; after a weight's last reader, releases its pages."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module)
        last_reader = {}
        for node in module.graph.nodes:
            for read in node.all_input_nodes:
                if read.op == "get_attr":
                    last_reader[read] = node
        self._release_after = defaultdict(list)
        for weight, reader in last_reader.items():
            self._release_after[reader].append(weight)

    def run_node(self, node):
        result = super().run_node(node)
        done = [self.env[w] for w in self._release_after.get(node, ()) if w in self.env]
        release_file_pages([t for t in done if isinstance(t, torch.Tensor)])
        return result


def run_releasing_weights(module: fx.GraphModule, *inputs):
    """``module(*inputs)`` for an unlifted program (``ExportedProgram.module()``), each
    memory-mapped weight's pages released after its last reader."""
    return _ReleasingInterpreter(module).run(*inputs)
