"""Seeded fuzz cases of the ssmcc ops (``draw(op, seed)``): see ``fuzzing.py``."""

from __future__ import annotations

import dataclasses
import random

import torch

DIMS = (1, 2, 3, 5, 6, 8, 12, 13, 16, 24, 31, 40)
STATES = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32)  # 4/8/16/32 take the kernel's fixed-size path
LENGTHS = (0, 1, 1, 2, 3, 5, 7, 8, 16, 17, 33, 64)
LONG_LENGTHS = (300, 1000, 2048)
# The conv's activation (``ssmcc.ops.activations``): every form, under several of its names.
ACTIVATIONS = (None, "silu", "swish", "gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "relu")
ACTIVATIONS += ("relu2", "linear")


@dataclasses.dataclass
class Case:
    op: str
    seed: int
    args: dict  # the op's keyword arguments
    dtype: torch.dtype

    def describe(self) -> str:
        parts = []
        for name, value in self.args.items():
            if isinstance(value, torch.Tensor):
                layout = "" if value.is_contiguous() else " strided"
                parts.append(f"{name}{tuple(value.shape)}{layout}")
            elif value not in (None, False):
                parts.append(f"{name}={value}")
        return f"{self.op} seed {self.seed} [{str(self.dtype).removeprefix('torch.')}]: " + (
            ", ".join(parts)
        )


def _groups(rng: random.Random, dim: int) -> int | None:
    """None: shared by every channel; else a group count dividing dim (1 .. dim)."""
    choice = rng.random()
    if choice < 0.35:
        return None
    if choice < 0.5:
        return 1
    if choice < 0.65:
        return dim
    return rng.choice([g for g in range(1, dim + 1) if dim % g == 0])


def _dtype(rng: random.Random) -> torch.dtype:
    return rng.choices(
        [torch.float32, torch.bfloat16, torch.float16, torch.float64], [0.7, 0.1, 0.1, 0.1]
    )[0]


class _Tensors:
    """Seeded tensors in the case's dtype, some of them non-contiguous (same values)."""

    def __init__(self, rng: random.Random, dtype: torch.dtype):
        self.rng, self.dtype = rng, dtype
        self.generator = torch.Generator().manual_seed(rng.getrandbits(62))

    def randn(self, *shape, scale: float = 1.0) -> torch.Tensor:
        return self._finish(
            torch.randn(*shape, generator=self.generator, dtype=torch.float64) * scale
        )

    def uniform(self, *shape, low: float, high: float) -> torch.Tensor:
        values = torch.rand(*shape, generator=self.generator, dtype=torch.float64)
        return self._finish(values * (high - low) + low)

    def maybe(self, probability: float, make):
        return make() if self.rng.random() < probability else None

    def _finish(self, values: torch.Tensor) -> torch.Tensor:
        tensor = values.to(self.dtype)
        if tensor.dim() >= 2 and self.rng.random() < 0.15:
            tensor = tensor.mT.contiguous().mT  # same values, transposed strides
        return tensor


def _dt_bias(t: _Tensors, dim: int, softplus: bool) -> torch.Tensor | None:
    """None, moderate, or extreme (+-10: softplus gives ~10 or ~4.5e-5). Without softplus dt
    stays >= 0, as in every Mamba model (else exp(dt * A) > 1 grows past float32)."""
    kind = t.rng.random()
    if kind < 0.4:
        return None
    if kind < 0.8:
        return t.uniform(dim, low=-1.0 if softplus else 0.0, high=1.0)
    extremes = (-10.0, 10.0) if softplus else (10.0,)
    values = torch.tensor([t.rng.choice(extremes) for _ in range(dim)], dtype=torch.float64)
    return values.to(t.dtype)


def _scan_inputs(t: _Tensors, batch, dim, n, length, softplus) -> dict:
    """Shared by the scan and its one-step form (``length`` None: no time axis)."""
    time = () if length is None else (length,)
    groups_b, groups_c = _groups(t.rng, dim), _groups(t.rng, dim)
    bc = lambda g: (batch, n, *time) if g is None else (batch, g, n, *time)  # noqa: E731
    delta = t.randn(batch, dim, *time)
    if not softplus:  # dt >= 0 as in every Mamba model: exp(dt * A) <= 1, nothing explodes
        delta = delta.abs() * 0.5
    return dict(
        delta=delta,
        A=-torch.exp(t.randn(dim, n, scale=0.7).double()).to(t.dtype),
        B=t.randn(*bc(groups_b)),
        C=t.randn(*bc(groups_c)),
        D=t.maybe(0.5, lambda: t.randn(dim)),
        z=t.maybe(0.5, lambda: t.randn(batch, dim, *time)),
    )


def draw(op: str, seed: int) -> Case:
    """The ``seed``-th case of ``op``."""
    rng = random.Random(f"{op}:{seed}")
    dtype = _dtype(rng)
    t = _Tensors(rng, dtype)
    batch, dim = rng.choice((1, 1, 2, 3)), rng.choice(DIMS)
    length = rng.choice(LONG_LENGTHS) if rng.random() < 0.03 else rng.choice(LENGTHS)
    if op == "selective_scan":
        n, softplus = rng.choice(STATES), rng.random() < 0.6
        args = dict(
            u=t.randn(batch, dim, length), **_scan_inputs(t, batch, dim, n, length, softplus)
        )
        args.update(
            delta_bias=_dt_bias(t, dim, softplus),
            delta_softplus=softplus,
            initial_state=t.maybe(0.5, lambda: t.randn(batch, dim, n)),
        )
    elif op == "selective_state_update":
        n, softplus = rng.choice(STATES), rng.random() < 0.6
        inputs = _scan_inputs(t, batch, dim, n, None, softplus)
        args = dict(
            state=t.randn(batch, dim, n, scale=3.0),
            x=t.randn(batch, dim),
            dt=inputs.pop("delta"),
            **inputs,
            dt_bias=_dt_bias(t, dim, softplus),
            dt_softplus=softplus,
        )
    elif op in ("ssd_scan", "ssd_state_update"):
        args = _ssd_args(t, op, batch, length)
    elif op == "rmsnorm_gated":
        args = _norm_args(t)
    elif op in ("ssd_mixer", "ssd_mixer_step"):
        args = _mixer_args(t, op, batch, length)
    elif op in ("mamba_mixer", "mamba_mixer_step"):
        args = _mamba_mixer_args(t, op, batch, dim, length)
    else:
        width = rng.choice((1, 2, 3, 4, 4, 5))
        activation = rng.choice(ACTIVATIONS)
        common = dict(weight=t.randn(dim, width), bias=t.maybe(0.5, lambda: t.randn(dim)))
        if op == "causal_conv1d":
            args = dict(
                x=t.randn(batch, dim, length),
                **common,
                initial_state=t.maybe(0.5, lambda: t.randn(batch, dim, width - 1)),
                activation=activation,
            )
        else:
            args = dict(
                x=t.randn(batch, dim),
                conv_state=t.randn(batch, dim, width - 1),
                **common,
                activation=activation,
            )
    return Case(op, seed, args, dtype)


HEADS = (1, 2, 3, 4, 6, 8, 11)
HEAD_DIMS = (1, 2, 3, 5, 8, 16, 19)
SSD_STATES = (1, 2, 5, 7, 16, 32)


def _ssd_args(t: _Tensors, op: str, batch: int, length: int) -> dict:
    """Mamba-2 head layout: x (b, [l,] h, p), dt (b, [l,] h), A (h,), B = C shape (b, [l,] g, n),
    D absent / (h,) / (h, p); now and then a dt clamp that binds."""
    rng = t.rng
    heads, head_dim, n = rng.choice(HEADS), rng.choice(HEAD_DIMS), rng.choice(SSD_STATES)
    groups = rng.choice([g for g in range(1, heads + 1) if heads % g == 0])
    time = (length,) if op == "ssd_scan" else ()
    softplus = rng.random() < 0.7
    dt = t.randn(batch, *time, heads)
    if not softplus:
        dt = dt.abs() * 0.5
    D_shape = rng.choice([None, (heads,), (heads, head_dim)])
    clamp = (
        (0.0, float("inf")) if rng.random() < 0.8 else (rng.uniform(0, 0.05), rng.uniform(0.3, 2))
    )
    args = dict(
        x=t.randn(batch, *time, heads, head_dim),
        dt=dt,
        A=-torch.exp(t.randn(heads, scale=0.7).double()).to(t.dtype),
        B=t.randn(batch, *time, groups, n),
        C=t.randn(batch, *time, groups, n),
        D=None if D_shape is None else t.randn(*D_shape),
        z=t.maybe(0.5, lambda: t.randn(batch, *time, heads, head_dim)),
        dt_bias=_dt_bias(t, heads, softplus),
        dt_softplus=softplus,
        dt_min=clamp[0],
        dt_max=clamp[1],
    )
    state = t.maybe(0.5 if op == "ssd_scan" else 1.0, lambda: t.randn(batch, heads, head_dim, n))
    if op == "ssd_scan":
        args["initial_state"] = state
    else:
        args = {"state": state, **args}
    return args


def _mixer_args(t: _Tensors, op: str, batch: int, length: int) -> dict:
    """The fused Mamba-2 mixer: the projection output holds z (or no gate), xBC and dt in a
    random order with random gaps; the rest as for ssd_scan, a conv of width 1-5 and a grouped
    gated norm."""
    rng = t.rng
    heads, head_dim, n = rng.choice(HEADS), rng.choice(HEAD_DIMS), rng.choice(SSD_STATES)
    groups = rng.choice([g for g in range(1, heads + 1) if heads % g == 0])
    inner = heads * head_dim
    channels, width = inner + 2 * groups * n, rng.choice((1, 2, 3, 4, 4, 5))
    pieces = {"xBC": channels, "dt": heads}
    if rng.random() < 0.8:
        pieces["z"] = inner
    offsets, at = {}, 0
    for name in rng.sample(sorted(pieces), len(pieces)):
        at += rng.choice((0, 0, 1, 3))
        offsets[name], at = at, at + pieces[name]
    proj_width = at + rng.choice((0, 2))
    time = (length,) if op == "ssd_mixer" else ()
    softplus = rng.random() < 0.7
    proj = t.randn(batch, *time, proj_width)
    if not softplus:  # dt >= 0 without softplus (see _dt_bias)
        dt = slice(offsets["dt"], offsets["dt"] + heads)
        proj[..., dt] = proj[..., dt].abs() * 0.5
    clamp = (0.0, None) if rng.random() < 0.8 else (rng.uniform(0, 0.05), rng.uniform(0.3, 2))
    states = 0.5 if op == "ssd_mixer" else 1.0
    D_shape = rng.choice([None, (heads,), (heads, head_dim)])
    return dict(
        zxbcdt=proj,
        conv_weight=t.randn(channels, width, scale=0.5),
        conv_bias=t.maybe(0.5, lambda: t.randn(channels)),
        A=-torch.exp(t.randn(heads, scale=0.7).double()).to(t.dtype),
        D=None if D_shape is None else t.randn(*D_shape),
        dt_bias=_dt_bias(t, heads, softplus),
        norm_weight=t.randn(inner),
        groups=groups,
        z_offset=offsets.get("z", -1),
        xbc_offset=offsets["xBC"],
        dt_offset=offsets["dt"],
        norm_group_size=rng.choice([g for g in range(1, inner + 1) if inner % g == 0]),
        eps=rng.choice((1e-6, 1e-5)),
        norm_before_gate=rng.random() < 0.3,
        activation=rng.choice(ACTIVATIONS),
        dt_softplus=softplus,
        dt_min=clamp[0],
        dt_max=clamp[1],
        conv_state=t.maybe(states, lambda: t.randn(batch, channels, width - 1)),
        ssm_state=t.maybe(states, lambda: t.randn(batch, heads, head_dim, n)),
    )


def _mamba_mixer_args(t: _Tensors, op: str, batch: int, dim: int, length: int) -> dict:
    """The fused Mamba-1 mixer: x and (mostly) z in the projection output in a random order with
    random gaps; dt rank 1-8, a conv of width 1-5, FalconMamba's norms now and then; in a third
    of the cases x_proj and/or dt_proj stored small (``_stored_small``). Without softplus dt is
    kept >= 0 (dt_proj small, dt_bias in [0.5, 1])."""
    rng = t.rng
    n, rank, width = rng.choice(STATES), rng.choice((1, 2, 3, 5, 8)), rng.choice((1, 2, 3, 4, 5))
    pieces = ["x", "z"] if rng.random() < 0.8 else ["x"]
    offsets, at = {}, 0
    for name in rng.sample(pieces, len(pieces)):
        at += rng.choice((0, 0, 1, 3))
        offsets[name], at = at, at + dim
    softplus = rng.random() < 0.8
    time = (length,) if op == "mamba_mixer" else ()
    states = 0.5 if op == "mamba_mixer" else 1.0
    args = dict(
        zx=t.randn(batch, *time, at + rng.choice((0, 2))),
        conv_weight=t.randn(dim, width, scale=0.5),
        conv_bias=t.maybe(0.5, lambda: t.randn(dim)),
        x_proj_weight=t.randn(rank + 2 * n, dim, scale=0.3),
        dt_proj_weight=t.randn(dim, rank, scale=0.3 if softplus else 0.01),
        A=-torch.exp(t.randn(dim, n, scale=0.7).double()).to(t.dtype),
        D=t.maybe(0.5, lambda: t.randn(dim)),
        dt_bias=_dt_bias(t, dim, softplus) if softplus else t.uniform(dim, low=0.5, high=1.0),
        x_offset=offsets["x"],
        z_offset=offsets.get("z", -1),
        activation=rng.choice(ACTIVATIONS),
        delta_softplus=softplus,
        bcdt_rms_eps=rng.choice((None, None, 1e-6, 1e-5)),
        conv_state=t.maybe(states, lambda: t.randn(batch, dim, width - 1)),
        ssm_state=t.maybe(states, lambda: t.randn(batch, dim, n)),
    )
    if rng.random() < 0.35:
        for name in ("x_proj", "dt_proj"):
            if rng.random() < 0.75:
                stored, scale = _stored_small(rng, args[f"{name}_weight"])
                args[f"{name}_weight"], args[f"{name}_scale"] = stored, scale
    return args


def _stored_small(rng: random.Random, weight: torch.Tensor):
    """(stored, scale) of a projection weight (rows, cols): int8, symmetric per group of columns
    (the group count any divisor of cols: 1 is per row), or float16 / bfloat16 with unit scales."""
    rows, cols = weight.shape
    dense = weight.detach().float()
    dtype = rng.choice((torch.int8, torch.int8, torch.float16, torch.bfloat16))
    if dtype != torch.int8:
        return dense.to(dtype), torch.ones(rows, 1)
    groups = rng.choice([g for g in range(1, cols + 1) if cols % g == 0])
    grouped = dense.reshape(rows, groups, cols // groups)
    amax = grouped.abs().amax(-1)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    stored = torch.round(grouped / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return stored.reshape(rows, cols), scale


def _norm_args(t: _Tensors) -> dict:
    """x (..., d) of rank 1-4, d = group_size * groups, z absent or present, either order."""
    rng = t.rng
    group_size, groups = rng.choice((1, 2, 3, 5, 8, 16)), rng.choice((1, 2, 3, 4))
    leading = [rng.choice((1, 2, 3, 7)) for _ in range(rng.choice((0, 1, 2, 3)))]
    d = group_size * groups
    return dict(
        x=t.randn(*leading, d, scale=rng.choice((0.1, 1.0, 10.0))),
        z=t.maybe(0.6, lambda: t.randn(*leading, d)),
        weight=t.randn(d),
        group_size=group_size,
        eps=rng.choice((1e-6, 1e-5, 1e-3)),
        norm_before_gate=rng.random() < 0.5,
    )
