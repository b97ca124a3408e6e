"""The fused mixer kernels (``ssd_mixer.h``, ``mamba_mixer.h``) as Python callables with the
signatures of ``ssmcc.ops.ssd_mixer`` / ``ssd_mixer_step`` and ``ssmcc.ops.mamba_mixer`` /
``mamba_mixer_step``.

As in ``ssd_binding``: the checked entry points apply the op's shape rules first, the
``_verified`` forms (the torch lowering's) skip them; the C++ contract check runs either way. The
projection output goes to the kernel as one float32 contiguous tensor (it is one already in a
float32 model: the output of a linear), read in place; ``y`` comes back in its dtype, the states
in float32. ``D`` of shape (h,) reaches the kernel as (h, p).
"""

from __future__ import annotations

import math

import torch

from ssmcc.kernels.cpu.cpp_kernels import cpp_kernel
from ssmcc.kernels.cpu.native import as_f32, call_kernel, pointer
from ssmcc.kernels.cpu.quantized_binding import mixer_weight_args
from ssmcc.kernels.cpu.ssd_binding import _per_channel_D
from ssmcc.ops.activations import activation_code
from ssmcc.ops.mamba_mixer import check_mamba_mixer_args, mamba_mixer_sizes
from ssmcc.ops.ssd_mixer import check_ssd_mixer_args, mixer_sizes


def _run(
    step,
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
):
    s = mixer_sizes(conv_weight, A, norm_weight, groups)
    batch, width = zxbcdt.shape[0], zxbcdt.shape[-1]
    lead = tuple(zxbcdt.shape[:-1])
    y = torch.empty(*lead, s["inner"], dtype=torch.float32)
    conv_out = torch.empty(batch, s["channels"], s["width"] - 1, dtype=torch.float32)
    ssm_out = torch.empty(batch, s["heads"], s["head_dim"], s["state"], dtype=torch.float32)
    D = _per_channel_D(D, s["heads"], s["head_dim"])
    inputs = (zxbcdt, conv_weight, conv_bias, A, D, dt_bias, norm_weight, conv_state, ssm_state)
    inputs = [as_f32(t) for t in inputs]
    sizes = [batch] if step else [batch, zxbcdt.shape[1]]
    sizes += [width, s["heads"], s["head_dim"], groups, s["state"], s["width"]]
    call_kernel(
        "ssmcc_ssd_mixer_step_f32" if step else "ssmcc_ssd_mixer_f32",
        *[pointer(t) for t in inputs],
        y.data_ptr(),
        conv_out.data_ptr(),
        ssm_out.data_ptr(),
        *[int(v) for v in sizes],
        int(z_offset),
        int(xbc_offset),
        int(dt_offset),
        int(norm_group_size),
        activation_code("ssd_mixer", activation),
        int(bool(dt_softplus)),
        int(bool(norm_before_gate)),
        float(dt_min),
        math.inf if dt_max is None else float(dt_max),
        float(eps),
        torch.get_num_threads(),
    )
    return y.to(zxbcdt.dtype), conv_out, ssm_out


@cpp_kernel("ssd_mixer", verified=True)
def _ssd_mixer(
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
):
    return _run(
        False,
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
    )


@cpp_kernel("ssd_mixer")
def ssd_mixer_cpu(
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
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_ssd_mixer_args(
        "ssd_mixer",
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
        conv_state,
        ssm_state,
        time_axis=True,
    )
    return _ssd_mixer(
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
    )


@cpp_kernel("ssd_mixer_step", verified=True)
def _ssd_mixer_step(
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
):
    return _run(
        True,
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
    )


@cpp_kernel("ssd_mixer_step")
def ssd_mixer_step_cpu(
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
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_ssd_mixer_args(
        "ssd_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
    )
    return _ssd_mixer_step(
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
    )




def _run_mamba(
    step,
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
):
    s = mamba_mixer_sizes(conv_weight, x_proj_weight, dt_proj_weight, A)
    batch, width, d = zx.shape[0], zx.shape[-1], s["channels"]
    y = torch.empty(*zx.shape[:-1], d, dtype=torch.float32)
    conv_out = torch.empty(batch, d, s["width"] - 1, dtype=torch.float32)
    ssm_out = torch.empty(batch, d, s["state"], dtype=torch.float32)
    x_proj = mixer_weight_args(x_proj_weight, x_proj_scale)
    dt_proj = mixer_weight_args(dt_proj_weight, dt_proj_scale)
    inputs = [as_f32(t) for t in (zx, conv_weight, conv_bias)]  # held until the call returns
    inputs += [x_proj[0], dt_proj[0]]
    inputs += [as_f32(t) for t in (A, D, dt_bias, conv_state, ssm_state)]
    sizes = [batch] if step else [batch, zx.shape[1]]
    call_kernel(
        "ssmcc_mamba_mixer_step_f32" if step else "ssmcc_mamba_mixer_f32",
        *[pointer(t) for t in inputs],
        y.data_ptr(),
        conv_out.data_ptr(),
        ssm_out.data_ptr(),
        *sizes,
        width,
        int(x_offset),
        int(z_offset),
        d,
        s["width"],
        s["rank"],
        s["state"],
        activation_code("mamba_mixer", activation),
        int(bool(delta_softplus)),
        int(bcdt_rms_eps is not None),
        float(bcdt_rms_eps or 0.0),
        pointer(x_proj[1]),
        *x_proj[2:],
        pointer(dt_proj[1]),
        *dt_proj[2:],
        torch.get_num_threads(),
    )
    return y.to(zx.dtype), conv_out, ssm_out


@cpp_kernel("mamba_mixer", verified=True)
def _mamba_mixer(
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
    return _run_mamba(
        False,
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
        x_proj_scale,
        dt_proj_scale,
    )


@cpp_kernel("mamba_mixer")
def mamba_mixer_cpu(
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
    """Checked entry point: the op's shape rules, then the kernel."""
    check_mamba_mixer_args(
        "mamba_mixer",
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
        conv_state,
        ssm_state,
        time_axis=True,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    return _mamba_mixer(
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
        x_proj_scale,
        dt_proj_scale,
    )


@cpp_kernel("mamba_mixer_step", verified=True)
def _mamba_mixer_step(
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
):
    return _run_mamba(
        True,
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
        x_proj_scale,
        dt_proj_scale,
    )


@cpp_kernel("mamba_mixer_step")
def mamba_mixer_step_cpu(
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
):
    """Checked entry point: the op's shape rules, then the kernel."""
    check_mamba_mixer_args(
        "mamba_mixer_step",
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
        conv_state,
        ssm_state,
        time_axis=False,
        x_proj_scale=x_proj_scale,
        dt_proj_scale=dt_proj_scale,
    )
    return _mamba_mixer_step(
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
        x_proj_scale,
        dt_proj_scale,
    )


