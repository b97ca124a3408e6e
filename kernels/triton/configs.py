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


# Set while ``aot`` records the launches a model makes: the GPU's meta-parameters apply.
RECORDING_FOR_GPU = False


def pick(device, gpu, cpu):
    """The GPU's or the interpreter's meta-parameters for tensors on ``device``."""
    return gpu if device.type == "cuda" or RECORDING_FOR_GPU else cpu


def rows_block(rows: int, block: int) -> int:
    """Rows per program: 16 for a handful (decode: one row per sequence), else ``block``. Two
    values only, so a model needs two specialisations of a kernel, not one per length."""
    return 16 if rows <= 16 else block
