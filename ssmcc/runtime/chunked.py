"""Chunked prefill: the fold over chunks that ``chunk_state_passing`` prepares, for every target.

``run_chunks`` feeds ``ids[:, j*c : (j+1)*c]`` and the previous chunk's states to a runner's
chunk function, so a prompt of any length needs the activation memory of one chunk. With a
``PrefixCache`` it first restores the state of the longest chunk-aligned prefix the cache holds
for every row, then stores the state at each later chunk boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ssmcc.runtime.prefix_cache import PrefixCache

ChunkFn = Callable[[torch.Tensor, list[torch.Tensor]], tuple[torch.Tensor, list[torch.Tensor]]]


def restore_prefix(
    cache: PrefixCache, model_id: str, ids: torch.Tensor, chunk_size: int
) -> tuple[int, list[torch.Tensor] | None, torch.Tensor | None]:
    """The longest chunk-aligned prefix cached for every row: (length, states, last logits)."""
    length = ids.shape[1]
    for k in range(length // chunk_size * chunk_size, 0, -chunk_size):
        entries = []
        for row in ids:
            entry = cache.get(model_id, row[:k])
            if entry is None:
                break
            entries.append(entry)
        else:
            states = [torch.cat(parts) for parts in zip(*(e.states for e in entries), strict=True)]
            return k, states, torch.stack([e.last_logits for e in entries])
    return 0, None, None


def run_chunks(
    run_chunk: ChunkFn,
    ids: torch.Tensor,
    states: list[torch.Tensor],
    chunk_size: int,
    cache: PrefixCache | None = None,
    model_id: str = "",
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Run ``ids`` chunk by chunk from ``states``; returns (each chunk's logits, final states).

    With ``cache`` (states must then be the zero state): rows restart from their longest cached
    chunk-aligned prefix; the first element of the returned logits is then the cached last-token
    logits (b, vocab) of that prefix, and every full chunk's end state is stored.
    """
    outputs: list[torch.Tensor] = []
    start = 0
    if cache is not None:
        start, cached_states, cached_logits = restore_prefix(cache, model_id, ids, chunk_size)
        if cached_states is not None and cached_logits is not None:
            states, outputs = cached_states, [cached_logits]
    for begin in range(start, ids.shape[1], chunk_size):
        chunk = ids[:, begin : begin + chunk_size]
        logits, states = run_chunk(chunk, states)
        outputs.append(logits)
        end = begin + chunk.shape[1]
        if cache is not None and end % chunk_size == 0:
            last = logits if logits.dim() == 2 else logits[:, -1]
            for row in range(ids.shape[0]):
                cache.put(model_id, ids[row, :end], [s[row : row + 1] for s in states], last[row])
    return outputs, states
