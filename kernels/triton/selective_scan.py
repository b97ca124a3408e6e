"""Triton kernels for ``ssmcc::selective_scan`` — the Mamba-1 selective scan, in tiles along the
sequence.

Math (``ssmcc.ops.selective_scan``), per batch row, channel c and state index i, in float32::

    dt_t      = softplus(delta_t + delta_bias)            (each only when requested)
    h_t[c,i]  = exp(dt_t[c] A[c,i]) h_{t-1}[c,i] + dt_t[c] B_t[i] u_t[c]
    y_t[c]    = sum_i C_t[i] h_t[c,i] + D[c] u_t[c],   out_t = y_t * silu(z_t)

A program owns (batch row, ``BLOCK_D`` channels, one chunk of the sequence) and steps through its
chunk a tile of ``BLOCK_L`` positions at a time. Per tile it loads [BLOCK_L, BLOCK_D] of u, delta
(and z) and [BLOCK_L, BLOCK_N] of B and C, forms the [BLOCK_L, BLOCK_N, BLOCK_D] tiles
``a = exp(dt A)`` and ``b = dt u B``, and runs the recurrence down the tile with
``tl.associative_scan`` (``scan_tiles.linear_recurrence``) from the state carried in from the
previous tile; it sums ``h * C`` over the state to y, stores a [BLOCK_L, BLOCK_D] tile of the
output and carries the tile's last state on. Positions past the chunk's end are masked to
``dt = 0`` (a = 1, b = 0). The tile's axis order puts the channels across a warp's lanes and the
positions and state entries within each thread (``scan_tiles``): the recurrence and the sum over
the state run within threads, each thread walking ``BLOCK_N / 2`` independent recurrences (its
state entries) down the tile.

Chunks: with one chunk (the grid already fills the GPU, or the interpreter) that program is the
whole scan. With several (``configs.scan_chunk_len``: enough programs for every SM at batch 1),
the recurrence is split where it is linear: over chunk ``[t0, t1)`` started from zeros it ends
in ``S_k`` while a state entering it decays by ``exp(A[c,i] sum_t dt_t[c])``, so

    pass 1  chunk_state   S_k = sum_t exp(A (dt_{t+1} + ... + dt_{t1-1})) dt_t u_t B_t, and the
                          chunk's dt sum, for every chunk but the last        (parallel: chunks)
    pass 2  pass_states   h_in[0] = h_{-1};  h_in[k+1] = exp(A dtsum_k) h_in[k] + S_k
                          (sequential over the chunks; (BLOCK_D, BLOCK_N) per program, small)
    pass 3  chunk_scan    every chunk from h_in[k], writing its outputs; the last chunk's
                          program writes ``last_state``                       (parallel: chunks)

Pass 1 needs no scan: per tile it takes the cumulative dt (``tl.cumsum`` of [BLOCK_L, BLOCK_D]),
weighs each position by its decay to the tile's end and sums down the tile.

Grids, cdiv(a, b) = ceil(a / b), K = cdiv(length, chunk_len)::

    chunk_state   (batch, cdiv(dim, BLOCK_D), K - 1)       only when K > 1
    pass_states   (batch, cdiv(dim, BLOCK_D))              only when K > 1
    chunk_scan    (batch, cdiv(dim, BLOCK_D), K)

Memory access, and why it suits a GPU: every load and store of u, delta, z, out, B and C is a 2-D
tile whose contiguous axis the compiler knows (``X_UNIT``, ``BC_UNIT``: the launcher reads the
strides; ``scan_tiles.tile_offsets``): the channel-major ``(b, d, l)`` layout is read along the
sequence, the mixers' position-major views across it, both coalesced (and converted to the compute
layout through shared memory); any other strides run the same code with both strides at run
time. B and C are loaded once per tile for the whole block when the block's channels share a
group (Mamba-1 models have one), else gathered per channel. A program's state stays in registers
for its whole chunk and no intermediate state reaches memory; per element (position, state entry,
channel) the kernel does one exponential (``exp2``, A pre-scaled by log2 e) and a few
multiply-adds, all in float32 whatever the inputs' dtype (16-bit u, delta, B, C, z and out are
widened on load and rounded on store; the state is float32). Block sizes and the chunk count:
``configs.SELECTIVE_SCAN_GPU`` and ``configs.scan_chunk_len``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ssmcc.kernels.triton import configs, scan_tiles
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.runtime import launch, next_power_of_2

LOG2E = tl.constexpr(1.4426950408889634)  # exp(x) = exp2(x log2 e)


@triton.jit
def _selective_scan_chunk_state_kernel(
    # pointers
    u_ptr, delta_ptr, A_ptr, B_ptr, bias_ptr, ends_ptr, dtsum_ptr,
    # sizes
    dim, length, chunk_len, b_channels_per_group, state,
    # strides
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an, s_bb, s_bg, s_bn, s_bl,
    s_eb, s_ek, s_ed, s_en, s_tb, s_tk, s_td,
    # meta-parameters
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    X_UNIT: tl.constexpr, BC_UNIT: tl.constexpr, BC_SHARED: tl.constexpr,
    HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
):
    b = tl.program_id(0)
    k = tl.program_id(2)
    d0 = tl.program_id(1) * BLOCK_D
    d = d0 + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask_n = n < state
    mask_nd = mask_n[:, None] & mask_d[None, :]
    A = tl.load(A_ptr + n[:, None] * s_an + d[None, :] * s_ad, mask=mask_nd, other=0.0)
    A = A.to(tl.float32) * LOG2E  # [n, d]
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)  # not read (HAS_BIAS)
    u_offs, s_ul = scan_tiles.tile_offsets(d, s_ul, s_ud, X_UNIT, BLOCK_L)
    dt_offs, s_dl = scan_tiles.tile_offsets(d, s_dl, s_dd, X_UNIT, BLOCK_L)
    b_offs, b_groups, s_bl = scan_tiles.group_tile_offsets(
        d0, d, n, b_channels_per_group, s_bg, s_bl, s_bn, BC_UNIT, BLOCK_L, BC_SHARED
    )
    h = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    dtsum = tl.zeros((BLOCK_D,), dtype=tl.float32)
    t0 = k * chunk_len
    t1 = tl.minimum(t0 + chunk_len, length)
    u_ptr += b * s_ub + t0 * s_ul  # the tile's first position, then the next tile's
    delta_ptr += b * s_db + t0 * s_dl
    B_ptr += b * s_bb + t0 * s_bl
    s_ul, s_dl, s_bl = BLOCK_L * s_ul, BLOCK_L * s_dl, BLOCK_L * s_bl  # a tile's step
    for start in range(t0, t1, BLOCK_L):
        mask_l = start + tl.arange(0, BLOCK_L) < t1
        mask_x = mask_l[:, None] & mask_d[None, :]
        u, dt = scan_tiles.load_inputs_tile(
            u_ptr + u_offs, delta_ptr + dt_offs, bias, mask_x, HAS_BIAS, SOFTPLUS
        )
        Bt = scan_tiles.load_group_tile(
            B_ptr, b_offs, b_groups, mask_l, mask_n, mask_d, BC_SHARED
        )
        total = tl.sum(dt, axis=0)
        after = total[None, :] - tl.cumsum(dt, axis=0)  # dt summed over the tile's later positions
        decay = tl.exp2(A[None, :, :] * after[:, None, :])
        inflow = tl.sum(decay * (dt * u)[:, None, :] * Bt, axis=0)
        h = tl.exp2(A * total[None, :]) * h + inflow
        dtsum += total
        u_ptr += s_ul
        delta_ptr += s_dl
        B_ptr += s_bl
    tl.store(
        ends_ptr + b * s_eb + k * s_ek + n[:, None] * s_en + d[None, :] * s_ed, h, mask=mask_nd
    )
    tl.store(dtsum_ptr + b * s_tb + k * s_tk + d * s_td, dtsum, mask=mask_d)


@triton.jit
def _selective_scan_pass_states_kernel(
    ends_ptr, dtsum_ptr, A_ptr, h0_ptr, starts_ptr,
    dim, state, chunks,
    s_eb, s_ek, s_ed, s_en, s_tb, s_tk, s_td, s_ad, s_an, s_hb, s_hd, s_hn,
    s_sb, s_sk, s_sd, s_sn,
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, HAS_H0: tl.constexpr,
):
    b = tl.program_id(0)
    d = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask_dn = mask_d[:, None] & (n[None, :] < state)
    A = tl.load(A_ptr + d[:, None] * s_ad + n[None, :] * s_an, mask=mask_dn, other=0.0)
    A = A.to(tl.float32) * LOG2E
    if HAS_H0:
        h = tl.load(
            h0_ptr + b * s_hb + d[:, None] * s_hd + n[None, :] * s_hn, mask=mask_dn, other=0.0
        ).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_D, BLOCK_N), dtype=tl.float32)
    starts = starts_ptr + b * s_sb + d[:, None] * s_sd + n[None, :] * s_sn
    for k in range(0, chunks - 1):
        tl.store(starts + k * s_sk, h, mask=mask_dn)
        dtsum = tl.load(dtsum_ptr + b * s_tb + k * s_tk + d * s_td, mask=mask_d, other=0.0)
        end = tl.load(ends_ptr + b * s_eb + k * s_ek + d[:, None] * s_ed + n[None, :] * s_en,
                      mask=mask_dn, other=0.0)
        h = tl.exp2(A * dtsum[:, None]) * h + end
    tl.store(starts + (chunks - 1) * s_sk, h, mask=mask_dn)


@triton.jit
def _selective_scan_chunk_scan_kernel(
    # pointers
    u_ptr, delta_ptr, A_ptr, B_ptr, C_ptr, D_ptr, z_ptr, bias_ptr, start_ptr, out_ptr, last_ptr,
    # sizes
    dim, length, chunk_len, b_channels_per_group, c_channels_per_group, state,
    # strides
    s_ub, s_ud, s_ul, s_db, s_dd, s_dl, s_ad, s_an,
    s_bb, s_bg, s_bn, s_bl, s_cb, s_cg, s_cn, s_cl, s_zb, s_zd, s_zl,
    s_hb, s_hk, s_hd, s_hn, s_ob, s_od, s_ol, s_lb, s_ld, s_ln,
    # meta-parameters
    BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    X_UNIT: tl.constexpr, BC_UNIT: tl.constexpr, BC_SHARED: tl.constexpr,
    HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr,
    HAS_START: tl.constexpr,
):
    b = tl.program_id(0)
    k = tl.program_id(2)
    d0 = tl.program_id(1) * BLOCK_D
    d = d0 + tl.arange(0, BLOCK_D)
    n = tl.arange(0, BLOCK_N)
    mask_d = d < dim
    mask_n = n < state
    mask_nd = mask_n[:, None] & mask_d[None, :]
    A = tl.load(A_ptr + n[:, None] * s_an + d[None, :] * s_ad, mask=mask_nd, other=0.0)
    A = A.to(tl.float32) * LOG2E  # [n, d]
    if HAS_START:
        h = tl.load(
            start_ptr + b * s_hb + k * s_hk + n[:, None] * s_hn + d[None, :] * s_hd,
            mask=mask_nd, other=0.0,
        ).to(tl.float32)
    else:
        h = tl.zeros((BLOCK_N, BLOCK_D), dtype=tl.float32)
    if HAS_D:
        skip = tl.load(D_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    if HAS_BIAS:
        bias = tl.load(bias_ptr + d, mask=mask_d, other=0.0).to(tl.float32)
    else:
        bias = tl.zeros((BLOCK_D,), dtype=tl.float32)  # not read (HAS_BIAS)
    u_offs, s_ul = scan_tiles.tile_offsets(d, s_ul, s_ud, X_UNIT, BLOCK_L)
    dt_offs, s_dl = scan_tiles.tile_offsets(d, s_dl, s_dd, X_UNIT, BLOCK_L)
    z_offs, s_zl = scan_tiles.tile_offsets(d, s_zl, s_zd, X_UNIT, BLOCK_L)
    out_offs, s_ol = scan_tiles.tile_offsets(d, s_ol, s_od, X_UNIT, BLOCK_L)
    b_offs, b_groups, s_bl = scan_tiles.group_tile_offsets(
        d0, d, n, b_channels_per_group, s_bg, s_bl, s_bn, BC_UNIT, BLOCK_L, BC_SHARED
    )
    c_offs, c_groups, s_cl = scan_tiles.group_tile_offsets(
        d0, d, n, c_channels_per_group, s_cg, s_cl, s_cn, BC_UNIT, BLOCK_L, BC_SHARED
    )
    t0 = k * chunk_len
    t1 = tl.minimum(t0 + chunk_len, length)
    u_ptr += b * s_ub + t0 * s_ul  # the tile's first position, then the next tile's
    delta_ptr += b * s_db + t0 * s_dl
    z_ptr += b * s_zb + t0 * s_zl
    out_ptr += b * s_ob + t0 * s_ol
    B_ptr += b * s_bb + t0 * s_bl
    C_ptr += b * s_cb + t0 * s_cl
    s_ul, s_dl, s_zl = BLOCK_L * s_ul, BLOCK_L * s_dl, BLOCK_L * s_zl  # a tile's step
    s_ol, s_bl, s_cl = BLOCK_L * s_ol, BLOCK_L * s_bl, BLOCK_L * s_cl
    for start in range(t0, t1, BLOCK_L):
        mask_l = start + tl.arange(0, BLOCK_L) < t1
        mask_x = mask_l[:, None] & mask_d[None, :]
        u, dt = scan_tiles.load_inputs_tile(
            u_ptr + u_offs, delta_ptr + dt_offs, bias, mask_x, HAS_BIAS, SOFTPLUS
        )
        Bt = scan_tiles.load_group_tile(
            B_ptr, b_offs, b_groups, mask_l, mask_n, mask_d, BC_SHARED
        )
        hs, h = scan_tiles.linear_recurrence(  # [l, n, d], and its last row
            tl.exp2(A[None, :, :] * dt[:, None, :]), (dt * u)[:, None, :] * Bt, h, BLOCK_L
        )
        Ct = scan_tiles.load_group_tile(
            C_ptr, c_offs, c_groups, mask_l, mask_n, mask_d, BC_SHARED
        )
        y = tl.sum(hs * Ct, axis=1)  # [l, d]
        if HAS_D:
            y = y + skip[None, :] * u
        if HAS_Z:
            z = tl.load(z_ptr + z_offs, mask=mask_x, other=0.0).to(tl.float32)
            y = y * z / (1.0 + tl.exp(-z))
        tl.store(out_ptr + out_offs, y.to(out_ptr.dtype.element_ty), mask=mask_x)
        u_ptr += s_ul
        delta_ptr += s_dl
        z_ptr += s_zl
        out_ptr += s_ol
        B_ptr += s_bl
        C_ptr += s_cl
    if k == tl.num_programs(2) - 1:
        tl.store(
            last_ptr + b * s_lb + n[:, None] * s_ln + d[None, :] * s_ld, h, mask=mask_nd
        )


def _bkdn(t: torch.Tensor) -> tuple[int, ...]:
    """Strides of a (batch, chunk, state, dim) buffer in the kernels' (b, k, d, n) order."""
    return t.stride(0), t.stride(1), t.stride(3), t.stride(2)


