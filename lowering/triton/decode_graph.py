"""Decode as one CUDA graph per batch-size bucket: the triton target's ``generate``/``stream``.

Eagerly, a decode step is ~120 kernel launches and ATen calls issued from Python, the logits
copied to the CPU and the token chosen there: the GPU waits on the host every token (18.4
ms/token for mamba-130m on an H200, where reading its weights takes ~0.11-0.15 ms). Here one
step is one graph replay and the host never waits for the device inside a token:

    prefill (eager, chunked, as before) -> states copied into the rows' slots of the state pools
                 (a K/V cache into the first positions of its fixed-capacity pool, its length
                 into ``lengths``; ragged prompts, prefilled row by row, decode as one batch)
    first token: sampled on the device from the prefill's last logits
    per token:   [noise drawn by the device generator]  graph replay:
                     pooled step (pooled_step.py): ids, slots, pools -> logits
                     choose_on_device (device_sampling.py) -> tokens; tokens -> ids
                 tokens copied to a pinned host buffer (non_blocking) + an event recorded
                 the host waits on the *previous* token's event and yields it

so the device runs one step ahead of the host (two pinned buffers and events, alternating), and
a step's input tokens never leave the device. The bookkeeping (buckets, slots, pools, static
buffers, which path is taken) is ``decode_plan.py``.

How a step is captured is a strategy object: ``CudaGraphs`` (a CUDA device: warm-up runs on a
side stream with every row padding, so Triton compiles every kernel and no state is touched,
then ``torch.cuda.graph`` capture into one memory pool shared by every bucket; pinned host
buffers, CUDA events) or ``DirectCall`` (no capture: each "replay" calls the same function over
the same static buffers, plain host buffers, events that are already done). ``DirectCall`` is how
the CPU and Triton's interpreter run exactly this path: the tests' generations through it give
the eager path's tokens.

One generation at a time uses the graphs of an executable (they share static buffers and
pools); a second one started meanwhile (another thread) decodes eagerly.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator

import torch

from ssmcc.errors import InputError
from ssmcc.lowering.triton.decode_plan import (
    PoolLayout,
    SlotPool,
    StaticBuffers,
    bucket_for,
    capacity_for,
)
from ssmcc.lowering.triton.device_sampling import GREEDY, choose_on_device, sampling_mode
from ssmcc.lowering.triton.pooled_step import pool_step

WARMUP_RUNS = 2  # before a capture: Triton compiles, the caching allocator settles


class DirectCall:
    """No capture: the function runs at every replay (the CPU, Triton's interpreter)."""

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        return run

    def host_buffer(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype)

    def event(self):
        return _Done()


class _Done:
    def record(self) -> None:
        pass

    def synchronize(self) -> None:
        pass


class CudaGraphs:
    """Capture into a CUDA graph on ``device``; replays share one memory pool."""

    def __init__(self, device: torch.device):
        self.device = device
        self._pool = None

    def capture(self, run: Callable[[], None]) -> Callable[[], None]:
        current = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            for _ in range(WARMUP_RUNS):
                run()
        current.wait_stream(side)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            run()
        return graph.replay

    def host_buffer(self, shape: tuple, dtype: torch.dtype) -> torch.Tensor:
        return torch.empty(shape, dtype=dtype, pin_memory=True)

    def event(self):
        return torch.cuda.Event()


@dataclasses.dataclass
class BucketProgram:
    """One (bucket, sampling mode)'s static buffers, workspaces, captured step, and the two
    host buffers (pinned on a GPU) and events the chosen tokens come back through."""

    buffers: StaticBuffers
    workspaces: list
    replay: Callable[[], None]
    host: list[torch.Tensor]
    events: list

    def copy_back(self, k: int) -> None:
        """The chosen tokens to host buffer ``k``, asynchronously; event ``k`` marks them."""
        self.host[k].copy_(self.buffers.tokens, non_blocking=True)
        self.events[k].record()

    def take(self, k: int, rows: int) -> torch.Tensor:
        """The first ``rows`` tokens of host buffer ``k``, once they are there."""
        self.events[k].synchronize()
        return self.host[k][:rows].clone()


class GraphDecoder:
    """The captured decode of one executable's step program (module docstring)."""

    def __init__(self, step_module, specs, device, capture):
        self.step = pool_step(step_module, specs, device)  # StepRefusal: decode eagerly
        self.specs = tuple(specs)
        self.vocab = self.step.vocab
        self.device = device
        self.capture = capture
        self.slots = SlotPool()
        self.capacity = 0  # K/V positions per slot
        self.pools: list[torch.Tensor] = []
        self.lengths = torch.zeros(0, dtype=torch.int32)
        self.programs: dict[tuple[int, str], BucketProgram] = {}
        self._busy = threading.Lock()

    def session(self, batch: int, sampling) -> DecodeSession | None:
        """A generation of ``batch`` rows over the graphs, or None while another one runs."""
        if not self._busy.acquire(blocking=False):
            return None
        return DecodeSession(self, batch, sampling)

    def reserve(self, bucket: int, positions: int = 0) -> None:
        """Pools of at least ``bucket`` slots whose K/V caches hold ``positions`` (growing them
        drops the graphs over the old)."""
        capacity = max(self.capacity, capacity_for(positions))
        if self.slots.capacity >= bucket and capacity == self.capacity:
            return
        self.slots.grow(bucket)
        layout = PoolLayout(self.specs, self.slots.capacity, capacity)
        self.pools, self.lengths = layout.allocate(self.device)
        self.capacity = capacity
        self.programs.clear()

    def program(self, bucket: int, mode: str) -> BucketProgram:
        key = (bucket, mode)
        if key not in self.programs:
            buffers = StaticBuffers.allocate(bucket, self.vocab, self.device, mode)
            workspaces = [make(bucket) for make in self.step.workspaces]

            def run():
                logits = self.step.module(
                    buffers.ids, buffers.slots, self.lengths, *self.pools, *workspaces
                )
                choose_on_device(logits, mode, buffers)
                buffers.ids[:, 0].copy_(buffers.tokens)

            replay = self.capture.capture(run)  # every row padding (slot -1): no state touched
            host = [self.capture.host_buffer((bucket,), torch.int64) for _ in range(2)]
            events = [self.capture.event() for _ in range(2)]
            self.programs[key] = BucketProgram(buffers, workspaces, replay, host, events)
        return self.programs[key]

    def end(self, slots: list[int]) -> None:
        """A session is over: its slots free, the decoder free for the next one."""
        try:
            self.slots.release(slots)
        finally:
            self._busy.release()

    def admit(self, state, rows: int) -> list[int]:
        """Slots for ``rows`` sequences, each holding its row of ``state``: a mapping name ->
        (rows, ...) tensor, as prefill returns it, or a list of one-row mappings (prompts of
        different lengths). A K/V cache fills its pool's first positions."""
        parts = state if isinstance(state, list) else [state]
        slots = self.slots.acquire(rows)
        first = 0
        for part in parts:
            count = cached_rows(part, self.specs)
            index = torch.tensor(slots[first : first + count], dtype=torch.int64)
            length = cached_positions(part, self.specs)
            index = index.to(self.device)
            for pool, spec in zip(self.pools, self.specs, strict=True):
                cached = [slice(0, length) if a in spec.grows else slice(None) for a in
                          range(len(spec.shape))]
                pool[(index, *cached)] = part[spec.name].to(self.device, pool.dtype)
            self.lengths[index] = length
            first += count
        return slots


def cached_rows(state, specs) -> int:
    return int(state[specs[0].name].shape[0])


def cached_positions(state, specs) -> int:
    """The positions ``state``'s K/V caches hold (0 without any); one count for every layer, as
    the step reads one length per slot."""
    counts = {int(state[s.name].shape[1 + s.grows[0]]) for s in specs if s.grows}
    if len(counts) > 1:
        raise InputError(
            f"the K/V caches of one state hold different numbers of positions ({sorted(counts)}); "
            "the captured decode keeps one length per sequence"
        )
    return counts.pop() if counts else 0


class DecodeSession:
    """One generation on a ``GraphDecoder`` (holds it until ``close``)."""

    def __init__(self, decoder: GraphDecoder, batch: int, sampling):
        self.decoder = decoder
        self.batch = batch
        self.bucket = bucket_for(batch)
        self.sampling = sampling
        self.mode = sampling_mode(sampling)
        self._slots: list[int] = []
        self._closed = False

    def columns(self, prefill: Callable, max_new_tokens: int) -> Iterator[torch.Tensor]:
        """Yield ``max_new_tokens`` token columns (b,) int64 on the CPU: ``prefill()`` gives
        the last position's logits (b, V) and the state after the prompt."""
        decoder, rows = self.decoder, self.batch
        logits, state = prefill()
        logits = logits[:, -1] if logits.dim() == 3 else logits
        parts = state if isinstance(state, list) else [state]
        cached = max(cached_positions(part, decoder.specs) for part in parts)
        with torch.inference_mode():
            decoder.reserve(self.bucket, cached + max_new_tokens)
            program = decoder.program(self.bucket, self.mode)
            self._slots = decoder.admit(state, rows)
            buffers = program.buffers
            buffers.assign(self._slots, self.sampling, decoder.vocab)
            generator = self._generator()
            first = torch.zeros((self.bucket, decoder.vocab), device=decoder.device)
            first[:rows].copy_(logits)
            self._draw(buffers, generator)
            choose_on_device(first, self.mode, buffers)
            buffers.ids[:, 0].copy_(buffers.tokens)
            program.copy_back(0)
        for produced in range(1, max_new_tokens):
            with torch.inference_mode():
                self._draw(buffers, generator)
                program.replay()
                program.copy_back(produced % 2)
            yield program.take((produced - 1) % 2, rows)  # the device is one step ahead
        yield program.take((max_new_tokens - 1) % 2, rows)

    def _generator(self) -> torch.Generator | None:
        if self.mode == GREEDY:
            return None
        generator = torch.Generator(device=self.decoder.device)
        seed = self.sampling.seed
        generator.manual_seed(seed if seed is not None else torch.seed() % 2**63)
        return generator

    @staticmethod
    def _draw(buffers: StaticBuffers, generator) -> None:
        if buffers.noise is not None:
            buffers.noise.exponential_(generator=generator)

    def close(self) -> None:
        """Give the slots and the decoder back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        self.decoder.end(self._slots)
