"""Meta-parameters of every Triton kernel, in one place.

``block`` sizes are powers of two (Triton's ``tl.arange``); a size larger than the dimension is
masked. ``chunk`` is the sequence length one program of a scan covers before its state is handed
on. The interpreter runs every program instance one after another in Python, so on the CPU the
blocks are as large as the data (fewer instances) and a short sequence is one chunk.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class ScanConfig:
    block_d: int  # channels (Mamba-1) or head-dim rows (Mamba-2) per program
    chunk: int  # positions per program along the sequence
    num_warps: int = 4


@dataclasses.dataclass(frozen=True)
class SelectiveScanConfig:
    """Mamba-1 selective scan (``selective_scan.py``): a program owns ``block_d`` channels of one
    chunk of the sequence and steps through it a [block_d, n, block_l] tile at a time."""

    block_d: int  # channels per program
    block_l: int  # positions per tile (one associative scan in registers)
    num_warps: int
    chunk: int = 0  # positions per chunk; 0: ``scan_chunk_len`` picks it for the GPU
    programs_per_sm: int = 1  # programs an SM holds at once at this config's registers
    min_chunk: int = 1  # the shortest chunk worth a program of its own (positions)


# sm_90, by registers (``ptxas -v``; mamba-130m / 2.8b shapes, fp32 and bf16, channel- and
# position-major): one warp holds 16 channels across its lanes (x 2 lanes of the state) and, per
# thread, 8 state entries x 4 positions of the [4, 16, 16] tile, so the recurrence and the sum
# over the state stay within threads (~14 SASS instructions per element, one of them the exp2).
# chunk_scan 108-144 registers, chunk_state 77-147, pass_states 96, no spills (sm_80 alike): an
# SM fits 13 such programs; 8 are asked for (two warps per scheduler, each thread walking 8
# independent recurrences), as each chunk beyond one costs a chunk_state pass (~0.7 of a scan).
# Measured against: block_l 8 (up to 247 registers), block_l 16 (255, spills); 4-warp programs
# (the state across warps: shared-memory reductions, 17-20 instructions per element).
SELECTIVE_SCAN_GPU = SelectiveScanConfig(
    block_d=16, block_l=4, num_warps=1, programs_per_sm=8, min_chunk=128
)
SELECTIVE_SCAN_CPU = SelectiveScanConfig(block_d=64, block_l=16, num_warps=1, chunk=1 << 30)
# The GPU the scan's chunks are sized for when no device is at hand (recording launches for an
# ahead-of-time build): an H100 SXM's streaming multiprocessors.
DEFAULT_SMS = 132
# Mamba-1 / Mamba-2 single-step state update: one (block_d, n) tile per program.
STATE_UPDATE_GPU = ScanConfig(block_d=16, chunk=1, num_warps=4)
STATE_UPDATE_CPU = ScanConfig(block_d=64, chunk=1, num_warps=1)
# Causal conv: (block_d channels) x (chunk positions) per program.
CONV_GPU = ScanConfig(block_d=64, chunk=32, num_warps=4)
CONV_CPU = ScanConfig(block_d=64, chunk=64, num_warps=1)


@dataclasses.dataclass(frozen=True)
class DotTile:
    """A kernel's share of a matrix product: a (block_m x block_n) output tile per program, summed
    over block_k at a time. Each block is a cap: the launcher uses ``max(16, min(cap,
    next_power_of_2(size)))`` of the dimension it tiles (``tl.dot`` needs 16 and more)."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 3  # software-pipelined loads in flight (tensor-core products)


@dataclasses.dataclass(frozen=True)
class SsdConfig:
    """SSD (Mamba-2, ``ssd_scan.py``): the chunk length Q of the block decomposition and each
    kernel's tiles (m x n, summed over k):

        chunk_state   head_dim x state, over the chunk's positions
        bmm           chunk x chunk (C_t . B_s), over the state
        chunk_scan    chunk rows x head_dim, over the state (the entering state), then over the
                      chunk's earlier positions

    Float32 operands take twice a 16-bit operand's registers and shared memory: their k block is
    capped (``tf32_block_k`` on TF32 tensor cores, ``fma_block_k`` for IEEE products, Triton's
    FMA dot, which also runs ``fma_stages`` stages); ``num_warps`` is chunk_cumsum's and
    state_passing's.
    """

    chunk: int
    cumsum_heads: int  # heads per chunk_cumsum program (dt is head-contiguous)
    chunk_state: DotTile
    bmm: DotTile
    chunk_scan: DotTile
    passing_block: int  # state elements (of head_dim x state) per state_passing program
    tf32_block_k: int = 32
    fma_block_k: int = 16
    fma_stages: int = 1
    num_warps: int = 4


