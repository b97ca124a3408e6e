"""Device functions for kernels that read a sequence in tiles: a program loads a [BLOCK_L, cols]
tile of a (length, cols) plane at once (cols: channels, or the state index of B and C) instead of
one position at a time, and runs a first-order linear recurrence down the tile in registers.

Tiles are position-major in registers: the sequence is axis 0 ([BLOCK_L, BLOCK_N, BLOCK_D] for
the Mamba-1 scan). Triton's default layout spreads a tensor's last axis over a warp's lanes and
keeps the leading axes within each thread, so the channels go across lanes and each thread holds
its channels' positions and state entries: the recurrence and the reduction over the state run
within a thread (no shuffles), as in mamba_ssm's CUDA scan, whose threads own consecutive
positions and loop over the state.

``tile_offsets(c, s_l, s_c, UNIT, BLOCK_L)``: the element offsets of a plane's [BLOCK_L, c] tile
(computed once; a program moves it along by a scalar), with the stride of the ``UNIT`` axis the
literal 1: ``ALONG`` the sequence (channel-major ``(b, d, l)`` tensors), ``ACROSS`` it (the mixers'
position-major ``(b, l, d)`` views), ``NEITHER`` (both strides stay run-time values). The compiler
then knows which axis of the tile's addresses is contiguous and lays the load's threads (and
vector widths) along it: the load is coalesced whichever way the tensor lies, and converted to
the compute layout through shared memory. With ``NEITHER`` the load is correct and its
coalescing left to chance. ``unit_axis`` picks ``UNIT`` from the strides.

``group_tile_offsets`` / ``load_group_tile``: the same for the [BLOCK_L, n] tile of B or C read by
a block of channels (grouped: channel c reads group ``c // per_group``): one tile broadcast over
the block when its channels share a group, else one per channel.

``load_inputs_tile``: a tile of u and of the discretisation step dt = softplus?(delta + bias).

``linear_recurrence(a, b, h0, BLOCK_L)``: every ``h_t = a_t h_{t-1} + b_t`` down axis 0 of
(a, b) from ``h0``, by ``tl.associative_scan`` over the pairs with ``(a1, b1) then (a2, b2) =
(a1 a2, a2 b1 + b2)``, and the last state. A position with ``a = 1, b = 0`` (masked) keeps the
state, so the last row is the state after the tile's last real position.
"""

from __future__ import annotations

import triton
import triton.language as tl

NEITHER = tl.constexpr(0)
ACROSS = tl.constexpr(1)
ALONG = tl.constexpr(2)


def unit_axis(planes: list[tuple[int, int, int, int]]) -> int:
    """``ALONG``, ``ACROSS`` or ``NEITHER`` for planes given as (stride along the sequence,
    length, stride across, width): the axis along which every one of them has stride 1. An axis
    of size one counts as contiguous; the sequence is preferred when both qualify and only the
    sequence is longer than one."""
    along = all(s_l == 1 or n_l == 1 for s_l, n_l, _, _ in planes)
    across = all(s_c == 1 or n_c == 1 for _, _, s_c, n_c in planes)
    if along and (not across or all(n_c == 1 for _, _, _, n_c in planes)):
        return ALONG.value
    return ACROSS.value if across else NEITHER.value


@triton.jit
def tile_offsets(c, s_l, s_c, UNIT: tl.constexpr, BLOCK_L: tl.constexpr):
    """Offsets of the [BLOCK_L, c] tile at position 0 of a plane with strides (s_l, s_c), the
    stride of the ``UNIT`` axis the literal 1; and the stride that moves the tile along."""
    if UNIT == ALONG:
        s_l = 1
    elif UNIT == ACROSS:
        s_c = 1
    return tl.arange(0, BLOCK_L)[:, None] * s_l + c[None, :] * s_c, s_l


@triton.jit
def group_tile_offsets(
    d0, d, n, per_group, s_g, s_l, s_n,
    UNIT: tl.constexpr, BLOCK_L: tl.constexpr, SHARED: tl.constexpr,
):
    """``tile_offsets`` of the [BLOCK_L, n] tile of the group of a (g, l, n) plane that each
    channel reads: that of the block's group (its first channel ``d0``) when the block lies in one
    (``SHARED``), else the group's offset per channel apart ([d]: added as the tile is loaded,
    so the program holds no [BLOCK_L, n, d] offsets); and the stride along the sequence."""
    offsets, s_l = tile_offsets(n, s_l, s_n, UNIT, BLOCK_L)
    if SHARED:
        offsets += (d0 // per_group) * s_g
        groups = 0
    else:
        groups = (d // per_group) * s_g
    return offsets, groups, s_l


@triton.jit
def load_group_tile(ptr, offsets, groups, mask_l, mask_n, mask_d, SHARED: tl.constexpr):
    """The tile at ``group_tile_offsets``' offsets from ``ptr``, float32, to broadcast against
    [BLOCK_L, n, d]: [BLOCK_L, n, 1] (loaded as [BLOCK_L, n], so the 3-D computation keeps its
    own layout) or [BLOCK_L, n, d]."""
    if SHARED:
        tile = tl.load(ptr + offsets, mask=mask_l[:, None] & mask_n[None, :], other=0.0)
        tile = tile[:, :, None]
    else:  # a gather: its offsets, masked, tell the compiler of no contiguous axis (it would
        # lay the load's threads along one and make that the 3-D computation's layout)
        mask = mask_l[:, None, None] & mask_n[None, :, None] & mask_d[None, None, :]
        gather = tl.where(mask, offsets[:, :, None] + groups[None, None, :], 0)
        tile = tl.load(ptr + gather, mask=mask, other=0.0)
    return tile.to(tl.float32)


@triton.jit
def load_inputs_tile(u_ptrs, dt_ptrs, bias, mask, HAS_BIAS: tl.constexpr, SOFTPLUS: tl.constexpr):
    """The [BLOCK_L, BLOCK_D] tiles of u and of dt = softplus?(delta + bias) in float32, dt 0
    outside ``mask`` (a masked position then leaves the state as it is)."""
    u = tl.load(u_ptrs, mask=mask, other=0.0).to(tl.float32)
    dt = tl.load(dt_ptrs, mask=mask, other=0.0).to(tl.float32)
    if HAS_BIAS:
        dt = dt + bias[None, :]
    if SOFTPLUS:
        dt = tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)
    return u, tl.where(mask, dt, 0.0)


@triton.jit
def _first_order(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@triton.jit
def linear_recurrence(a, b, h0, BLOCK_L: tl.constexpr):
    """Every state of ``h_t = a_t h_{t-1} + b_t`` down axis 0 of [BLOCK_L, ., .] tiles (a, b) from
    ``h0``, and the last one."""
    a, b = tl.associative_scan((a, b), 0, _first_order)
    h = a * h0[None, :, :] + b
    last = tl.arange(0, BLOCK_L) == BLOCK_L - 1
    return h, tl.sum(tl.where(last[:, None, None], h, 0.0), axis=0)
