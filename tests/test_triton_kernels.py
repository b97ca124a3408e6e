"""The Triton kernels (``kernels/triton``) against the ops' references, in Triton's interpreter.

The fused and scan ops run the fuzz corpus (``fuzzing.py``: odd sizes, 0/1-length sequences,
grouped and mixed B/C, optional inputs on and off, non-contiguous inputs, float32 / bfloat16 /
float16 / float64 inputs) against its float64 oracle at mamba_ssm's tolerances, on sequences of
at most 64 positions: 5 cases per op by default and 25 more when slow (2 and 6 for the fused
mixers, whose parts are fuzzed on their own; ``SSMCC_TRITON_FUZZ_CASES=N`` for a deeper run).
The other ops (attention, MoE experts, quantised linear and embedding, positions) are checked
here against their references on odd shapes in float32 and float16.

bfloat16: the interpreter computes with numpy, which has no bfloat16. The kernels load every input
and widen it to float32 before any arithmetic, and the corpus's bfloat16 cases pass through the
interpreter that way — except the SSD scan's products, which multiply bfloat16 operands: there the
interpreter gets the operands rounded to bfloat16 and kept in float32 (``operands.py``); what
only a GPU can check is Triton's own compiled bfloat16 loads, stores and MMAs, listed in
``BF16_GPU_ONLY`` and run by ``benchmarks/gpu_check.py``.
"""

from __future__ import annotations

import inspect
import os

import pytest
import torch

from . import fuzzing

triton = pytest.importorskip(
    "triton", reason='Triton is an optional extra: pip install ".[triton]"'
)

from ssmcc.kernels.triton import catalog  # noqa: E402
from ssmcc.kernels.triton.registry import TRITON_KERNELS  # noqa: E402
from ssmcc.ops import SSMCC_OPS, SSMCC_REFERENCES  # noqa: E402
from ssmcc.ops.quantized_linear import quantize_weight  # noqa: E402

DEFAULT_CASES = 5
SLOW_CASES = int(os.environ.get("SSMCC_TRITON_FUZZ_CASES", "25"))
FUSED = {"ssd_mixer", "ssd_mixer_step", "mamba_mixer", "mamba_mixer_step"}  # their parts: above
BF16_GPU_ONLY = (
    "compiled bfloat16 loads and stores of every kernel (the interpreter widens through numpy)",
    "the SSD scan's bfloat16 tensor-core products (the interpreter rounds, then multiplies fp32)",
    "bfloat16 model end to end (dtype='bfloat16' on a GPU)",
)
F32 = dict(rtol=6e-4, atol=2e-3)  # mamba_ssm's scan tolerances
F16 = dict(rtol=3e-3, atol=5e-3)


def _fuzz(op: str, seeds) -> None:
    failures = []
    for seed in seeds:
        case = fuzzing.draw(op, seed)
        if fuzzing.applies(case, "triton") and (problem := fuzzing.check(case, "triton")):
            failures.append(f"{case.describe()}\n    {problem}")
    assert not failures, f"{len(failures)} cases differ:\n" + "\n".join(failures[:5])


