"""Fused Triton kernels for one decode step of a Mamba layer: ``ssmcc::mamba_mixer_step``
(Mamba-1, two launches) and ``ssmcc::ssd_mixer_step`` (Mamba-2, one launch), batch-parallel, the
states read and written through slot indices into state pools. The launchers are
``mixers.py``'s ``mamba_mixer_step_fwd`` / ``ssd_mixer_step_fwd``.

Math: the ops' references (``ssmcc.ops.mamba_mixer``, ``ssmcc.ops.ssd_mixer``), in float32, for
batch row i reading state slot ``s = state_indices[i]`` (``i`` without indices)::

    conv      xc[c]   = act(sum_{j<k-1} w[c, j] conv[s, c, j] + w[c, k-1] x[c] + bias[c])
              conv'[s, c, :] = (conv[s, c, 1:], x[c])                         act: activations.py
    Mamba-1   dt_r, B, C = split(x_proj xc, [R, n, n])     (each rms-normed: FalconMamba)
              dt[c]   = softplus(dt_proj[c, :] dt_r + dt_bias[c])
              h'[c, j] = exp(dt[c] A[c, j]) h[s, c, j] + dt[c] xc[c] B[j]
              y[c]    = (sum_j C[j] h'[c, j] + D[c] xc[c]) silu(z[c])
    Mamba-2   dt[h]   = clamp(softplus(dt[h] + dt_bias[h]), dt_min, dt_max);  g = h // (H / G)
              h'[h, p, j] = exp(dt[h] A[h]) h[s, h, p, j] + dt[h] x[h, p] B[g, j]
              v[h, p] = sum_j C[g, j] h'[h, p, j] + D[h, p] x[h, p]
              y       = rmsnorm_gated(v, z, norm_weight, norm_group_size)   (silu(z) before or
                        after the norm: ``norm_before_gate``)

A slot below zero skips the row (its y is zeros; no state is read or written): padding rows of a
CUDA graph captured for a larger batch, as mamba_ssm's ``state_batch_indices`` do. Slots must be
distinct. In place, every state element is written by one program only (a channel's conv state
by the program owning the channel; Mamba-2's B/C channels' by the row's last program, once every
program of the row has read them), and a program reads each tile before any of its threads
writes it (a CTA barrier between), so in-place and functional calls give the same values.

Mamba-1: x_proj reduces over every channel, and dt_proj and the state update of every channel
need its result, so the step is two launches (one would need a grid-wide barrier, or one program
per row recomputing the whole conv and x_proj):

    _mamba_step_conv_proj_kernel  grid (batch, parts): a part is ``cols`` channels in tiles of
        BLOCK_D: the conv update (the channel's state shifted in place), xc to scratch, and the
        part's x_proj partial sums (R + 2n) to scratch; the x_proj weight is read as (R + 2n,
        BLOCK_D) tiles, contiguous along channels.
    _mamba_step_update_kernel     grid (batch, programs): sums the row's parts (deterministic,
        fixed order), applies FalconMamba's norms, then per BLOCK_D-channel tile dt_proj (a
        (BLOCK_D, R) tile of its weight, contiguous along R), the state update of a (BLOCK_D, n)
        tile read and written once, D, the gate, y.

The projections are GEMVs in decode (a handful of rows): fused rather than run as ``linear_fwd``
tiles, as a GEMV is bandwidth-bound on its weight (491 KB float32 for mamba-130m's x_proj, read
once from HBM and from L2 for the other rows) and fusing removes two launches, the ATen split and
FalconMamba's three norms between them. Parts and programs follow ``configs.step_rows``: at
mamba-130m's shape (d 1536, n 16, R 48) batch 1 is 96 x_proj parts of 16 channels and 48 update
programs of 32, batch 64 is 5 parts and 5 update programs per row (320 each); the sum of the
parts is repeated by each update program of a row (96 x 80 floats, out of L2, at batch 1).

Mamba-2: one launch, grid (batch, heads, cdiv(head_dim, rows)). A program owns ``rows`` rows of
one head: it computes its group's B and C through the conv (2n channels, recomputed by each
program of the group: ~9 KB of L2 reads of their states and weights at n = 128), then per
BLOCK_P-row tile the conv of its x channels (their states shifted in place), the (BLOCK_P, n)
state tile (read and written once, contiguous along n), the D skip and, when the gate comes
first, silu(z); v goes to a float32 scratch row. The gated norm reduces over a norm group that
spans several heads, i.e. several programs, so the row's last program normalises it: each
program counts itself done on the row's counter (``atomic_add``, acquire-release at GPU scope,
after a CTA barrier: CUTLASS's semaphore pattern); the one that sees every other program done
normalises every norm group of the row from the scratch (two passes: sum of squares, scale and
gate; a fixed order, so deterministic), shifts the B/C channels' conv states (no program reads
them any more), and puts the counter back to zero (a persistent workspace stays reusable: CUDA
graphs).

Why not one program per (row, norm group): mamba2-130m (24 heads x 64 rows, n = 128, one
group) has 786 KB of state per row; at batch 1 that is one program on one SM streaming 1.5 MB
(read and write) while 131 SMs idle, at batch 64 it is 64 programs. Here batch 1 is 24 x 8 = 192
programs of 8 rows and batch 64 is 1,536 programs of a whole head (``configs.step_rows``: tiles
are split across programs only as far as the batch leaves SMs idle, so the B/C conv is recomputed
8x per head at batch 1 and once at batch 64); the serial tail normalises 1,536 values per row,
out of L2. A second launch for the norm would cost the same tail plus a launch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ssmcc.kernels.triton import activations


@triton.jit
def _shift_conv_state(
    x, in_row, out_row, c, mask, s_ic, s_ik, s_oc, s_ok,
    WIDTH: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """conv'[c, :] = (conv[c, 1:], x[c]); every program thread's reads are done before any
    write (the state may be updated in place)."""
    j = tl.arange(0, BLOCK_K)
    keep = mask[:, None] & (j[None, :] < WIDTH - 2)
    nxt = tl.load(in_row + c[:, None] * s_ic + (j[None, :] + 1) * s_ik, mask=keep, other=0.0)
    shifted = tl.where(j[None, :] == WIDTH - 2, x[:, None], nxt.to(tl.float32))
    tl.debug_barrier()
    tl.store(out_row + c[:, None] * s_oc + j[None, :] * s_ok, shifted,
             mask=mask[:, None] & (j[None, :] < WIDTH - 1))


@triton.jit
def _conv_step(
    x_row, in_row, out_row, w_ptr, bias_ptr, c, mask,
    s_xc, s_ic, s_ik, s_oc, s_ok, s_wc, s_wk,
    WIDTH: tl.constexpr, BLOCK_K: tl.constexpr, HAS_BIAS: tl.constexpr,
    ACTIVATION: tl.constexpr, WRITE_STATE: tl.constexpr,
):
    """act(conv) of channels ``c`` (float32), and their shifted state when WRITE_STATE."""
    x = tl.load(x_row + c * s_xc, mask=mask, other=0.0).to(tl.float32)
    acc = tl.load(w_ptr + c * s_wc + (WIDTH - 1) * s_wk, mask=mask, other=0.0).to(tl.float32) * x
    if WIDTH > 1:
        j = tl.arange(0, BLOCK_K)
        taps = mask[:, None] & (j[None, :] < WIDTH - 1)
        old = tl.load(in_row + c[:, None] * s_ic + j[None, :] * s_ik, mask=taps, other=0.0)
        w = tl.load(w_ptr + c[:, None] * s_wc + j[None, :] * s_wk, mask=taps, other=0.0)
        acc += tl.sum(old.to(tl.float32) * w.to(tl.float32), axis=1)
        if WRITE_STATE:
            _shift_conv_state(x, in_row, out_row, c, mask, s_ic, s_ik, s_oc, s_ok, WIDTH, BLOCK_K)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + c, mask=mask, other=0.0).to(tl.float32)
    return activations.activate(acc, ACTIVATION)


@triton.jit
def _softplus(dt):
    return tl.where(dt <= 20.0, tl.log(1.0 + tl.exp(dt)), dt)


@triton.jit
def _mamba_step_conv_proj_kernel(
    # pointers
    zx_ptr, idx_ptr, conv_in_ptr, conv_out_ptr, conv_w_ptr, conv_b_ptr, xw_ptr, xs_ptr,
    xc_ptr, part_ptr,
    # sizes
    dim, projected, cols, x_offset, xs_group_len,
    # strides: zx (b, w); conv in/out (slots, d, k-1); conv_w (d, k); x_proj (E, d) and its
    # scale (E, G); xc (b, d); partial sums (b, parts, E)
    s_zb, s_zw, s_cib, s_cid, s_cik, s_cob, s_cod, s_cok, s_wd, s_wk, s_pe, s_pd, s_qe, s_qg,
    s_xb, s_xd, s_tb, s_tk, s_te,
    # meta-parameters
    WIDTH: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_INDICES: tl.constexpr, OUT_BY_SLOT: tl.constexpr, HAS_BIAS: tl.constexpr,
    HAS_SCALE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    b = tl.program_id(0)
    part = tl.program_id(1)
    slot = b.to(tl.int64)
    if HAS_INDICES:
        slot = tl.load(idx_ptr + b).to(tl.int64)
    row_out = b.to(tl.int64)
    if OUT_BY_SLOT:
        row_out = slot
    if slot >= 0:
        start = part * cols
        end = tl.minimum(start + cols, dim)
        e = tl.arange(0, BLOCK_E)
        mask_e = e < projected
        acc = tl.zeros((BLOCK_E,), dtype=tl.float32)
        for c0 in range(start, end, BLOCK_D):
            c = c0 + tl.arange(0, BLOCK_D)
            mask = c < end
            xc = _conv_step(
                zx_ptr + b * s_zb + x_offset * s_zw, conv_in_ptr + slot * s_cib,
                conv_out_ptr + row_out * s_cob, conv_w_ptr, conv_b_ptr, c, mask,
                s_zw, s_cid, s_cik, s_cod, s_cok, s_wd, s_wk,
                WIDTH, BLOCK_K, HAS_BIAS, ACTIVATION, True,
            )
            tl.store(xc_ptr + b * s_xb + c * s_xd, xc, mask=mask)
            tile = mask_e[:, None] & mask[None, :]
            w = tl.load(xw_ptr + e[:, None] * s_pe + c[None, :] * s_pd, mask=tile, other=0.0)
            w = w.to(tl.float32)
            if HAS_SCALE:
                w *= tl.load(xs_ptr + e[:, None] * s_qe + (c[None, :] // xs_group_len) * s_qg,
                             mask=tile, other=0.0)
            acc += tl.sum(w * xc[None, :], axis=1)
        tl.store(part_ptr + b * s_tb + part * s_tk + e * s_te, acc, mask=mask_e)


@triton.jit
def _sum_parts(row_ptr, parts, first, size, s_tk, s_te, BLOCK: tl.constexpr,
               BLOCK_PARTS: tl.constexpr):
    """sum over the row's parts of the partial sums [first, first + size) -> (BLOCK,)."""
    i = tl.arange(0, BLOCK)
    k = tl.arange(0, BLOCK_PARTS)
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    for k0 in range(0, parts, BLOCK_PARTS):
        tile = ((k0 + k)[:, None] < parts) & (i[None, :] < size)
        total += tl.sum(tl.load(row_ptr + (k0 + k)[:, None] * s_tk + (first + i)[None, :] * s_te,
                                mask=tile, other=0.0), axis=0)
    return total


