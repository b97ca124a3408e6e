"""Meta-parameters of every Triton kernel, in one place.

``block`` sizes are powers of two (Triton's ``tl.arange``); a size larger than the dimension is
masked. ``chunk`` is the sequence length one program of a scan covers before its state is handed
on. The interpreter runs every program instance one after another in Python, so on the CPU the
blocks are as large as the data (fewer instances) and a short sequence is one chunk.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    block_d: int  # channels (Mamba-1) or head-dim rows (Mamba-2) per program
    chunk: int  # positions per program along the sequence
    num_warps: int = 4


# Mamba-1 selective scan: a program holds a (block_d, n) state in registers and walks one chunk.
SELECTIVE_SCAN_GPU = ScanConfig(block_d=32, chunk=256, num_warps=4)
SELECTIVE_SCAN_CPU = ScanConfig(block_d=64, chunk=1 << 30, num_warps=1)
# Mamba-1 / Mamba-2 single-step state update: one (block_d, n) tile per program.
STATE_UPDATE_GPU = ScanConfig(block_d=16, chunk=1, num_warps=4)
STATE_UPDATE_CPU = ScanConfig(block_d=64, chunk=1, num_warps=1)
# Causal conv: (block_d channels) x (chunk positions) per program.
CONV_GPU = ScanConfig(block_d=64, chunk=64, num_warps=4)
CONV_CPU = ScanConfig(block_d=64, chunk=64, num_warps=1)
# SSD (Mamba-2): chunk length of the block decomposition; tl.dot needs blocks >= 16.
SSD_CHUNK_GPU = 64
SSD_CHUNK_CPU = 16
# Matrix products (x @ W^T): tile sizes.
MATMUL_GPU = dict(block_m=64, block_n=64, block_k=32, num_warps=4)
MATMUL_CPU = dict(block_m=16, block_n=64, block_k=64, num_warps=1)
# Attention: query rows and key columns per tile.
ATTENTION_GPU = dict(block_m=64, block_n=64, num_warps=4)
ATTENTION_CPU = dict(block_m=16, block_n=16, num_warps=1)


# Fused decode steps (mixer_steps.py). ``block``: rows of a tile (Mamba-1 channels, Mamba-2
# head-dim rows); ``tile``: the most elements of a Mamba-1 weight tile ((R + 2n) x block for
# x_proj, block x R for dt_proj; the block shrinks to fit: 4096 float32 = 32 registers a thread
# at 4 warps); ``parts``: x_proj partial sums added per step; ``tail``: values per step of the
# Mamba-2 row's last program (the gated norm). ``STEP_PROGRAMS``: a launch is split into at
# least this many programs where the rows allow (``step_rows``): two per SM of an H100 (132
# SMs); the interpreter wants the fewest.
MAMBA_STEP_GPU = dict(block=32, tile=2048, parts=32, num_warps=4)
MAMBA_STEP_CPU = dict(block=64, tile=1 << 14, parts=64, num_warps=1)
SSD_STEP_GPU = dict(block=8, tail=512, num_warps=4)
SSD_STEP_CPU = dict(block=32, tail=256, num_warps=1)
STEP_PROGRAMS_GPU = 264
STEP_PROGRAMS_CPU = 1

# Set while ``aot`` records the launches a model makes: the GPU's meta-parameters apply.
RECORDING_FOR_GPU = False


def pick(device, gpu, cpu):
    """The GPU's or the interpreter's meta-parameters for tensors on ``device``."""
    return gpu if device.type == "cuda" or RECORDING_FOR_GPU else cpu


def rows_block(rows: int, block: int) -> int:
    """Rows per program: 16 for a handful (decode: one row per sequence), else ``block``. Two
    values only, so a model needs two specialisations of a kernel, not one per length."""
    return 16 if rows <= 16 else block


def step_rows(rows: int, block: int, lanes: int, programs: int) -> int:
    """Rows per program of a step kernel over ``lanes`` independent (batch row, head) pairs of
    ``rows`` rows each, in ``block``-row tiles: split until ``programs`` programs are reached,
    never below one tile, so a large batch gets whole lanes per program (no work repeated) and
    batch 1 as many programs as its tiles. A run-time value: one binary serves every batch."""
    tiles = -(-rows // block)
    per_lane = min(tiles, max(1, -(-programs // max(lanes, 1))))
    return block * -(-tiles // per_lane)
