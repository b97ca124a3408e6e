"""Differential fuzzing of the ssmcc ops: every path against a float64 oracle.

A case is drawn from a seeded generator (``draw(op, seed)``): random sizes including 1, 0-length
sequences and odd sizes, B and C grouped independently (shared, grouped by any divisor of d, one
group per channel), optional inputs on and off, softplus on and off, extreme dt bias (+-10),
input dtypes float32 / bfloat16 / float16 / float64, non-contiguous inputs, and now and then a
long sequence (300-2048). The oracle computes the op's math (the docstrings of ``ssmcc/ops``) in
float64 from the same, already rounded, inputs. Paths:

    reference   the op library's PyTorch reference (``ssmcc.ops.*_ref``)
    cpp         the C++ kernel through its checked torch entry (``kernels/cpu/torch_binding.py``)
    ort-lib     the op as one ssmcc ONNX node in ONNX Runtime with the ssmcc custom-op library
    portable    the same node in stock ONNX Runtime, i.e. its model-local function body

The ONNX paths take the node form of the op (``lowering/onnx/schemas.py``): neutral values for
absent inputs and B/C brought to one group count, as the emitters do; they skip 0-length cases
(ssmcc never feeds an ONNX graph an empty sequence: prompts have at least one token).

Tolerances (FACTS.md, mamba_ssm's tests), by output dtype: scan and conv rtol 6e-4 / atol 2e-3,
state update 3e-4 / 1e-3 in float32 and float64; bfloat16 3e-2 / 5e-2; float16 3e-3 / 5e-3.

``python -m tests.fuzzing --cases N [--paths cpp,ort-lib] [--ops ...]`` runs the corpus outside
pytest and exits 1 on the first mismatch (``tests/test_fuzz_sanitized.py`` runs it with the
sanitizer-built kernels).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F

OPS = ("selective_scan", "selective_state_update", "causal_conv1d", "causal_conv1d_update")
PATHS = ("reference", "cpp", "ort-lib", "portable")
TOLERANCES = {  # (op family, output dtype) -> (rtol, atol)
    ("scan", torch.float32): (6e-4, 2e-3),
    ("step", torch.float32): (3e-4, 1e-3),
    ("scan", torch.bfloat16): (3e-2, 5e-2),
    ("step", torch.bfloat16): (3e-2, 5e-2),
    ("scan", torch.float16): (3e-3, 5e-3),
    ("step", torch.float16): (5e-3, 1e-2),
}
DIMS = (1, 2, 3, 5, 6, 8, 12, 13, 16, 24, 31, 40)
STATES = (1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 32)  # 4/8/16/32 take the kernel's fixed-size path
LENGTHS = (0, 1, 1, 2, 3, 5, 7, 8, 16, 17, 33, 64)
LONG_LENGTHS = (300, 1000, 2048)


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


# -- drawing cases ----------------------------------------------------------------------------
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
    else:
        width = rng.choice((1, 2, 3, 4, 4, 5))
        activation = rng.choice((None, "silu", "swish"))
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


# -- the float64 oracle -----------------------------------------------------------------------
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


def oracle(case: Case) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's outputs in float64."""
    a = {k: _f64(v) if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
    if case.op == "selective_scan":
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
    if case.op == "selective_state_update":
        dim = a["state"].shape[1]
        dt = _dt(a["dt"], a["dt_bias"], a["dt_softplus"])
        B, C = (_per_channel(a[k], dim, 3) for k in "BC")
        new = torch.exp(dt[..., None] * a["A"]) * a["state"] + (dt * a["x"])[..., None] * B
        y = (new * C).sum(-1)
        y = y if a["D"] is None else y + a["D"] * a["x"]
        return _gate(y, a["z"]), new
    x, weight = a["x"], a["weight"]
    width = weight.shape[1]
    if case.op == "causal_conv1d":
        previous = a["initial_state"]
        if previous is None:
            previous = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    else:
        previous, x = a["conv_state"], x[..., None]
    xs = torch.cat([previous, x], -1)
    length = x.shape[-1]
    out = sum(weight[:, j, None] * xs[..., j : j + length] for j in range(width))
    out = out if a["bias"] is None else out + a["bias"][:, None]
    out = out * torch.sigmoid(out) if a["activation"] else out
    state = xs[..., xs.shape[-1] - (width - 1) :]
    return (out[..., 0], state) if case.op == "causal_conv1d_update" else (out, state)


# -- paths --------------------------------------------------------------------------------------
def run_reference(case: Case):
    from ssmcc.ops import SSMCC_REFERENCES

    return SSMCC_REFERENCES[case.op](**case.args)


def run_cpp(case: Case):
    from ssmcc.kernels.cpu import torch_binding

    return torch_binding.KERNELS[case.op](**case.args)


_NODES = {  # op -> (ONNX op type, node inputs, attribute of each flag)
    "selective_scan": (
        "SelectiveScan",
        ("u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_state"),
    ),
    "selective_state_update": (
        "SelectiveStateUpdate",
        ("state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"),
    ),
    "causal_conv1d": ("CausalConv1d", ("x", "weight", "bias", "initial_state")),
    "causal_conv1d_update": ("CausalConv1dUpdate", ("x", "conv_state", "weight", "bias")),
}


def _common_groups(B: torch.Tensor, C: torch.Tensor, grouped_rank: int):
    """B and C at the least common multiple of their group counts (the emitters' form)."""
    as_grouped = lambda t: t.unsqueeze(1) if t.dim() == grouped_rank - 1 else t  # noqa: E731
    B, C = as_grouped(B), as_grouped(C)
    target = math.lcm(B.shape[1], C.shape[1])
    return tuple(t.repeat_interleave(target // t.shape[1], dim=1) for t in (B, C))


def node_form(case: Case) -> tuple[dict, dict]:
    """(inputs as float32 arrays, attributes) of the op's ONNX node."""
    a = {k: v.float() if isinstance(v, torch.Tensor) else v for k, v in case.args.items()}
    if case.op in ("selective_scan", "selective_state_update"):
        scan = case.op == "selective_scan"
        main, prefix = ("u", "delta") if scan else ("x", "dt")
        bias = f"{prefix}_bias"
        dim, n = a["A"].shape
        a["B"], a["C"] = _common_groups(a["B"], a["C"], 4 if scan else 3)
        softplus = f"{prefix}_softplus"
        attrs = {softplus: int(a[softplus]), "has_z": int(a["z"] is not None)}
        a["D"] = torch.zeros(dim) if a["D"] is None else a["D"]
        a["z"] = a[main] if a["z"] is None else a["z"]
        a[bias] = torch.zeros(dim) if a[bias] is None else a[bias]
        if scan and a["initial_state"] is None:
            a["initial_state"] = torch.zeros(a["u"].shape[0], dim, n)
    else:
        dim, width = a["weight"].shape
        attrs = {"activation": int(a["activation"] is not None)}
        a["bias"] = torch.zeros(dim) if a["bias"] is None else a["bias"]
        if case.op == "causal_conv1d" and a["initial_state"] is None:
            a["initial_state"] = torch.zeros(a["x"].shape[0], dim, width - 1)
    names = _NODES[case.op][1]
    return {k: np.ascontiguousarray(a[k].numpy()) for k in names}, attrs


_SESSIONS: dict = {}


def _session(op: str, attrs: dict, width: int | None, library: bool):
    key = (op, tuple(sorted(attrs.items())), width, library)
    if key not in _SESSIONS:
        import onnxruntime as ort
        from onnx import TensorProto, helper

        from ssmcc.lowering.onnx import functions
        from ssmcc.lowering.onnx.export import OPSET
        from ssmcc.lowering.onnx.runtime import custom_op_library
        from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

        op_type, inputs = _NODES[op]
        function = {
            "selective_scan": lambda: functions.selective_scan_function(OPSET),
            "selective_state_update": lambda: functions.selective_state_update_function(OPSET),
            "causal_conv1d": lambda: functions.causal_conv1d_function(OPSET, width),
            "causal_conv1d_update": lambda: functions.causal_conv1d_update_function(OPSET),
        }[op]()
        value = lambda name, rank: helper.make_tensor_value_info(  # noqa: E731
            name, TensorProto.FLOAT, [f"{name}_{axis}" for axis in range(rank)]
        )
        ranks = _RANKS[op]
        node = helper.make_node(op_type, list(inputs), ["out", "state_out"], domain=DOMAIN, **attrs)
        graph = helper.make_graph(
            [node],
            f"fuzz_{op}",
            [value(name, ranks[name]) for name in inputs],
            [value("out", ranks["out"]), value("state_out", ranks["state_out"])],
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, VERSION)],
            functions=[function],
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = 2
        if library:
            path = custom_op_library("auto")
            assert path is not None, "the ssmcc ORT library does not build here"
            options.register_custom_ops_library(path)
        _SESSIONS[key] = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
    return _SESSIONS[key]


_RANKS = {
    "selective_scan": dict(
        u=3, delta=3, A=2, B=4, C=4, D=1, z=3, delta_bias=1, initial_state=3, out=3, state_out=3
    ),
    "selective_state_update": dict(
        state=3, x=2, dt=2, A=2, B=3, C=3, D=1, z=2, dt_bias=1, out=2, state_out=3
    ),
    "causal_conv1d": dict(x=3, weight=2, bias=1, initial_state=3, out=3, state_out=3),
    "causal_conv1d_update": dict(x=2, conv_state=3, weight=2, bias=1, out=2, state_out=3),
}


def _run_onnx(case: Case, library: bool):
    feed, attrs = node_form(case)
    width = feed["weight"].shape[1] if "weight" in feed else None
    outputs = _session(case.op, attrs, width, library).run(None, feed)
    return tuple(torch.from_numpy(o) for o in outputs)


RUNNERS = {
    "reference": run_reference,
    "cpp": run_cpp,
    "ort-lib": lambda case: _run_onnx(case, library=True),
    "portable": lambda case: _run_onnx(case, library=False),
}


def applies(case: Case, path: str) -> bool:
    """Whether ``path`` takes this case (the ONNX graphs never see an empty sequence)."""
    sequence = {"selective_scan": "u", "causal_conv1d": "x"}.get(case.op)
    empty = sequence is not None and case.args[sequence].shape[-1] == 0
    return not (empty and path in ("ort-lib", "portable"))


def check(case: Case, path: str) -> str | None:
    """None when ``path`` matches the oracle on ``case``, else what differs."""
    expected = oracle(case)
    try:
        got = RUNNERS[path](case)
    except Exception as error:  # a path that refuses a valid case is a finding too
        return f"{path} raised {type(error).__name__}: {str(error).strip()[:300]}"
    family = "step" if case.op == "selective_state_update" else "scan"
    for name, g, e in zip(("out", "state"), got, expected, strict=True):
        dtype = g.dtype if g.dtype in (torch.bfloat16, torch.float16) else torch.float32
        rtol, atol = TOLERANCES[family, dtype]
        if tuple(g.shape) != tuple(e.shape):
            return f"{path}: {name} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        try:
            torch.testing.assert_close(g.double(), e, rtol=rtol, atol=atol)
        except AssertionError as error:
            return f"{path}: {name} differs: {str(error).strip().splitlines()[-3:]}"
    return None


def run(ops, paths, cases: int, first_seed: int = 0, compare: bool = True) -> list[str]:
    """Every (op, path) on ``cases`` cases; the failures, each with its case. Without
    ``compare`` the paths only run (what a sanitizer run needs: it reports bad accesses itself,
    and the values were compared in an uninstrumented run)."""
    failures = []
    for op in ops:
        for seed in range(first_seed, first_seed + cases):
            case = draw(op, seed)
            for path in paths:
                if not applies(case, path):
                    continue
                if compare:
                    problem = check(case, path)
                else:
                    try:
                        RUNNERS[path](case)
                        problem = None
                    except Exception as error:
                        problem = f"{path} raised {type(error).__name__}: {error}"
                if problem is not None:
                    failures.append(f"{case.describe()}\n    {problem}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per op")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument(
        "--no-compare", action="store_true", help="only run the paths (for a sanitizer run)"
    )
    args = parser.parse_args(argv)
    from ssmcc.kernels.cpu.build import build_ort_library, build_torch_kernels, sanitizing

    print(f"kernels: {build_torch_kernels()}, {build_ort_library()}; sanitized: {sanitizing()}")
    failures = run(
        args.ops.split(","), args.paths.split(","), args.cases, args.first_seed, not args.no_compare
    )
    for failure in failures[:20]:
        print(failure)
    print(f"fuzz: {len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
