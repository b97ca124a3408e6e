"""Bookkeeping of the triton target's captured decode (``decode_graph.py``): batch-size buckets,
the state pool's slots, the static buffers one bucket's graph reads and writes, and which decode
path a generation takes. Nothing here launches a kernel: it runs, and is tested, on the CPU.

Buckets: a step is captured for ``BUCKETS`` = 1, 2, 4, 8, 16, 32, 64 rows; a batch of b rows runs
in the smallest bucket >= b, rows b.. being padding (slot -1: the fused step kernels skip them,
their tokens are not read). A batch above 64 decodes eagerly.

State pool: one tensor per state of the step program, (slots, *state shape) in the state's dtype
(``PoolLayout``), and ``lengths`` (slots,) int32, the positions each slot's K/V caches hold; row
i of a batch reads and writes slot ``state_indices[i]``. A K/V cache's growing axis has a fixed
capacity in its pool (``capacity_for``: the longest prompt plus the new tokens of the generations
served so far, rounded up to a power of two, at least ``MIN_CAPACITY``), so a step writes at a
position instead of concatenating. ``SlotPool`` hands out the lowest free slots and takes them
back. The pools hold as many slots as the largest bucket served so far: growing them (slots or
capacity) reallocates the pools, and the graphs captured over the old ones are dropped (they hold
the old addresses).

Static buffers of a bucket B (``StaticBuffers``; one set per (bucket, sampling mode), allocated
before the capture, their addresses fixed in the graph):

    ids          (B, 1) int64    the tokens the step reads (the graph writes the chosen ones back)
    slots        (B,)   int32    row -> slot; -1 for padding rows
    tokens       (B,)   int64    the chosen tokens, copied to the host after each replay
    temperature  (B, 1) float32  \\
    top_k        (B, 1) int64     } sampling settings per row (sample/filter modes)
    top_p        (B, 1) float32  /
    noise        (B, V) float32  Exp(1) draws, refilled by the device generator before a step

and beside them (``decode_graph.BucketProgram``) each fused mixer step's workspace for B rows and
two (B,) int64 host buffers (pinned on a GPU) with an event each, which the tokens come back
through, alternating.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from ssmcc.errors import InputError
from ssmcc.lowering.triton.device_sampling import GREEDY

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_CAPACITY = 256  # K/V positions per slot at least (a smaller pool saves little)


def bucket_for(batch: int) -> int | None:
    """The smallest bucket holding ``batch`` rows, or None above the largest."""
    if batch < 1:
        raise InputError(f"a decode batch has at least one row, got {batch}")
    return next((bucket for bucket in BUCKETS if bucket >= batch), None)


def capacity_for(positions: int) -> int:
    """K/V positions per slot for a generation that reaches ``positions`` (prompt + new tokens):
    a power of two, at least ``MIN_CAPACITY``, so that a few capacities serve every length."""
    return max(MIN_CAPACITY, 1 << max(positions - 1, 0).bit_length())


def row_slots(slots: list[int], bucket: int) -> list[int]:
    """The slot of each row of a bucket: the batch's slots, then -1 for each padding row."""
    if len(slots) > bucket:
        raise InputError(f"{len(slots)} rows do not fit a bucket of {bucket}")
    return list(slots) + [-1] * (bucket - len(slots))


class SlotPool:
    """Which slots of the state pools hold a sequence."""

    def __init__(self, capacity: int = 0):
        self.capacity = capacity
        self._used: set[int] = set()

    @property
    def in_use(self) -> int:
        return len(self._used)

    @property
    def free(self) -> int:
        return self.capacity - len(self._used)

    def acquire(self, count: int) -> list[int]:
        """``count`` free slots, lowest first."""
        if count > self.free:
            raise InputError(
                f"the decode state pool has {self.capacity} slots with {self.in_use} in use: "
                f"cannot admit {count} more sequences; wait for running ones to finish or "
                "decode the batch in parts"
            )
        slots = [s for s in range(self.capacity) if s not in self._used][:count]
        self._used.update(slots)
        return slots

    def release(self, slots: list[int]) -> None:
        stray = [s for s in slots if s not in self._used]
        if stray:
            raise InputError(f"slots {stray} are not in use: released twice, or never acquired")
        self._used.difference_update(slots)

    def grow(self, capacity: int) -> None:
        """More slots (only while none is in use: the pools behind them are reallocated)."""
        if self._used:
            raise InputError(
                f"the decode state pool cannot grow while {self.in_use} of its slots are in use"
            )
        self.capacity = max(self.capacity, capacity)