# SSD on the GPU, chosen for sm_90 (H100/H200). Chunk 256, the chunk_size of the Mamba-2
# checkpoints (the result does not depend on it). 64 x 64 tiles of 4 warps: one warpgroup, m64
# wgmma on sm_90 (mma.sync m16n8k16 on sm_80..89); for mamba2-130m / 2.7b (head_dim 64, state
# 128) a (chunk, head) is 2 chunk_state and 4 chunk_scan programs, so L=2048 at batch 1 launches
# 384 / 768 programs (2.7b: 1280 / 2560) for 132 SMs. Three stages keep the next two k-steps'
# tiles in flight. ``ptxas -v`` (triton 3.9, ptxas 13.4 for sm_90 and 12.9 for sm_8x; the
# specialisation Triton's JIT makes: unit strides constant, 16-divisible sizes and pointers
# marked; mamba2-130m and 2.7b compile to the same binaries), registers / shared bytes on sm_90,
# no spills on sm_80, sm_86, sm_89 or sm_90 (tests/test_triton_ssd.py, slow, checks):
#     bf16 / fp16 (wgmma)   chunk_state 91 / 50,176   bmm 71 / 49,152   chunk_scan 169 / 66,560
#     fp32 TF32 (wgmma)     chunk_state 72 / 49,664   bmm 71 / 49,152   chunk_scan 163 / 49,664
#     fp32 IEEE (FMA)       chunk_state 92 / 8,192    bmm 128 / 8,192   chunk_scan 168 / 8,192
#     chunk_cumsum 71 / 8,192, state_passing 28 / 0 (sm_8x: at most 204 registers, 58,368 B)
# Float32 operands at k 64 spill: TF32's chunk_scan on sm_8x (up to 92 B), the FMA dot (3 stages:
# up to 7.6 KB on sm_90; 1 stage: 1.7 KB on sm_80, and 32 B there at k 32): hence tf32_block_k 32,
# fma_block_k 16, fma_stages 1. Other architectures: the stages are as many as fit the per-block
# shared memory (sm_90 227 KB, sm_80 163 KB, sm_86/sm_89 99 KB); every binary above needs at most
# 66,560 B, so these tiles serve sm_80..sm_90 alike, as ``ssmcc kernels build`` needs (it
# compiles one specialisation for every architecture). A larger sm_90-only tile must come with its
# own sm_86/89 variant.
SSD_GPU = SsdConfig(
    chunk=256,
    cumsum_heads=8,
    chunk_state=DotTile(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3),
    bmm=DotTile(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3),
    chunk_scan=DotTile(block_m=64, block_n=64, block_k=64, num_warps=4, num_stages=3),
    passing_block=512,
    tf32_block_k=32,
    fma_block_k=16,
    fma_stages=1,
)
# The interpreter: short chunks (several per test sequence) and tiles as large as the data.
SSD_CPU = SsdConfig(
    chunk=16,
    cumsum_heads=64,
    chunk_state=DotTile(block_m=128, block_n=256, block_k=256, num_warps=1),
    bmm=DotTile(block_m=256, block_n=256, block_k=256, num_warps=1),
    chunk_scan=DotTile(block_m=256, block_n=128, block_k=256, num_warps=1),
    passing_block=1 << 16,
    num_warps=1,
)
# Matrix products (x @ W^T): tile sizes, by the dot's operands (16-bit: tensor cores; float32:
# IEEE FMAs with their operands in registers, where 32 inputs a step spill at sm_90).
MATMUL_GPU = dict(block_m=64, block_n=64, block_k=32, num_warps=4)
MATMUL_F32_GPU = dict(block_m=64, block_n=64, block_k=16, num_warps=8)
MATMUL_CPU = dict(block_m=16, block_n=64, block_k=64, num_warps=1)
# Attention prefill (attention.py): query rows and key columns per tile. 16-bit operands run on
# tensor cores: (64, 64) tiles for head dims up to 64, 32 keys a step for wider heads (128: 64
# keys spill at sm_90). float32 (IEEE products as FMAs, operands in registers) takes 32 keys a
# step at 8 warps: 64 keys reach 255 registers at head dim 64 and spill at 128.
ATTENTION_GPU = dict(block_m=64, block_n=64, num_warps=4)
ATTENTION_WIDE_GPU = dict(block_m=64, block_n=32, num_warps=4)
ATTENTION_F32_GPU = dict(block_m=64, block_n=32, num_warps=8)
ATTENTION_CPU = dict(block_m=16, block_n=16, num_warps=1)
# Attention decode (split keys): ``block_m`` query rows of a K/V head's group per program
# (``rows_block``), ``block_n`` keys per step, splits of at least ``split`` keys until about
# ``programs`` programs (two per H100 SM), ``block_s`` splits per step of the combine. float32
# takes 8 warps (4 spill at head dim 128). The interpreter's small blocks and target still
# split a 38-key cache 2-3 ways (the tests).
ATTENTION_DECODE_GPU = dict(
    block_m=64, block_n=32, split=128, programs=264, block_s=32, num_warps=4, combine_warps=2
)
ATTENTION_DECODE_F32_GPU = dict(ATTENTION_DECODE_GPU, num_warps=8)
ATTENTION_DECODE_CPU = dict(
    block_m=16, block_n=16, split=16, programs=16, block_s=4, num_warps=1, combine_warps=1
)
# MoE experts (moe_experts.py). Decode (a pair per program row, matrix-vector): ``block_w`` rows
# of the up projection, ``block_d`` of the down one, ``block_k`` inputs per step (128 inputs at
# 4 warps reach 255 registers and spill at sm_90). Prefill (the grouped GEMM): ``block_m`` pairs
# of one expert per tile (16 while the experts average 16 pairs or fewer: ``rows_block``),
# ``block_w`` / ``block_d`` output columns (``block_w_dequantised`` where the up weights are
# dequantised in float32 before the product: the scale tile spills at 64), ``block_k`` inputs
# per step; ``route``: one-hot elements per step of the routing pass. float32 (IEEE products as
# FMAs) takes 8 warps and 16 inputs a step for its tiles to fit in registers.
MOE_DECODE_GPU = dict(block_w=64, block_d=64, block_k=64, num_warps=8)
MOE_DECODE_CPU = dict(block_w=64, block_d=64, block_k=128, num_warps=1)
MOE_GROUPED_GPU = dict(block_m=64, block_w=64, block_w_dequantised=32, block_d=64, block_k=64,
                       route=4096, num_warps=8, sum_warps=4)