@triton.jit
def _mamba_step_update_kernel(
    # pointers
    zx_ptr, idx_ptr, xc_ptr, part_ptr, dw_ptr, ds_ptr, A_ptr, D_ptr, bias_ptr, h_in_ptr,
    h_out_ptr, out_ptr,
    # sizes
    dim, rank, nstate, parts, cols, z_offset, ds_group_len, rms_eps,
    # strides: zx (b, w); xc (b, d); partial sums (b, parts, E); dt_proj (d, R) and its scale
    # (d, G); A (d, n); D, dt_bias (d,); ssm state in/out (slots, d, n); out (b, d)
    s_zb, s_zw, s_xb, s_xd, s_tb, s_tk, s_te, s_wd, s_wr, s_qd, s_qg, s_ad, s_an, s_dd, s_id,
    s_hib, s_hid, s_hin, s_hob, s_hod, s_hon, s_ob, s_od,
    # meta-parameters
    BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_PARTS: tl.constexpr, HAS_INDICES: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
    HAS_SCALE: tl.constexpr, HAS_D: tl.constexpr, HAS_Z: tl.constexpr, HAS_BIAS: tl.constexpr,
    SOFTPLUS: tl.constexpr, RMS: tl.constexpr,
):
    b = tl.program_id(0)
    start = tl.program_id(1) * cols
    end = tl.minimum(start + cols, dim)
    slot = b.to(tl.int64)
    if HAS_INDICES:
        slot = tl.load(idx_ptr + b).to(tl.int64)
    row_out = b.to(tl.int64)
    if OUT_BY_SLOT:
        row_out = slot
    if slot >= 0:
        row = part_ptr + b * s_tb
        r = tl.arange(0, BLOCK_R)
        j = tl.arange(0, BLOCK_N)
        mask_j = j < nstate
        dt_r = _sum_parts(row, parts, 0, rank, s_tk, s_te, BLOCK_R, BLOCK_PARTS)
        Bv = _sum_parts(row, parts, rank, nstate, s_tk, s_te, BLOCK_N, BLOCK_PARTS)
        Cv = _sum_parts(row, parts, rank + nstate, nstate, s_tk, s_te, BLOCK_N, BLOCK_PARTS)
        if RMS:  # FalconMamba: v / sqrt(mean(v^2) + eps), no weight
            dt_r = dt_r / tl.sqrt(tl.sum(dt_r * dt_r, axis=0) / rank + rms_eps)
            Bv = Bv / tl.sqrt(tl.sum(Bv * Bv, axis=0) / nstate + rms_eps)
            Cv = Cv / tl.sqrt(tl.sum(Cv * Cv, axis=0) / nstate + rms_eps)
        for c0 in range(start, end, BLOCK_D):
            c = c0 + tl.arange(0, BLOCK_D)
            mask = c < end
            xc = tl.load(xc_ptr + b * s_xb + c * s_xd, mask=mask, other=0.0)
            tile_r = mask[:, None] & (r[None, :] < rank)
            w = tl.load(dw_ptr + c[:, None] * s_wd + r[None, :] * s_wr, mask=tile_r, other=0.0)
            w = w.to(tl.float32)
            if HAS_SCALE:
                w *= tl.load(ds_ptr + c[:, None] * s_qd + (r[None, :] // ds_group_len) * s_qg,
                             mask=tile_r, other=0.0)
            dt = tl.sum(w * dt_r[None, :], axis=1)
            if HAS_BIAS:
                dt += tl.load(bias_ptr + c * s_id, mask=mask, other=0.0).to(tl.float32)
            if SOFTPLUS:
                dt = _softplus(dt)
            tile = mask[:, None] & mask_j[None, :]
            A = tl.load(A_ptr + c[:, None] * s_ad + j[None, :] * s_an, mask=tile, other=0.0)
            old = tl.load(h_in_ptr + slot * s_hib + c[:, None] * s_hid + j[None, :] * s_hin,
                          mask=tile, other=0.0).to(tl.float32)
            tl.debug_barrier()  # every read of the tile before any write: in place
            new = tl.exp(dt[:, None] * A.to(tl.float32)) * old
            new += (dt * xc)[:, None] * Bv[None, :]
            tl.store(h_out_ptr + row_out * s_hob + c[:, None] * s_hod + j[None, :] * s_hon, new,
                     mask=tile)
            y = tl.sum(new * Cv[None, :], axis=1)
            if HAS_D:
                y += tl.load(D_ptr + c * s_dd, mask=mask, other=0.0).to(tl.float32) * xc
            if HAS_Z:
                z = tl.load(zx_ptr + b * s_zb + (z_offset + c) * s_zw, mask=mask, other=0.0)
                z = z.to(tl.float32)
                y = y * z / (1.0 + tl.exp(-z))
            tl.store(out_ptr + b * s_ob + c * s_od, y, mask=mask)
    else:  # a padding row: y = 0, no state touched
        for c0 in range(start, end, BLOCK_D):
            c = c0 + tl.arange(0, BLOCK_D)
            tl.store(out_ptr + b * s_ob + c * s_od, tl.zeros((BLOCK_D,), tl.float32), mask=c < end)


@triton.jit
def _ssd_step_tail(
    zx_ptr, conv_in_row, conv_out_row, v_ptr, norm_w_ptr, out_ptr, b,
    inner, channels, norm_group, xbc_offset, z_offset, eps,
    s_zb, s_zw, s_cic, s_cik, s_coc, s_cok, s_vb, s_vc, s_ob, s_oc,
    WIDTH: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_T: tl.constexpr, HAS_Z: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr,
):
    """The row's last program: the B/C channels' conv states, then the gated RMSNorm of v."""
    t = tl.arange(0, BLOCK_T)
    if WIDTH > 1:
        for c0 in range(inner, channels, BLOCK_T):
            c = c0 + t
            mask = c < channels
            x = tl.load(zx_ptr + b * s_zb + (xbc_offset + c) * s_zw, mask=mask, other=0.0)
            _shift_conv_state(x.to(tl.float32), conv_in_row, conv_out_row, c, mask, s_cic, s_cik,
                              s_coc, s_cok, WIDTH, BLOCK_K)
    for g0 in range(0, inner, norm_group):
        squares = tl.zeros((BLOCK_T,), dtype=tl.float32)
        for c0 in range(g0, g0 + norm_group, BLOCK_T):
            c = c0 + t
            v = tl.load(v_ptr + b * s_vb + c * s_vc, mask=c < g0 + norm_group, other=0.0,
                        cache_modifier=".cg")  # written by other programs: not through L1
            squares += v * v
        scale = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / norm_group + eps)
        for c0 in range(g0, g0 + norm_group, BLOCK_T):
            c = c0 + t
            mask = c < g0 + norm_group
            v = tl.load(v_ptr + b * s_vb + c * s_vc, mask=mask, other=0.0, cache_modifier=".cg")
            y = v * scale * tl.load(norm_w_ptr + c, mask=mask, other=0.0).to(tl.float32)
            if HAS_Z:
                if NORM_BEFORE_GATE:
                    z = tl.load(zx_ptr + b * s_zb + (z_offset + c) * s_zw, mask=mask, other=0.0)
                    z = z.to(tl.float32)
                    y = y * z / (1.0 + tl.exp(-z))
            tl.store(out_ptr + b * s_ob + c * s_oc, y, mask=mask)