@dataclasses.dataclass(frozen=True)
class PoolLayout:
    """The state pools of a step program: one (slots, *shape) tensor per state spec, its growing
    axes (a K/V cache's positions) ``capacity`` long; and the (slots,) int32 lengths."""

    specs: tuple
    slots: int
    capacity: int = MIN_CAPACITY

    def shape(self, spec) -> tuple[int, ...]:
        sizes = [self.capacity if axis in spec.grows else n for axis, n in enumerate(spec.shape)]
        return (self.slots, *sizes)

    @property
    def shapes(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        return [(s.name, self.shape(s), s.torch_dtype) for s in self.specs]

    @property
    def nbytes(self) -> int:
        total = sum(math.prod(shape) * dtype.itemsize for _, shape, dtype in self.shapes)
        return total + 4 * self.slots

    def allocate(self, device) -> tuple[list[torch.Tensor], torch.Tensor]:
        """(the pools, the lengths), zeros."""
        pools = [torch.zeros(shape, dtype=dtype, device=device) for _, shape, dtype in self.shapes]
        return pools, torch.zeros(self.slots, dtype=torch.int32, device=device)


@dataclasses.dataclass
class StaticBuffers:
    """One bucket's static buffers (module docstring)."""

    ids: torch.Tensor
    slots: torch.Tensor
    tokens: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    noise: torch.Tensor | None

    @classmethod
    def allocate(cls, bucket: int, vocab: int, device, mode: str) -> StaticBuffers:
        def make(shape, dtype, value):
            return torch.full(shape, value, dtype=dtype, device=device)

        return cls(
            ids=make((bucket, 1), torch.int64, 0),
            slots=make((bucket,), torch.int32, -1),
            tokens=make((bucket,), torch.int64, 0),
            temperature=make((bucket, 1), torch.float32, 1.0),
            top_k=make((bucket, 1), torch.int64, vocab),
            top_p=make((bucket, 1), torch.float32, 1.0),
            noise=None if mode == GREEDY else make((bucket, vocab), torch.float32, 1.0),
        )

    @property
    def bucket(self) -> int:
        return self.ids.shape[0]

    def assign(self, slots: list[int], sampling, vocab: int) -> None:
        """Rows -> slots (padding rows -1) and every row's sampling settings."""
        rows = row_slots(slots, self.bucket)
        self.slots.copy_(torch.tensor(rows, dtype=torch.int32))
        self.temperature.fill_(float(sampling.temperature))
        self.top_k.fill_(min(sampling.top_k or vocab, vocab))
        self.top_p.fill_(float(sampling.top_p if sampling.top_p is not None else 1.0))


def graph_refusal(
    *, cuda_graphs: bool, capture, kernels: str, batch: int, step_refusal: str | None
) -> str | None:
    """Why a generation of ``batch`` rows decodes eagerly, or None: it takes the captured path.
    In this order: the option, the device, the kernels, the step program, the batch."""
    if not cuda_graphs:
        return "cuda_graphs=False: each step runs eagerly"
    if capture is None:
        return "the program runs on the CPU (interpret=True): CUDA graphs need a CUDA device"
    if kernels != "auto":
        return f"kernels={kernels!r} runs the ops' PyTorch references, which take no slot indices"
    if step_refusal is not None:
        return step_refusal
    if bucket_for(batch) is None:
        return f"a batch of {batch} rows is above the largest captured bucket, {BUCKETS[-1]}"
    return None
