"""The float64 oracle of the fuzz cases: each op's math (``ssmcc/ops`` docstrings), written
independently of the op library, from the same already rounded inputs."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ssmcc.ops.activations import NAMES

from .fuzz_cases import Case


def _f64(tensor):
    return None if tensor is None else tensor.double()


def _per_channel(tensor: torch.Tensor, dim: int, grouped_rank: int) -> torch.Tensor:
    """B/C with one row per channel: channel c reads group c * g // d (shared: the only one)."""
    if tensor.dim() == grouped_rank - 1:
        return tensor.unsqueeze(1).expand(-1, dim, *tensor.shape[1:])
    return tensor[:, torch.arange(dim) * tensor.shape[1] // dim]


def _dt(delta, bias, softplus):
    dt = delta if bias is None else delta + (bias[:, None] if delta.dim() == 3 else bias)
    return F.softplus(dt) if softplus else dt


def _gate(y, z):
    return y if z is None else y * z * torch.sigmoid(z)


def _ssd(op: str, a: dict):
    """h_t = exp(dt A) h + dt x B (per head, B/C of the head's group), y = C.h + D x, gated."""
    x = a["x"]
    if op == "ssd_state_update":  # one position of the scan, from the given state
        x, dt, B, C = x[:, None], a["dt"][:, None], a["B"][:, None], a["C"][:, None]
        z = None if a["z"] is None else a["z"][:, None]
        h = a["state"]
    else:
        dt, B, C, z, h = a["dt"], a["B"], a["C"], a["z"], a["initial_state"]
    batch, length, heads, head_dim = x.shape
    if h is None:
        h = torch.zeros(batch, heads, head_dim, B.shape[-1], dtype=torch.float64)
    group_of_head = torch.arange(heads) * B.shape[2] // heads
    B, C = B[:, :, group_of_head], C[:, :, group_of_head]  # (b, l, h, n)
    dt = dt if a["dt_bias"] is None else dt + a["dt_bias"]
    dt = (F.softplus(dt) if a["dt_softplus"] else dt).clamp(a["dt_min"], a["dt_max"])
    D = a["D"]
    ys = []
    for step in range(length):
        decay = torch.exp(dt[:, step] * a["A"])[:, :, None, None]
        h = decay * h + (dt[:, step, :, None] * x[:, step])[..., None] * B[:, step, :, None, :]
        y = (h * C[:, step, :, None, :]).sum(-1)
        if D is not None:
            y = y + (D[:, None] if D.dim() == 1 else D) * x[:, step]
        ys.append(_gate(y, None if z is None else z[:, step]))
    out = torch.stack(ys, 1) if ys else x.new_zeros(x.shape)
    return (out[:, 0] if op == "ssd_state_update" else out), h


def _norm(a: dict):
    x, z, gs = a["x"], a["z"], a["group_size"]
    gate = None if z is None else z * torch.sigmoid(z)
    h = x * gate if gate is not None and not a["norm_before_gate"] else x
    grouped = h.unflatten(-1, (h.shape[-1] // gs, gs))
    grouped = grouped / torch.sqrt((grouped * grouped).mean(-1, keepdim=True) + a["eps"])
    out = grouped.flatten(-2) * a["weight"]
    return (out * gate if gate is not None and a["norm_before_gate"] else out,)


def _selective_scan(a: dict):
    batch, dim, length = a["u"].shape
    dt = _dt(a["delta"], a["delta_bias"], a["delta_softplus"])
    B, C = (_per_channel(a[k], dim, 4) for k in "BC")
    h = a["initial_state"]
    h = torch.zeros(batch, dim, a["A"].shape[1], dtype=torch.float64) if h is None else h
    ys = []
    for step in range(length):
        h = (
            torch.exp(dt[..., step, None] * a["A"]) * h
            + (dt[..., step] * a["u"][..., step])[..., None] * B[..., step]
        )
        ys.append((h * C[..., step]).sum(-1))
    y = torch.stack(ys, -1) if ys else a["u"].new_zeros(batch, dim, 0)
    y = y if a["D"] is None else y + a["D"][:, None] * a["u"]
    return _gate(y, a["z"]), h


def _selective_state_update(a: dict):
    dim = a["state"].shape[1]
    dt = _dt(a["dt"], a["dt_bias"], a["dt_softplus"])
    B, C = (_per_channel(a[k], dim, 3) for k in "BC")
    new = torch.exp(dt[..., None] * a["A"]) * a["state"] + (dt * a["x"])[..., None] * B
    y = (new * C).sum(-1)
    y = y if a["D"] is None else y + a["D"] * a["x"]
    return _gate(y, a["z"]), new


def oracle(case: Case) -> tuple[torch.Tensor, ...]:
    """The op's outputs in float64."""
    a = {k: _f64(v) if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
    if case.op in ("ssd_scan", "ssd_state_update"):
        return _ssd(case.op, a)
    if case.op in ("ssd_mixer", "ssd_mixer_step"):
        return _mixer(case.op, a)
    if case.op in ("mamba_mixer", "mamba_mixer_step"):
        return _mamba_mixer(case.op, a)
    single = {
        "rmsnorm_gated": _norm,
        "selective_scan": _selective_scan,
        "selective_state_update": _selective_state_update,
    }
    return single[case.op](a) if case.op in single else _conv(case.op, a)


def _rms(v, eps):
    return v / torch.sqrt((v * v).mean(-1, keepdim=True) + eps)


def _projection(a: dict, name: str):
    """A mixer's projection weight W: as given, or ``weight * scale`` per group of columns."""
    weight, scale = a[f"{name}_weight"], a.get(f"{name}_scale")
    if scale is None:
        return weight
    rows, cols = weight.shape
    return (weight.reshape(rows, scale.shape[1], -1) * scale[..., None]).reshape(rows, cols)


def _mamba_mixer(op: str, a: dict):
    """Conv on the x slice, x_proj, [R, n, n] split (normed when asked), dt_proj, the scan gated
    by the z slice; y token-major."""
    step = op == "mamba_mixer_step"
    proj = a["zx"] if not step else a["zx"][:, None]  # (b, l, w)
    batch = proj.shape[0]
    channels, width = a["conv_weight"].shape
    rank, state = a["dt_proj_weight"].shape[1], a["A"].shape[1]
    take = lambda at: proj[..., at : at + channels].transpose(1, 2)  # noqa: E731
    conv_state = a["conv_state"]
    if conv_state is None:
        conv_state = torch.zeros(batch, channels, width - 1, dtype=torch.float64)
    xc, conv_last = _conv(
        "causal_conv1d",
        dict(
            x=take(a["x_offset"]),
            weight=a["conv_weight"],
            bias=a["conv_bias"],
            initial_state=conv_state,
            activation=a["activation"],
        ),
    )
    x_proj, dt_proj = (_projection(a, name) for name in ("x_proj", "dt_proj"))
    dt_r, B, C = (xc.transpose(1, 2) @ x_proj.T).split([rank, state, state], -1)
    if a["bcdt_rms_eps"] is not None:
        dt_r, B, C = (_rms(v, a["bcdt_rms_eps"]) for v in (dt_r, B, C))
    dt = (dt_r @ dt_proj.T).transpose(1, 2)
    z = None if a["z_offset"] < 0 else take(a["z_offset"])
    y, h = _selective_scan(
        dict(
            u=xc,
            delta=dt,
            A=a["A"],
            B=B.transpose(1, 2)[:, None],
            C=C.transpose(1, 2)[:, None],
            D=a["D"],
            z=z,
            delta_bias=a["dt_bias"],
            delta_softplus=a["delta_softplus"],
            initial_state=a["ssm_state"],
        )
    )
    y = y.transpose(1, 2)
    return (y[:, 0] if step else y), conv_last, h


def _activate(x, name):
    """The activation ``name`` in float64, written from ``ssmcc.ops.activations``'s table (its
    names -> forms; the math here is the table's, not the reference's)."""
    form = NAMES[name]
    if form == "silu":
        return x * torch.sigmoid(x)
    if form == "gelu":
        return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))
    if form == "gelu_tanh":
        return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    if form in ("relu", "relu2"):
        return x.clamp(min=0) ** (1 if form == "relu" else 2)
    assert form == "identity", form
    return x


def _conv(op: str, a: dict):
    x, weight = a["x"], a["weight"]
    width = weight.shape[1]
    if op == "causal_conv1d":
        previous = a["initial_state"]
        if previous is None:
            previous = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    else:
        previous, x = a["conv_state"], x[..., None]
    xs = torch.cat([previous, x], -1)
    length = x.shape[-1]
    out = sum(weight[:, j, None] * xs[..., j : j + length] for j in range(width))
    out = out if a["bias"] is None else out + a["bias"][:, None]
    out = _activate(out, a["activation"])
    state = xs[..., xs.shape[-1] - (width - 1) :]
    return (out[..., 0], state) if op == "causal_conv1d_update" else (out, state)


def _mixer(op: str, a: dict):
    """The mixer's chain: conv on the xBC slice, SSD on its split, gated norm with the z slice."""
    step = op == "ssd_mixer_step"
    proj = a["zxbcdt"] if not step else a["zxbcdt"][:, None]  # (b, l, w)
    batch, length = proj.shape[:2]
    heads, inner = a["A"].shape[0], a["norm_weight"].shape[0]
    channels, width = a["conv_weight"].shape
    gn = (channels - inner) // 2
    take = lambda at, size: proj[..., at : at + size]  # noqa: E731
    conv_state = a["conv_state"]
    if conv_state is None:
        conv_state = torch.zeros(batch, channels, width - 1, dtype=torch.float64)
    conv_args = dict(
        x=take(a["xbc_offset"], channels).transpose(1, 2),
        weight=a["conv_weight"],
        bias=a["conv_bias"],
        initial_state=conv_state,
        activation=a["activation"],
    )
    xbc, conv_last = _conv("causal_conv1d", conv_args)
    xbc = xbc.transpose(1, 2)
    groups = a["groups"]
    ssd_args = dict(
        x=xbc[..., :inner].unflatten(-1, (heads, inner // heads)),
        dt=take(a["dt_offset"], heads),
        A=a["A"],
        B=xbc[..., inner : inner + gn].unflatten(-1, (groups, gn // groups)),
        C=xbc[..., inner + gn :].unflatten(-1, (groups, gn // groups)),
        D=a["D"],
        z=None,
        dt_bias=a["dt_bias"],
        dt_softplus=a["dt_softplus"],
        dt_min=a["dt_min"],
        dt_max=a["dt_max"] if a["dt_max"] is not None else float("inf"),
        initial_state=a["ssm_state"],
    )
    y, ssm_last = _ssd("ssd_scan", ssd_args)
    z = None if a["z_offset"] < 0 else take(a["z_offset"], inner)
    (out,) = _norm(
        dict(
            x=y.flatten(-2),
            z=z,
            weight=a["norm_weight"],
            group_size=a["norm_group_size"],
            eps=a["eps"],
            norm_before_gate=a["norm_before_gate"],
        )
    )
    return (out[:, 0] if step else out), conv_last, ssm_last