@pytest.mark.parametrize("op", fuzzing.OPS)
def test_kernel_matches_the_oracle(op):
    _fuzz(op, range(DEFAULT_CASES // 2 if op in FUSED else DEFAULT_CASES))


@pytest.mark.slow
@pytest.mark.parametrize("op", fuzzing.OPS)
def test_kernel_matches_the_oracle_long_run(op):
    extra = SLOW_CASES // 4 if op in FUSED else SLOW_CASES
    _fuzz(op, range(DEFAULT_CASES, DEFAULT_CASES + extra))


def test_every_op_has_a_triton_kernel():
    assert set(TRITON_KERNELS) == set(SSMCC_OPS)
    for op, launcher in TRITON_KERNELS.items():
        file, name = catalog.launchers()[op]  # what coverage reads without importing Triton
        assert launcher.__name__ == name and launcher.__module__.endswith(file[:-3]), op
        # a launcher takes the op's arguments by the op's names (checked when registered)
        wanted = list(inspect.signature(SSMCC_REFERENCES[op]).parameters)
        have = list(inspect.signature(launcher).parameters)
        assert have[: len(wanted)] == wanted, op


def test_every_kernel_has_a_grid_rule():
    """The launchers' kernels, the captured decode's (``kv_pool.py``) and the TensorRT plugins'
    (``plugin_kernels.py``)."""
    from triton.runtime.jit import JITFunction

    from ssmcc.kernels.triton import kv_pool, plugin_kernels

    kernels = set()
    modules = [inspect.getmodule(launcher) for launcher in TRITON_KERNELS.values()]
    for module in [*modules, kv_pool, plugin_kernels]:
        kernels |= {n for n, v in vars(module).items() if isinstance(v, JITFunction)}
    assert kernels == set(catalog.GRID_RULES)


def _close(got, expected, dtype):
    tolerance = F32 if dtype == torch.float32 else F16
    torch.testing.assert_close(got.float(), expected.float(), **tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize(
    "heads,kv_heads,length,past,head_dim,value_dim",
    [(2, 1, 7, 0, 5, 5), (4, 2, 1, 13, 8, 8), (3, 3, 33, 5, 16, 13), (2, 2, 20, 0, 19, 19)],
)
def test_attention(dtype, heads, kv_heads, length, past, head_dim, value_dim):
    g = torch.Generator().manual_seed(length * 7 + past)
    q = torch.randn(2, heads, length, head_dim, generator=g).to(dtype)
    k = torch.randn(2, kv_heads, length, head_dim, generator=g).to(dtype)
    v = torch.randn(2, kv_heads, length, value_dim, generator=g).to(dtype)
    pk = torch.randn(2, kv_heads, past, head_dim, generator=g).to(dtype) if past else None
    pv = torch.randn(2, kv_heads, past, value_dim, generator=g).to(dtype) if past else None
    scale = head_dim**-0.5
    got = TRITON_KERNELS["attention"](q, k, v, scale, pk, pv)
    expected = SSMCC_REFERENCES["attention"](q, k, v, scale, pk, pv)
    for a, b in zip(got, expected, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype
        _close(a, b, dtype)


@pytest.mark.parametrize("scheme", [None, "int8", "int8-g32", "bf16"])
@pytest.mark.parametrize(
    "activation,gated", [("silu", True), ("gelu", False), ("gelu_tanh", True), ("relu2", False)]
)
def test_moe_experts(scheme, activation, gated):
    g = torch.Generator().manual_seed(len(activation))
    tokens, dim, width, experts, k = 5, 64, 32, 4, 2
    hidden = torch.randn(tokens, dim, generator=g)
    index = torch.randint(0, experts, (tokens, k), generator=g)
    index[1, 0] = experts  # an index outside the experts adds nothing
    weights = torch.rand(tokens, k, generator=g)
    up = torch.randn(experts, 2 * width if gated else width, dim, generator=g) / 8
    down = torch.randn(experts, dim, width, generator=g) / 8
    scales = {}
    if scheme is not None:
        pairs = [quantize_weight(w, scheme) for w in up]
        up, scales["up_scale"] = (
            torch.stack([p[0] for p in pairs]),
            torch.stack([p[1] for p in pairs]),
        )
        pairs = [quantize_weight(w, scheme) for w in down]
        down = torch.stack([p[0] for p in pairs])
        scales["down_scale"] = torch.stack([p[1] for p in pairs])
    args = (hidden, index, weights, up, down, activation, gated)
    got = TRITON_KERNELS["moe_experts"](*args, **scales)
    _close(got, SSMCC_REFERENCES["moe_experts"](*args, **scales), torch.float32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
@pytest.mark.parametrize("rows,inputs,outputs", [(1, 64, 5), (7, 96, 33), (20, 32, 17)])
def test_quantized_linear_and_embedding(dtype, scheme, rows, inputs, outputs):
    g = torch.Generator().manual_seed(rows + outputs)
    weight, scale = quantize_weight(torch.randn(outputs, inputs, generator=g), scheme)
    x = torch.randn(rows, inputs, generator=g).to(dtype)[:, :]
    bias = torch.randn(outputs, generator=g)
    got = TRITON_KERNELS["quantized_linear"](x, weight, scale, bias)
    _close(got, SSMCC_REFERENCES["quantized_linear"](x, weight, scale, bias), dtype)
    ids = torch.randint(0, outputs, (2, 3), generator=g)
    got = TRITON_KERNELS["quantized_embedding"](ids, weight, scale)
    assert torch.equal(got, SSMCC_REFERENCES["quantized_embedding"](ids, weight, scale))


@pytest.mark.parametrize("past", [None, [[0], [41]]])
@pytest.mark.parametrize("length", [1, 7, 300])
def test_positions(past, length):
    ids = torch.zeros(2, length, dtype=torch.int64)
    count = None if past is None else torch.tensor(past)
    got = TRITON_KERNELS["positions"](ids, count)
    for a, b in zip(got, SSMCC_REFERENCES["positions"](ids, count), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_selective_scan_chunks_pass_the_state_on(chunk):
    """Several chunks per sequence (the GPU's path: chunk 256) against the reference."""
    g = torch.Generator().manual_seed(chunk)
    b, d, n, length = 2, 13, 7, 37
    u, delta, z = (torch.randn(b, d, length, generator=g) for _ in range(3))
    A = -torch.rand(d, n, generator=g)
    B, C = torch.randn(b, n, length, generator=g), torch.randn(b, 1, n, length, generator=g)
    D, bias, h0 = torch.randn(d, generator=g), torch.randn(d, generator=g), torch.randn(b, d, n)
    args = (u, delta, A, B, C, D, z, bias, True, h0)
    got = TRITON_KERNELS["selective_scan"](*args, chunk=chunk)
    for a, e in zip(got, SSMCC_REFERENCES["selective_scan"](*args), strict=True):
        _close(a, e, torch.float32)


@pytest.mark.parametrize("chunk", [16, 32])
def test_ssd_scan_chunk_lengths(chunk):
    """SSD's block decomposition at two chunk lengths over a sequence that ends mid-chunk."""
    g = torch.Generator().manual_seed(chunk)
    b, length, h, p, groups, n = 2, 45, 4, 5, 2, 16
    x = torch.randn(b, length, h, p, generator=g)
    dt = torch.randn(b, length, h, generator=g)
    A = -torch.rand(h, generator=g)
    B, C = (torch.randn(b, length, groups, n, generator=g) for _ in range(2))
    args = (
        x,
        dt,
        A,
        B,
        C,
        torch.randn(h, p),
        None,
        torch.randn(h),
        True,
        0.0,
        None,
        torch.randn(b, h, p, n),
    )
    got = TRITON_KERNELS["ssd_scan"](*args, chunk=chunk)
    for a, e in zip(got, SSMCC_REFERENCES["ssd_scan"](*args), strict=True):
        _close(a, e, torch.float32)


def _t(gen, *shape, dtype=torch.float32):
    return torch.randn(*shape, generator=gen).to(dtype)


# The acceptance shapes: L 1/7/33, dims 5/13, state 7/16, groups, each optional input on and off,
# float32 and float16 (each value met at least once in each dtype).
SHAPES = [  # (length, dim, state, groups, optional inputs given)
    (1, 5, 7, None, True),
    (7, 13, 16, 1, False),
    (33, 13, 7, 13, True),
    (33, 5, 16, None, False),
    (7, 5, 16, 5, True),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("length,dim,state,groups,optional", SHAPES)
def test_mamba1_ops_at_odd_shapes(dtype, length, dim, state, groups, optional):
    g = torch.Generator().manual_seed(length * 100 + dim + state)
    b = 2
    bc = (b, state, length) if groups is None else (b, groups, state, length)
    opt = (lambda t: t) if optional else (lambda t: None)  # noqa: E731
    u, delta, z = (_t(g, b, dim, length, dtype=dtype) for _ in range(3))
    scan = dict(
        u=u,
        delta=delta,
        A=-torch.rand(dim, state, generator=g),
        B=_t(g, *bc, dtype=dtype),
        C=_t(g, *bc, dtype=dtype),
        D=opt(_t(g, dim)),
        z=opt(z),
        delta_bias=opt(_t(g, dim)),
        delta_softplus=optional,
        initial_state=opt(_t(g, b, dim, state)),
    )
    conv = dict(
        x=u,
        weight=_t(g, dim, 4),
        bias=opt(_t(g, dim)),
        initial_state=opt(_t(g, b, dim, 3)),
        activation="silu" if optional else None,
    )
    step = dict(
        state=_t(g, b, dim, state),
        x=u[..., 0],
        dt=delta[..., 0],
        A=scan["A"],
        B=scan["B"][..., 0],
        C=scan["C"][..., 0],
        D=scan["D"],
        z=opt(z[..., 0]),
        dt_bias=scan["delta_bias"],
        dt_softplus=optional,
    )
    conv_step = dict(
        x=u[..., 0],
        conv_state=_t(g, b, dim, 3),
        weight=conv["weight"],
        bias=conv["bias"],
        activation=conv["activation"],
    )
    for op, args in (
        ("selective_scan", scan),
        ("causal_conv1d", conv),
        ("selective_state_update", step),
        ("causal_conv1d_update", conv_step),
    ):
        got, expected = TRITON_KERNELS[op](**args), SSMCC_REFERENCES[op](**args)
        for a, e in zip(got, expected, strict=True):
            assert a.dtype == e.dtype, op
            _close(a, e, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("length,head_dim,state,groups,optional", SHAPES)
def test_mamba2_ops_at_odd_shapes(dtype, length, head_dim, state, groups, optional):
    g = torch.Generator().manual_seed(length * 100 + head_dim + state)
    b, groups = 2, min(groups or 1, 3)  # two heads a group: 2 to 6 heads
    heads = 2 * groups
    opt = (lambda t: t) if optional else (lambda t: None)  # noqa: E731
    x, z = (_t(g, b, length, heads, head_dim, dtype=dtype) for _ in range(2))
    B, C = (_t(g, b, length, groups, state, dtype=dtype) for _ in range(2))
    scan = dict(
        x=x,
        dt=_t(g, b, length, heads, dtype=dtype),
        A=-torch.rand(heads, generator=g),
        B=B,
        C=C,
        D=opt(_t(g, heads, head_dim)),
        z=opt(z),
        dt_bias=opt(_t(g, heads)),
        dt_softplus=optional,
        dt_min=0.0,
        dt_max=0.5 if optional else None,
        initial_state=opt(_t(g, b, heads, head_dim, state)),
    )
    step = dict(
        state=_t(g, b, heads, head_dim, state),
        x=x[:, 0],
        dt=scan["dt"][:, 0],
        A=scan["A"],
        B=B[:, 0],
        C=C[:, 0],
        D=opt(_t(g, heads)),
        z=opt(z[:, 0]),
        dt_bias=scan["dt_bias"],
        dt_softplus=optional,
        dt_min=0.0,
        dt_max=scan["dt_max"],
    )
    norm = dict(
        x=x.flatten(-2),
        z=opt(z.flatten(-2)),
        weight=_t(g, heads * head_dim),
        group_size=head_dim,
        eps=1e-5,
        norm_before_gate=optional,
    )
    for op, args in (("ssd_scan", scan), ("ssd_state_update", step), ("rmsnorm_gated", norm)):
        got, expected = TRITON_KERNELS[op](**args), SSMCC_REFERENCES[op](**args)
        got = (got,) if isinstance(got, torch.Tensor) else got
        expected = (expected,) if isinstance(expected, torch.Tensor) else expected
        for a, e in zip(got, expected, strict=True):
            assert a.dtype == e.dtype, op
            _close(a, e, dtype)