@triton.jit
def _ssd_step_kernel(
    # pointers
    zx_ptr, idx_ptr, conv_in_ptr, conv_out_ptr, conv_w_ptr, conv_b_ptr, A_ptr, D_ptr, bias_ptr,
    norm_w_ptr, h_in_ptr, h_out_ptr, v_ptr, out_ptr, count_ptr,
    # sizes
    head_dim, nstate, groups, heads_per_group, inner, channels, rows, norm_group, xbc_offset,
    z_offset, dt_offset, dt_min, dt_max, eps,
    # strides: zxbcdt (b, w); conv in/out (slots, c, k-1); conv_w (c, k); A, dt_bias (h,);
    # D (h, p); ssm state in/out (slots, h, p, n); v scratch (b, d); out (b, d)
    s_zb, s_zw, s_cib, s_cic, s_cik, s_cob, s_coc, s_cok, s_wc, s_wk, s_ah, s_dh, s_dp, s_ih,
    s_hib, s_hih, s_hip, s_hin, s_hob, s_hoh, s_hop, s_hon, s_vb, s_vc, s_ob, s_oc,
    # meta-parameters
    WIDTH: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    BLOCK_T: tl.constexpr, HAS_INDICES: tl.constexpr, OUT_BY_SLOT: tl.constexpr,
    HAS_CONV_BIAS: tl.constexpr, HAS_D: tl.constexpr, HAS_DT_BIAS: tl.constexpr,
    HAS_Z: tl.constexpr, SOFTPLUS: tl.constexpr, CLAMP_MAX: tl.constexpr,
    NORM_BEFORE_GATE: tl.constexpr, ACTIVATION: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    p_start = tl.program_id(2) * rows
    p_end = tl.minimum(p_start + rows, head_dim)
    slot = b.to(tl.int64)
    if HAS_INDICES:
        slot = tl.load(idx_ptr + b).to(tl.int64)
    row_out = b.to(tl.int64)
    if OUT_BY_SLOT:
        row_out = slot
    if slot >= 0:
        x_row = zx_ptr + b * s_zb + xbc_offset * s_zw
        conv_in_row = conv_in_ptr + slot * s_cib
        conv_out_row = conv_out_ptr + row_out * s_cob
        g = h // heads_per_group
        j = tl.arange(0, BLOCK_N)
        mask_j = j < nstate
        Bv = _conv_step(x_row, conv_in_row, conv_out_row, conv_w_ptr, conv_b_ptr,
                        inner + g * nstate + j, mask_j, s_zw, s_cic, s_cik, s_coc, s_cok, s_wc,
                        s_wk, WIDTH, BLOCK_K, HAS_CONV_BIAS, ACTIVATION, False)
        Cv = _conv_step(x_row, conv_in_row, conv_out_row, conv_w_ptr, conv_b_ptr,
                        inner + (groups + g) * nstate + j, mask_j, s_zw, s_cic, s_cik, s_coc,
                        s_cok, s_wc, s_wk, WIDTH, BLOCK_K, HAS_CONV_BIAS, ACTIVATION, False)
        dt = tl.load(zx_ptr + b * s_zb + (dt_offset + h) * s_zw).to(tl.float32)
        if HAS_DT_BIAS:
            dt += tl.load(bias_ptr + h * s_ih).to(tl.float32)
        if SOFTPLUS:
            dt = _softplus(dt)
        dt = tl.maximum(dt, dt_min)
        if CLAMP_MAX:
            dt = tl.minimum(dt, dt_max)
        decay = tl.exp(dt * tl.load(A_ptr + h * s_ah).to(tl.float32))
        for p0 in range(p_start, p_end, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            mask_p = p < p_end
            c = h * head_dim + p
            xc = _conv_step(x_row, conv_in_row, conv_out_row, conv_w_ptr, conv_b_ptr, c, mask_p,
                            s_zw, s_cic, s_cik, s_coc, s_cok, s_wc, s_wk, WIDTH, BLOCK_K,
                            HAS_CONV_BIAS, ACTIVATION, True)
            tile = mask_p[:, None] & mask_j[None, :]
            old = tl.load(h_in_ptr + slot * s_hib + h * s_hih + p[:, None] * s_hip
                          + j[None, :] * s_hin, mask=tile, other=0.0).to(tl.float32)
            tl.debug_barrier()  # every read of the tile before any write: in place
            new = decay * old + (dt * xc)[:, None] * Bv[None, :]
            tl.store(h_out_ptr + row_out * s_hob + h * s_hoh + p[:, None] * s_hop
                     + j[None, :] * s_hon, new, mask=tile)
            v = tl.sum(new * Cv[None, :], axis=1)
            if HAS_D:
                Dv = tl.load(D_ptr + h * s_dh + p * s_dp, mask=mask_p, other=0.0)
                v += Dv.to(tl.float32) * xc
            if HAS_Z:
                if not NORM_BEFORE_GATE:
                    z = tl.load(zx_ptr + b * s_zb + (z_offset + c) * s_zw, mask=mask_p, other=0.0)
                    z = z.to(tl.float32)
                    v = v * z / (1.0 + tl.exp(-z))
            tl.store(v_ptr + b * s_vb + c * s_vc, v, mask=mask_p)
        tl.debug_barrier()  # the whole program's writes before it counts itself done
        done = tl.atomic_add(count_ptr + b, 1, sem="acq_rel", scope="gpu")
        if done == tl.num_programs(1) * tl.num_programs(2) - 1:
            _ssd_step_tail(zx_ptr, conv_in_row, conv_out_row, v_ptr, norm_w_ptr, out_ptr, b,
                           inner, channels, norm_group, xbc_offset, z_offset, eps, s_zb, s_zw,
                           s_cic, s_cik, s_coc, s_cok, s_vb, s_vc, s_ob, s_oc, WIDTH, BLOCK_K,
                           BLOCK_T, HAS_Z, NORM_BEFORE_GATE)
            tl.store(count_ptr + b, 0)
    else:  # a padding row: y = 0, no state touched
        for p0 in range(p_start, p_end, BLOCK_P):
            p = p0 + tl.arange(0, BLOCK_P)
            tl.store(out_ptr + b * s_ob + (h * head_dim + p) * s_oc,
                     tl.zeros((BLOCK_P,), tl.float32), mask=p < p_end)
