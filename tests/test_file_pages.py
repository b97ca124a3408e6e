"""ssmcc.file_pages: memory-mapped weights give their pages back once read, and nothing else does.

Pages are counted through ``/proc/self/pagemap`` (present bit) over the tensor's own span, so the
tests see exactly what the kernel maps for this process."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from ssmcc.file_pages import release_file_pages, run_releasing_weights
from ssmcc.lowering.torch.weights import read_weights

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux /proc only")
MB = 1 << 20


def present_pages(tensor: torch.Tensor) -> int:
    page = mmap.PAGESIZE
    begin = tensor.data_ptr()
    end = begin + tensor.numel() * tensor.element_size()
    first, last = -(-begin // page), end // page  # pages wholly inside the tensor
    with open("/proc/self/pagemap", "rb", buffering=0) as pagemap:
        pagemap.seek(first * 8)
        entries = np.frombuffer(pagemap.read((last - first) * 8), dtype=np.uint64)
    return int(np.count_nonzero(entries & np.uint64(1 << 63)))


def _mapped_weights(path: str) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file viewing a private mapping of it (as ``from_pretrained``
    maps a checkpoint)."""
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    return read_weights(mapping, path)


@pytest.fixture
def mapped(tmp_path):
    """Two 8 MiB float32 tensors viewing a private mapping of a safetensors file, and their
    values as written."""
    generator = torch.Generator().manual_seed(0)
    written = {name: torch.randn(2 * MB, generator=generator) for name in ("a", "b")}
    path = str(tmp_path / "weights.safetensors")
    save_file(written, path)
    return _mapped_weights(path), written


def test_a_read_weight_gives_its_pages_back_and_reads_the_same_values(mapped):
    tensors, written = mapped
    a = tensors["a"]
    assert float(a.sum()) == pytest.approx(float(written["a"].sum()), rel=1e-6)
    assert present_pages(a) >= (a.nbytes // mmap.PAGESIZE) - 2
    assert release_file_pages([a]) == 1
    assert present_pages(a) == 0
    assert torch.equal(a, written["a"])  # mapped back from the file
    assert present_pages(a) > 0


def test_a_weight_written_in_place_keeps_its_pages_and_the_write(mapped):
    tensors, _ = mapped
    b = tensors["b"]
    b[: 16 * 1024].fill_(7.0)  # a private copy of the first pages
    assert release_file_pages([b]) == 0
    assert float(b[0]) == 7.0 and float(b[16 * 1024 - 1]) == 7.0
    assert present_pages(b) > 0


def test_memory_not_mapped_from_a_file_is_never_released():
    tensor = torch.randn(2 * MB)
    before = tensor.clone()
    array = np.arange(MB, dtype=np.float32)
    assert release_file_pages([tensor, array, "not a tensor"]) == 0
    assert torch.equal(tensor, before)
    assert array[-1] == MB - 1


class TwoLayers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(1024, 1024)
        self.second = torch.nn.Linear(1024, 64)

    def forward(self, x):
        return self.second(torch.relu(self.first(x)))


def test_a_program_run_releasing_its_weights_computes_what_the_program_does(tmp_path):
    model = TwoLayers().eval()
    path = str(tmp_path / "model.safetensors")
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, path)
    model.load_state_dict(_mapped_weights(path), assign=True)
    x = torch.randn(3, 1024)
    program = torch.export.export(model, (x,))
    with torch.no_grad():
        expected = program.module()(x)
        got = run_releasing_weights(program.module(), x)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
    # its last reader has run: of its 1,024 pages, at most the kernel's fault-around (16 pages
    # mapped with a neighbour the next layer read) are back
    assert present_pages(model.first.weight) <= 16