MOE_GROUPED_F32_GPU = dict(MOE_GROUPED_GPU, block_k=16)
MOE_GROUPED_CPU = dict(block_m=16, block_w=64, block_w_dequantised=64, block_d=64, block_k=64,
                       route=1024, num_warps=1, sum_warps=1)
# The K/V cache copy: (positions, head dim) tiles of ``elements`` (32 positions at head dim 64,
# 16 at 128; 32 x 128 16-bit tiles spill at sm_90).
APPEND_CACHE_GPU = dict(elements=2048, num_warps=4)
APPEND_CACHE_CPU = dict(elements=1 << 14, num_warps=1)


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


def ssd_config(device) -> SsdConfig:
    """The SSD tiles for tensors on ``device``: ``SSD_GPU`` on every CUDA GPU (and while ``aot``
    records), ``SSD_CPU`` in the interpreter. ``SSD_GPU``'s note says why one set serves
    sm_80..sm_90."""
    return pick(device, SSD_GPU, SSD_CPU)


def dot16(device, *dtypes) -> bool:
    """Whether ``tl.dot`` takes 16-bit operands (tensor cores, float32 accumulation) for inputs of
    ``dtypes``: all float16, or all bfloat16 (int8 weights, exact in both, go with either).
    Anything else multiplies in IEEE float32. The interpreter (numpy) has no bfloat16 product,
    so there bfloat16 is widened to float32, the values the same, the rounding of a 16-bit
    operand (attention's softmax weights, the experts' activations) not modelled."""
    wide = [d for d in dtypes if d != torch.int8]
    if not wide or wide.count(wide[0]) != len(wide):
        return False
    if wide[0] == torch.bfloat16:
        return device.type == "cuda" or RECORDING_FOR_GPU
    return wide[0] == torch.float16


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


def scan_chunk_len(length: int, programs: int, sms: int, config: SelectiveScanConfig) -> int:
    """Positions per chunk of the selective scan on a GPU with ``sms`` multiprocessors, where one
    chunk per sequence makes ``programs`` programs (batch x channel blocks).

    A program's walk along its chunk is serial, so the grid should hold one wave of resident
    programs: ``sms * programs_per_sm``. Fewer leave SMs idle (mamba-130m at batch 1: 1536 / 16
    = 96 one-warp programs for 132 SMs); splitting the sequence into chunks multiplies the
    programs, and costs a pass over every chunk but the last that computes its end state from
    zeros (~0.7 of a scan's instructions: no C, z or output) plus a small sequential pass over
    the chunk states. So:
    ``ceil(sms * programs_per_sm / programs)`` chunks, no more than ``length / min_chunk``, each a
    whole number of tiles. On 132 SMs at L 2048: mamba-130m (d 1536, 96 channel blocks) at batch
    1 takes 11 chunks of 188, mamba-2.8b (d 5120, 320 blocks) 4 of 512; from batch 11 (130m) or 4
    (2.8b) on, one chunk."""
    wanted = -(-sms * config.programs_per_sm // max(programs, 1))
    chunks = max(1, min(wanted, length // config.min_chunk))
    chunk = -(-length // chunks)
    return max(config.block_l, -(-chunk // config.block_l) * config.block_l)
