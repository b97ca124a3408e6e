"""Triton launchers for the fused mixer ops: ``ssmcc::mamba_mixer(_step)`` (Mamba-1) and
``ssmcc::ssd_mixer(_step)`` (Mamba-2), each a chain of this package's kernels.

Math: exactly the ops' references (``ssmcc.ops.mamba_mixer``, ``ssmcc.ops.ssd_mixer``)::

    mamba_mixer  xc = act(conv(x)); dt_r, B, C = xc x_proj^T (rms each with bcdt_rms_eps);
                 dt = dt_r dt_proj^T; y = selective_scan(xc, dt, A, B, C, D, z, dt_bias)
    ssd_mixer    xBC = act(conv(xBC)); y = ssd_scan(x, dt, A, B, C, D, dt_bias, limits);
                 y = rmsnorm_gated(y, z, norm_weight)

Every piece is read where it lies: x, z, xBC and dt are strided views into the projection output
(no copies), the conv writes token-major float32 (what the projections and the scans read), the
scans write the output in the op's layout and dtype. Intermediates stay float32, as in the
references; only the mixer's output is rounded to the projection output's dtype.

The step forms are the fused decode kernels of ``mixer_steps.py`` (Mamba-1: two launches,
Mamba-2: one), batch-parallel. Their states: as the op (functional), conv_state (b, c, k-1) and
ssm_state (b, ...) are read and new float32 states returned. ``state_indices`` (b,) int32 or
int64: the states are pools (slots, c, k-1) / (slots, ...), row i's at slot
``state_indices[i]`` (distinct; negative: a padding row, skipped, its y zeros), updated in place
and returned; ``in_place=False`` with indices reads the slots and returns new (b, ...) states (a
padding row's zeros); ``in_place=True`` without indices: row i is slot i. ``out``: y written
there ((b, d), the projection output's dtype). ``workspace``: ``mamba_mixer_step_workspace`` /
``ssd_mixer_step_workspace`` for the batch (what a CUDA graph keeps; the Mamba-2 kernel leaves
its row counters at zero), else allocated per call. Slot values are not checked against the
pool (that would synchronise with the GPU every step).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ssmcc.kernels.triton import configs
from ssmcc.kernels.triton.catalog import launcher
from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_fwd
from ssmcc.kernels.triton.linear import linear_fwd
from ssmcc.kernels.triton.mixer_steps import (
    _mamba_step_conv_proj_kernel,
    _mamba_step_update_kernel,
    _ssd_step_kernel,
)
from ssmcc.kernels.triton.rmsnorm_gated import rmsnorm_gated_fwd
from ssmcc.kernels.triton.runtime import launch, next_power_of_2
from ssmcc.kernels.triton.selective_scan import selective_scan_fwd
from ssmcc.kernels.triton.slots import check_indices
from ssmcc.kernels.triton.ssd_scan import ssd_scan_fwd
from ssmcc.ops._shapes import expect
from ssmcc.ops.activations import activation_code
from ssmcc.ops.mamba_mixer import mamba_mixer_sizes
from ssmcc.ops.ssd_mixer import mixer_pieces, mixer_sizes, split_xbc

F32 = torch.float32


def _projections(
    xc, x_proj_weight, x_proj_scale, dt_proj_weight, dt_proj_scale, rank, state, bcdt_rms_eps
):
    """dt (..., d), B, C (..., n) float32 from the conv output xc (..., d) token-major."""
    proj = linear_fwd(xc, x_proj_weight, x_proj_scale, out_dtype=F32)
    if bcdt_rms_eps is not None:  # FalconMamba: rms of each piece, no weight
        normed = torch.empty_like(proj)
        for start, size in ((0, rank), (rank, state), (rank + state, state)):
            ones = torch.ones(size, dtype=F32, device=proj.device)
            piece = slice(start, start + size)
            rmsnorm_gated_fwd(
                proj[..., piece], None, ones, size, bcdt_rms_eps, out=normed[..., piece]
            )
        proj = normed
    dt_r, B, C = proj.split([rank, state, state], dim=-1)
    return linear_fwd(dt_r, dt_proj_weight, dt_proj_scale, out_dtype=F32), B, C


@launcher("mamba_mixer")
def mamba_mixer_fwd(
    zx,
    conv_weight,
    conv_bias,
    x_proj_weight,
    dt_proj_weight,
    A,
    D,
    dt_bias,
    x_offset,
    z_offset,
    activation="silu",
    delta_softplus=True,
    bcdt_rms_eps=None,
    conv_state=None,
    ssm_state=None,
    x_proj_scale=None,
    dt_proj_scale=None,
):
    """``mamba_mixer`` on Triton: zx (b, l, w) -> (y (b, l, d), conv_state, ssm_state)."""
    batch, length, _ = zx.shape
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    dim, rank, state = s["channels"], s["rank"], s["state"]
    x = zx[..., x_offset : x_offset + dim].transpose(1, 2)
    z = None if z_offset < 0 else zx[..., z_offset : z_offset + dim].transpose(1, 2)
    xc = torch.empty((batch, length, dim), dtype=F32, device=zx.device)
    _, conv_last = causal_conv1d_fwd(
        x, conv_weight, conv_bias, conv_state, activation, out=xc.transpose(1, 2)
    )
    dt, B, C = _projections(
        xc, x_proj_weight, x_proj_scale, dt_proj_weight, dt_proj_scale, rank, state, bcdt_rms_eps
    )
    y = torch.empty((batch, length, dim), dtype=zx.dtype, device=zx.device)
    _, ssm_last = selective_scan_fwd(
        xc.transpose(1, 2),
        dt.transpose(1, 2),
        A,
        B.transpose(1, 2),
        C.transpose(1, 2),
        D,
        z,
        dt_bias,
        delta_softplus,
        ssm_state,
        out=y.transpose(1, 2),
    )
    return y, conv_last, ssm_last


@launcher("mamba_mixer_step")
def mamba_mixer_step_fwd(
    zx,
    conv_weight,
    conv_bias,
    x_proj_weight,
    dt_proj_weight,
    A,
    D,
    dt_bias,
    x_offset,
    z_offset,
    activation,
    delta_softplus,
    bcdt_rms_eps,
    conv_state,
    ssm_state,
    x_proj_scale=None,
    dt_proj_scale=None,
    state_indices=None,
    in_place=None,
    out=None,
    workspace=None,
):
    """``mamba_mixer_step`` on Triton (``mixer_steps.py``, two launches): zx (b, w) ->
    (y (b, d), conv_state, ssm_state). States and options: the module docstring."""
    op = "mamba_mixer_step"
    batch = zx.shape[0]
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    dim, rank, nstate, width = s["channels"], s["rank"], s["state"], s["width"]
    indices, in_place = _slots(op, batch, state_indices, in_place, conv_state, ssm_state)
    conv_new, ssm_new = _new_states(in_place, indices, batch, conv_state, ssm_state)
    y = _output(op, out, (batch, dim), zx)
    if batch == 0:
        return y, conv_new, ssm_new
    plan = _mamba_step_plan(zx.device, batch, s)
    work = workspace or mamba_mixer_step_workspace(
        batch, conv_weight, x_proj_weight, dt_proj_weight, A, zx.device
    )
    _check_workspace(op, work, (batch, dim + plan["parts"] * s["projected"]), counts=False)
    xc = work.floats[:, :dim]
    parts = work.floats[:, dim:].view(batch, plan["parts"], s["projected"])
    idx = indices if indices is not None else zx
    launch(_mamba_step_conv_proj_kernel, (batch, plan["parts"]))(
        zx, idx, conv_state, conv_new, conv_weight, _given(conv_bias, zx), x_proj_weight,
        _given(x_proj_scale, zx), xc, parts,
        dim, s["projected"], plan["cols"], x_offset, _group_len(x_proj_scale, dim),
        *zx.stride(), *conv_state.stride(), *conv_new.stride(), *conv_weight.stride(),
        *x_proj_weight.stride(), *_strides(x_proj_scale, 2), *xc.stride(), *parts.stride(),
        WIDTH=width, BLOCK_D=plan["block_conv"], BLOCK_E=next_power_of_2(s["projected"]),
        BLOCK_K=next_power_of_2(max(width - 1, 1)), HAS_INDICES=indices is not None,
        OUT_BY_SLOT=in_place, HAS_BIAS=conv_bias is not None, HAS_SCALE=x_proj_scale is not None,
        ACTIVATION=activation_code(op, activation), num_warps=plan["num_warps"],
    )
    launch(_mamba_step_update_kernel, (batch, -(-dim // plan["cols_update"])))(
        zx, idx, xc, parts, dt_proj_weight, _given(dt_proj_scale, zx), A, _given(D, zx),
        _given(dt_bias, zx), ssm_state, ssm_new, y,
        dim, rank, nstate, plan["parts"], plan["cols_update"], max(z_offset, 0),
        _group_len(dt_proj_scale, rank), float(bcdt_rms_eps or 0.0),
        *zx.stride(), *xc.stride(), *parts.stride(), *dt_proj_weight.stride(),
        *_strides(dt_proj_scale, 2), *A.stride(), *_strides(D, 1), *_strides(dt_bias, 1),
        *ssm_state.stride(), *ssm_new.stride(), *y.stride(),
        BLOCK_D=plan["block_update"], BLOCK_R=next_power_of_2(rank),
        BLOCK_N=next_power_of_2(nstate), BLOCK_PARTS=plan["block_parts"],
        HAS_INDICES=indices is not None, OUT_BY_SLOT=in_place,
        HAS_SCALE=dt_proj_scale is not None, HAS_D=D is not None, HAS_Z=z_offset >= 0,
        HAS_BIAS=dt_bias is not None, SOFTPLUS=bool(delta_softplus),
        RMS=bcdt_rms_eps is not None, num_warps=plan["num_warps"],
    )
    return y, conv_new, ssm_new


@launcher("ssd_mixer")
def ssd_mixer_fwd(
    zxbcdt,
    conv_weight,
    conv_bias,
    A,
    D,
    dt_bias,
    norm_weight,
    groups,
    z_offset,
    xbc_offset,
    dt_offset,
    norm_group_size,
    eps=1e-6,
    norm_before_gate=False,
    activation="silu",
    dt_softplus=True,
    dt_min=0.0,
    dt_max=None,
    conv_state=None,
    ssm_state=None,
    allow_tf32: bool = False,
):
    """``ssd_mixer`` on Triton: zxbcdt (b, l, w) -> (y (b, l, d), conv_state, ssm_state). The
    scan reads the conv's float32 output, so its products are float32: IEEE, or TF32 tensor cores
    with ``allow_tf32`` (``ssd_scan.py`` states the error)."""
    batch, length, _ = zxbcdt.shape
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    inner, device = s["inner"], zxbcdt.device
    z, xbc, dt = mixer_pieces(zxbcdt, s, z_offset, xbc_offset, dt_offset)
    conv = torch.empty((batch, length, s["channels"]), dtype=F32, device=device)
    _, conv_last = causal_conv1d_fwd(
        xbc.transpose(1, 2),
        conv_weight,
        conv_bias,
        conv_state,
        activation,
        out=conv.transpose(1, 2),
    )
    x, B, C = split_xbc(conv, s)
    scanned = torch.empty((batch, length, s["heads"], s["head_dim"]), dtype=F32, device=device)
    _, ssm_last = ssd_scan_fwd(
        x, dt, A, B, C, D, None, dt_bias, dt_softplus, dt_min, dt_max, ssm_state, out=scanned,
        allow_tf32=allow_tf32,
    )
    y = torch.empty((batch, length, inner), dtype=zxbcdt.dtype, device=device)
    rmsnorm_gated_fwd(
        scanned.view(batch, length, inner),
        z,
        norm_weight,
        norm_group_size,
        eps,
        norm_before_gate,
        out=y,
    )
    return y, conv_last, ssm_last


@launcher("ssd_mixer_step")
def ssd_mixer_step_fwd(
    zxbcdt,
    conv_weight,
    conv_bias,
    A,
    D,
    dt_bias,
    norm_weight,
    groups,
    z_offset,
    xbc_offset,
    dt_offset,
    norm_group_size,
    eps,
    norm_before_gate,
    activation,
    dt_softplus,
    dt_min,
    dt_max,
    conv_state,
    ssm_state,
    state_indices=None,
    in_place=None,
    out=None,
    workspace=None,
):
    """``ssd_mixer_step`` on Triton (``mixer_steps.py``, one launch): zxbcdt (b, w) ->
    (y (b, d), conv_state, ssm_state). States and options: the module docstring."""
    op = "ssd_mixer_step"
    batch = zxbcdt.shape[0]
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    heads, head_dim, inner, width = s["heads"], s["head_dim"], s["inner"], s["width"]
    indices, in_place = _slots(op, batch, state_indices, in_place, conv_state, ssm_state)
    conv_new, ssm_new = _new_states(in_place, indices, batch, conv_state, ssm_state)
    y = _output(op, out, (batch, inner), zxbcdt)
    if batch == 0:
        return y, conv_new, ssm_new
    plan = _ssd_step_plan(zxbcdt.device, batch, s, norm_group_size)
    work = workspace or ssd_mixer_step_workspace(batch, norm_weight, zxbcdt.device)
    _check_workspace(op, work, (batch, inner), counts=True)
    if D is None:
        D_strides = (0, 0)
    else:
        D_strides = (D.stride(0), 0) if D.dim() == 1 else tuple(D.stride())
    grid = (batch, heads, -(-head_dim // plan["rows"]))
    launch(_ssd_step_kernel, grid)(
        zxbcdt, indices if indices is not None else zxbcdt, conv_state, conv_new, conv_weight,
        _given(conv_bias, zxbcdt), A, _given(D, zxbcdt), _given(dt_bias, zxbcdt),
        norm_weight, ssm_state, ssm_new, work.floats, y, work.counts,
        head_dim, s["state"], groups, heads // groups, inner, s["channels"], plan["rows"],
        norm_group_size, xbc_offset, max(z_offset, 0), dt_offset, float(dt_min),
        float(dt_max if dt_max is not None else 0.0), float(eps),
        *zxbcdt.stride(), *conv_state.stride(), *conv_new.stride(), *conv_weight.stride(),
        A.stride(0), *D_strides, *_strides(dt_bias, 1), *ssm_state.stride(),
        *ssm_new.stride(), *work.floats.stride(), *y.stride(),
        WIDTH=width, BLOCK_P=plan["block"], BLOCK_N=next_power_of_2(s["state"]),
        BLOCK_K=next_power_of_2(max(width - 1, 1)), BLOCK_T=plan["tail"],
        HAS_INDICES=indices is not None, OUT_BY_SLOT=in_place,
        HAS_CONV_BIAS=conv_bias is not None, HAS_D=D is not None,
        HAS_DT_BIAS=dt_bias is not None, HAS_Z=z_offset >= 0, SOFTPLUS=bool(dt_softplus),
        CLAMP_MAX=dt_max is not None, NORM_BEFORE_GATE=bool(norm_before_gate),
        ACTIVATION=activation_code(op, activation), num_warps=plan["num_warps"],
    )
    return y, conv_new, ssm_new


class StepWorkspace(NamedTuple):
    """Scratch of the step kernels: ``floats`` float32 (b, ...); ``counts`` int32 (b,) zeros
    (Mamba-2's row counters) or None."""

    floats: torch.Tensor
    counts: torch.Tensor | None


def _mamba_step_plan(device, batch: int, s: dict) -> dict:
    """Tiles and splits of the Mamba-1 step (``configs.MAMBA_STEP_*``, ``configs.step_rows``)."""
    config = configs.pick(device, configs.MAMBA_STEP_GPU, configs.MAMBA_STEP_CPU)
    programs = configs.pick(device, configs.STEP_PROGRAMS_GPU, configs.STEP_PROGRAMS_CPU)
    dim = s["channels"]

    def block(wide: int) -> int:  # rows of a tile whose other side is ``wide``
        fit = max(1, config["tile"] // next_power_of_2(wide))
        return max(1, min(config["block"], next_power_of_2(dim), 1 << (fit.bit_length() - 1)))

    block_conv = block(s["projected"])
    block_update = block(max(s["rank"], s["state"]))
    cols = configs.step_rows(dim, block_conv, batch, programs)
    return dict(
        block_conv=block_conv,
        block_update=block_update,
        cols=cols,
        parts=-(-dim // cols),
        cols_update=configs.step_rows(dim, block_update, batch, programs),
        block_parts=config["parts"],
        num_warps=config["num_warps"],
    )


def mamba_mixer_step_workspace(
    batch: int, conv_weight, x_proj_weight, dt_proj_weight, A, device
) -> StepWorkspace:
    """Scratch of ``mamba_mixer_step_fwd`` at ``batch`` rows: xc (b, d) and the x_proj partial
    sums (b, parts, R + 2n), float32."""
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    parts = _mamba_step_plan(torch.device(device), batch, s)["parts"]
    width = s["channels"] + parts * s["projected"]
    return StepWorkspace(torch.empty((batch, width), dtype=F32, device=device), None)


def _ssd_step_plan(device, batch: int, s: dict, norm_group: int) -> dict:
    """Tiles and the split of the Mamba-2 step (``configs.SSD_STEP_*``, ``configs.step_rows``)."""
    config = configs.pick(device, configs.SSD_STEP_GPU, configs.SSD_STEP_CPU)
    programs = configs.pick(device, configs.STEP_PROGRAMS_GPU, configs.STEP_PROGRAMS_CPU)
    block = min(config["block"], next_power_of_2(s["head_dim"]))
    tail_width = max(norm_group, s["channels"] - s["inner"])
    return dict(
        block=block,
        rows=configs.step_rows(s["head_dim"], block, batch * s["heads"], programs),
        tail=min(config["tail"], next_power_of_2(tail_width)),
        num_warps=config["num_warps"],
    )


def ssd_mixer_step_workspace(batch: int, norm_weight, device) -> StepWorkspace:
    """Scratch of ``ssd_mixer_step_fwd`` at ``batch`` rows: the pre-norm v (b, d) float32 and
    the row counters (b,) int32, zero (the kernel leaves them zero)."""
    inner = norm_weight.shape[0]
    return StepWorkspace(
        torch.empty((batch, inner), dtype=F32, device=device),
        torch.zeros((batch,), dtype=torch.int32, device=device),
    )


def _slots(op: str, batch: int, state_indices, in_place, conv_state, ssm_state):
    """(indices or None, in_place), checked: the states' leading dim is their slot count."""
    if in_place is None:
        in_place = state_indices is not None
    slots = conv_state.shape[0]
    expect(
        ssm_state.shape[0] == slots,
        op,
        f"conv_state has {slots} slots and ssm_state {ssm_state.shape[0]}; a pool gives both "
        "one slot per sequence",
    )
    if state_indices is None:
        expect(
            slots == batch or (in_place and slots >= batch),
            op,
            f"the states have {slots} rows for a batch of {batch}; pass state_indices to "
            "address slots of a pool",
        )
        return None, bool(in_place)
    return check_indices(op, batch, state_indices, conv_state.device), bool(in_place)


def _new_states(in_place: bool, indices, batch: int, conv_state, ssm_state):
    """The tensors the kernels write the states to: the pools themselves, or new (b, ...)
    float32 ones (zeros where a padding row leaves them unwritten)."""
    if in_place:
        return conv_state, ssm_state
    make = torch.empty if indices is None else torch.zeros
    return tuple(
        make((batch, *t.shape[1:]), dtype=F32, device=t.device) for t in (conv_state, ssm_state)
    )


def _output(op: str, out, shape: tuple, proj) -> torch.Tensor:
    if out is None:
        return torch.empty(shape, dtype=proj.dtype, device=proj.device)
    expect(
        tuple(out.shape) == shape and out.dtype == proj.dtype and out.device == proj.device,
        op,
        f"out must be {proj.dtype} of shape {shape} on {proj.device}, got {out.dtype} "
        f"{tuple(out.shape)} on {out.device}",
    )
    return out


def _check_workspace(op: str, work: StepWorkspace, shape: tuple, counts: bool) -> None:
    have_counts = work.counts is not None and work.counts.dtype == torch.int32
    expect(
        tuple(work.floats.shape) == shape
        and work.floats.dtype == F32
        and (not counts or (have_counts and tuple(work.counts.shape) == shape[:1])),
        op,
        f"the workspace does not fit this call (batch {shape[0]}): build it with "
        f"{op}_workspace for the batch it serves",
    )


def _given(tensor, stand_in):
    """A pointer argument: the tensor, or any tensor where the kernel does not read it."""
    return tensor if tensor is not None else stand_in


def _strides(tensor, rank: int) -> tuple:
    return tuple(tensor.stride()) if tensor is not None else (0,) * rank


def _group_len(scale, cols: int) -> int:
    """Columns per scale group of a weight stored small (W = weight * scale[:, col // len])."""
    return cols // scale.shape[1] if scale is not None else 1