def _sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return configs.DEFAULT_SMS


def _layouts(u, delta, z, out, B, C, dim: int, block_d: int) -> dict:
    """The tiles' contiguous axes (``scan_tiles.unit_axis``) and whether each block of channels
    reads a single group of B and C."""
    planes = [t for t in (u, delta, z, out) if t is not None]
    x_unit = scan_tiles.unit_axis([(t.stride(2), t.shape[2], t.stride(1), dim) for t in planes])
    bc_unit = scan_tiles.unit_axis([(t.stride(3), t.shape[3], t.stride(2), t.shape[2])
                                    for t in (B, C)])
    shared = all(t.shape[1] == 1 or (dim // t.shape[1]) % block_d == 0 for t in (B, C))
    return dict(X_UNIT=x_unit, BC_UNIT=bc_unit, BC_SHARED=shared)


@launcher("selective_scan")
def selective_scan_fwd(
    u: torch.Tensor,
    delta: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    delta_bias: torch.Tensor | None = None,
    delta_softplus: bool = False,
    initial_state: torch.Tensor | None = None,
    chunk: int | None = None,
    out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``selective_scan`` on Triton. u, delta, z (b, d, l); A (d, n); B, C (b, n, l) or
    (b, g, n, l); D, delta_bias (d,); initial_state (b, d, n) -> (out (b, d, l) dtype of u,
    last_state (b, d, n) float32). Any strides (coalesced where every (b, d, l) tensor is
    contiguous along l, or every one along d; B and C likewise along l or n). ``chunk``:
    positions per chunk (default: ``configs``); ``out``: write the output there (any strides,
    its dtype)."""
    batch, dim, length = u.shape
    state = A.shape[1]
    B = B.unsqueeze(1) if B.dim() == 3 else B  # shared by every channel: one group
    C = C.unsqueeze(1) if C.dim() == 3 else C
    config = configs.pick(u.device, configs.SELECTIVE_SCAN_GPU, configs.SELECTIVE_SCAN_CPU)
    block_d = min(config.block_d, next_power_of_2(dim))
    block_n = next_power_of_2(state)
    d_blocks = -(-dim // block_d)
    if out is None:
        out = torch.empty((batch, dim, length), dtype=u.dtype, device=u.device)
    last = torch.empty((batch, dim, state), dtype=torch.float32, device=u.device)
    if batch == 0:
        return out, last
    if chunk is None:
        chunk = config.chunk or configs.scan_chunk_len(
            length, batch * d_blocks, _sms(u.device), config
        )
    block_l = min(config.block_l, next_power_of_2(chunk))  # a tile no longer than a chunk
    chunk = max(1, min(chunk, length))
    chunks = max(1, -(-length // chunk))
    meta = dict(
        BLOCK_D=block_d, BLOCK_N=block_n, BLOCK_L=block_l,
        **_layouts(u, delta, z, out, B, C, dim, block_d),
        HAS_BIAS=delta_bias is not None, SOFTPLUS=bool(delta_softplus),
        num_warps=config.num_warps,
    )
    bias = delta_bias if delta_bias is not None else A
    h0 = initial_state if initial_state is not None else last
    start, start_strides = h0, (h0.stride(0), 0, h0.stride(1), h0.stride(2))
    if chunks > 1:  # chunk states (b, k, n, d): channels contiguous, as the programs hold them
        ends = torch.empty((batch, chunks - 1, state, dim), dtype=torch.float32, device=u.device)
        dtsum = torch.empty((batch, chunks - 1, dim), dtype=torch.float32, device=u.device)
        start = torch.empty((batch, chunks, state, dim), dtype=torch.float32, device=u.device)
        start_strides = _bkdn(start)
        launch(_selective_scan_chunk_state_kernel, (batch, d_blocks, chunks - 1))(
            u, delta, A, B, bias, ends, dtsum,
            dim, length, chunk, dim // B.shape[1], state,
            *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *_bkdn(ends),
            *dtsum.stride(), **meta,
        )
        launch(_selective_scan_pass_states_kernel, (batch, d_blocks))(
            ends, dtsum, A, h0, start,
            dim, state, chunks, *_bkdn(ends), *dtsum.stride(), *A.stride(), *h0.stride(),
            *start_strides,
            BLOCK_D=block_d, BLOCK_N=block_n, HAS_H0=initial_state is not None,
            num_warps=config.num_warps,
        )
    launch(_selective_scan_chunk_scan_kernel, (batch, d_blocks, chunks))(
        u, delta, A, B, C, D if D is not None else A, z if z is not None else u, bias, start,
        out, last,
        dim, length, chunk, dim // B.shape[1], dim // C.shape[1], state,
        *u.stride(), *delta.stride(), *A.stride(), *B.stride(), *C.stride(),
        *(z.stride() if z is not None else (0, 0, 0)), *start_strides, *out.stride(),
        *last.stride(),
        HAS_D=D is not None, HAS_Z=z is not None,
        HAS_START=chunks > 1 or initial_state is not None, **meta,
    )
    return out, last
