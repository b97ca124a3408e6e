"""The SSD scan's Triton kernels (``kernels/triton/ssd_scan.py``): each kernel against
``ssmcc.ops.ssd_scan``'s reference in Triton's interpreter, the float32 TF32 option from
``compile`` / the command line to the kernels' constants, and the tensor-core binaries.

Shapes: L 1, 7, 37, 64 with chunk 16 (several chunks, a partial last one), head_dim 5 and 19
(masked inside the dot's 16-wide blocks), 1-3 groups, initial state, dt bias / softplus /
clamps, D per head or per (head, row), z; and the GPU's code paths (several tiles per dimension,
k-steps, bmm tiles skipped above the diagonal) under a small-tile config.

Tolerances (rtol / atol), every output including the float32 final state, by input dtype:
float32 6e-4 / 2e-3, float16 3e-3 / 5e-3, bfloat16 3e-2 / 5e-2: mamba_ssm's scan tolerances
(FACTS.md; ``tests/fuzzing.py``). 16-bit inputs take 16-bit products (one rounding of one
operand per product, float32 sums), as mamba_ssm's SSD does; measured, the worst element uses
0.46 (fp16) and 0.63 (bf16) of its bound on these shapes (0.47 and 0.62 over the fuzz corpus's
16-bit ssd_scan cases among seeds 0-549), float32 (IEEE products) 0.001.
mamba_ssm's own SSD test (``test_ssd.py``) holds its kernels to rtol 1e-2 / atol 3e-3 against
each other (no exact oracle); our fp16 bounds are tighter than that in rtol, and bfloat16's
output, itself rounded to bfloat16 (up to 2^-8 ~ 3.9e-3, and the interpreter's stores truncate:
2^-7), cannot be held to rtol 1e-2 / atol 3e-3 against an exact one.
C.B^T (bmm) is compared on its own: products of exact 16-bit values summed in float32 must match
the float64 product to float32 rounding.

Slow: ``ptxas -v`` on every SSD specialisation of mamba2-130m and mamba2-2.7b (fp32 IEEE / TF32,
bf16, fp16) for sm_80 / sm_86 / sm_89 / sm_90: no spills, shared memory within each
architecture's per-block limit (``configs.SSD_GPU``'s note lists the numbers).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import aot, configs  # noqa: E402
from ssmcc.kernels.triton.configs import DotTile, SsdConfig  # noqa: E402
from ssmcc.kernels.triton.ssd_scan import dot_operands, ssd_scan_chunked, ssd_scan_fwd  # noqa: E402
from ssmcc.ops import ssd_scan_ref  # noqa: E402
from ssmcc.ops.ssd_math import discretized_dt  # noqa: E402

TOLERANCES = {
    torch.float32: dict(rtol=6e-4, atol=2e-3),
    torch.float16: dict(rtol=3e-3, atol=5e-3),
    torch.bfloat16: dict(rtol=3e-2, atol=5e-2),
}
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (length, heads, head_dim, groups, state, h0, z, D dims, softplus, dt clamp)
CASES = [
    (1, 2, 5, 1, 7, True, False, 1, True, None),
    (7, 4, 19, 2, 16, False, True, 2, False, (0.01, 0.5)),
    (37, 6, 5, 3, 32, True, True, 0, True, (0.0, 0.8)),
    (64, 2, 19, 1, 5, True, True, 1, True, None),
]


def _case(dtype, length, heads, head_dim, groups, n, h0, z, D_dims, softplus, clamp, batch=2):
    g = torch.Generator().manual_seed(length * 31 + head_dim + n)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    dt = r(batch, length, heads)
    if not softplus:  # dt >= 0 as in every Mamba model
        dt = dt.abs() * 0.5
    return dict(
        x=r(batch, length, heads, head_dim).to(dtype),
        dt=dt.to(dtype),
        A=-torch.exp(0.7 * r(heads)),
        B=r(batch, length, groups, n).to(dtype),
        C=r(batch, length, groups, n).to(dtype),
        D=None if D_dims == 0 else r(heads) if D_dims == 1 else r(heads, head_dim),
        z=r(batch, length, heads, head_dim).to(dtype) if z else None,
        dt_bias=r(heads) if softplus else None,
        dt_softplus=softplus,
        dt_min=clamp[0] if clamp else 0.0,
        dt_max=clamp[1] if clamp else None,
        initial_state=r(batch, heads, head_dim, n) if h0 else None,
    )


def _reference(case: dict, upto: int | None = None):
    """``ssd_scan_ref`` on the case's values widened to float32 (its output not rounded back),
    over the first ``upto`` positions."""
    cut = {"x", "dt", "B", "C", "z"}
    wide = {
        k: (v[:, :upto] if k in cut and upto is not None else v).float()
        if isinstance(v, torch.Tensor)
        else v
        for k, v in case.items()
    }
    return ssd_scan_ref(**wide)


def _pieces(case: dict, config=None, chunk=None):
    args = [case[k] for k in ("x", "dt", "A", "B", "C", "D", "z", "dt_bias", "dt_softplus")]
    args += [case["dt_min"], case["dt_max"], case["initial_state"], chunk, None, False, config]
    return ssd_scan_chunked(*args)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("shape", CASES, ids=lambda s: f"L{s[0]}-h{s[1]}-p{s[2]}-g{s[3]}-n{s[4]}")
def test_each_kernel_against_the_reference(dtype, shape):
    case = _case(dtype, *shape)
    pieces = _pieces(case)
    batch, length, heads, _ = case["x"].shape
    Q = pieces.dt.shape[-1]
    chunks = pieces.dt.shape[2]
    assert Q == configs.SSD_CPU.chunk and chunks == -(-length // Q)
    tol = TOLERANCES[dtype]

    # chunk_cumsum: the reference's dt, and its running sum times A inside each chunk
    step = discretized_dt(
        case["dt"], case["dt_bias"], case["dt_softplus"], case["dt_min"], case["dt_max"]
    )
    padded = torch.zeros(batch, chunks * Q, heads)
    padded[:, :length] = step
    dt_chunks = padded.view(batch, chunks, Q, heads).permute(0, 3, 1, 2)
    torch.testing.assert_close(pieces.dt, dt_chunks, rtol=1e-5, atol=1e-6)
    a = torch.cumsum(dt_chunks.double() * case["A"].double()[None, :, None, None], dim=-1)
    torch.testing.assert_close(pieces.a.double(), a, rtol=1e-5, atol=1e-5)

    # chunk_state + state_passing: the state entering chunk k is the reference's after k*Q steps
    h0 = case["initial_state"]
    torch.testing.assert_close(pieces.starts[:, 0], h0 if h0 is not None else 0 * pieces.final)
    for k in range(1, chunks):
        _, expected = _reference(case, upto=k * Q)
        torch.testing.assert_close(pieces.starts[:, k], expected, **tol)

    # bmm: C_t . B_s of the exact (already rounded) inputs, t >= s inside a chunk
    C = case["C"].double()
    B = case["B"].double()
    for k in range(chunks):
        rows = slice(k * Q, min(length, (k + 1) * Q))
        size = rows.stop - rows.start
        expected = torch.einsum("btgn,bsgn->bgts", C[:, rows], B[:, rows])
        causal = torch.ones(size, size, dtype=torch.bool).tril()
        got = pieces.cb[:, k, :, :size, :size].double()
        torch.testing.assert_close(got[..., causal], expected[..., causal], rtol=1e-5, atol=1e-5)

    # chunk_scan: the output and the final state
    out, final = _reference(case)
    assert pieces.out.dtype == dtype and pieces.final.dtype == torch.float32
    torch.testing.assert_close(pieces.out.float(), out, **tol)
    torch.testing.assert_close(pieces.final, final, **tol)


# The GPU's paths in the interpreter: several tiles along every dimension, k-steps, bmm tiles above
# the diagonal skipped (its 16-row tiles against chunk_scan's 32), and the state loop over n.
SMALL_TILES = SsdConfig(
    chunk=32,
    cumsum_heads=2,
    chunk_state=DotTile(block_m=16, block_n=16, block_k=16),
    bmm=DotTile(block_m=16, block_n=32, block_k=16),
    chunk_scan=DotTile(block_m=32, block_n=16, block_k=16),
    passing_block=64,
    num_warps=1,
)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_gpu_tiles_in_the_interpreter(dtype):
    case = _case(dtype, 45, 3, 19, 1, 32, True, True, 2, True, None, batch=1)
    out, final = ssd_scan_fwd(**case, config=SMALL_TILES)
    expected_out, expected_final = _reference(case)
    torch.testing.assert_close(out.float(), expected_out, **TOLERANCES[dtype])
    torch.testing.assert_close(final, expected_final, **TOLERANCES[dtype])


def test_which_products_each_input_gets():
    """16-bit products when x, B and C share float16 or bfloat16, else float32 (IEEE, TF32 only
    when asked); the interpreter's bfloat16 stand-in only where kernels are interpreted."""
    f16, bf16 = torch.empty(1, dtype=torch.float16), torch.empty(1, dtype=torch.bfloat16)
    f32, f64 = torch.empty(1), torch.empty(1, dtype=torch.float64)
    assert dot_operands(f16, f16, f16, False) == ("fp16", False, "ieee")
    assert dot_operands(bf16, bf16, bf16, True) == ("bf16", True, "ieee")
    assert dot_operands(f16, f32, f16, False) == ("fp32", False, "ieee")  # mixed: not rounded
    assert dot_operands(f64, f64, f64, False) == ("fp32", False, "ieee")
    assert dot_operands(f32, f32, f32, True) == ("fp32", False, "tf32")
    seen = []  # while aot records a model's launches for the GPU: compiled bfloat16 products
    aot.record_launches(lambda: seen.append(dot_operands(bf16, bf16, bf16, False)))
    assert seen == [("bf16", False, "ieee")]


SSD_DOT_KERNELS = {"_ssd_chunk_state_kernel", "_ssd_bmm_kernel", "_ssd_chunk_scan_kernel"}


@pytest.mark.parametrize("allow_tf32", [False, True])
def test_allow_tf32_reaches_the_kernels(allow_tf32):
    """``compile(..., allow_tf32=True)`` makes every SSD product of a float32 model TF32 (its
    kernels' ``PRECISION``), through the fused mixer; the default keeps IEEE float32. (TF32 cannot
    run on the CPU: what it computes is checked on a GPU only.)"""
    import ssmcc
    from ssmcc.presets import build_preset

    model = build_preset("mamba2-tiny").eval()
    options = {"allow_tf32": True} if allow_tf32 else {}
    compiled = ssmcc.compile(model, target="triton", interpret=True, **options)
    ids = torch.randint(0, model.config.vocab_size, (1, 5))
    launches = aot.record_launches(lambda: compiled.prefill(ids))
    precisions = {
        meta["PRECISION"] for k, _, _, meta in launches if k.fn.__name__ in SSD_DOT_KERNELS
    }
    assert precisions == {"tf32" if allow_tf32 else "ieee"}


def test_allow_tf32_on_the_command_line():
    from ssmcc.cli import _check_options, _target_options, build_parser
    from ssmcc.errors import OptionError

    parser = build_parser()
    argv = ["compile", "mamba2-tiny", "--target", "triton", "--interpret", "--allow-tf32"]
    options = _target_options(parser.parse_args([*argv, "--out", "x"]), "compile")
    assert options == {"interpret": True, "allow_tf32": True}
    _check_options("triton", options)
    with pytest.raises(OptionError, match="allow_tf32.*belongs to target triton"):
        _check_options("torch", {"allow_tf32": True})
    plain = parser.parse_args(["compile", "mamba2-tiny", "--target", "triton", "--out", "x"])
    assert "allow_tf32" not in _target_options(plain, "compile")
    compile_parser = parser._subparsers._group_actions[0].choices["compile"]
    flag = next(a for a in compile_parser._actions if a.dest == "allow_tf32")
    assert "TF32" in flag.help and "relative error" in flag.help


# ---- tensor-core binaries (no GPU: triton.compile to PTX, ptxas for registers / spills) ----

SHARED_LIMIT = {80: 166_912, 86: 101_376, 89: 101_376, 90: 232_448}  # bytes per block, opt-in


def _jit_specialization(kernel, args, meta):
    """(signature, constants, attrs) as Triton's JIT specialises a launch (triton 3.9's
    ``native_specialize_impl``): an int equal to 1 becomes a constant, ints divisible by 16 and
    16-aligned pointers are marked so; floats stay run-time values."""
    signature, constants, attrs = {}, {}, {}
    for index, name in enumerate(kernel.arg_names):
        if index >= len(args):
            signature[name], constants[name] = "constexpr", meta[name]
            continue
        value = args[index]
        if isinstance(value, torch.Tensor):
            signature[name] = aot.POINTER_TYPES[value.dtype]
            if value.data_ptr() % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
        elif isinstance(value, bool):
            signature[name], constants[name] = "constexpr", value
        elif isinstance(value, float):
            signature[name] = "fp32"
        elif value == 1:
            signature[name], constants[name] = "constexpr", 1
        else:
            signature[name] = "i32" if -(2**31) <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(index,)] = [["tt.divisibility", 16]]
    return signature, constants, attrs


def _ssd_launches(heads: int, dtype, allow_tf32: bool, length: int = 2048):
    """The SSD launches at a Mamba-2 model's shape (head_dim 64, state 128, one group), from zeros
    and from a state, recorded (not run) under the GPU's config."""
    x = torch.empty(1, length, heads, 64, dtype=dtype)
    dt = torch.empty(1, length, heads, dtype=dtype)
    BC = torch.empty(1, length, 1, 128, dtype=dtype)
    vec = torch.empty(heads)
    launches = []
    for h0 in (None, torch.empty(1, heads, 64, 128)):
        launches += aot.record_launches(
            lambda h0=h0: ssd_scan_fwd(
                x, dt, vec, BC, BC, vec, x, vec, True, 0.0, None, h0, allow_tf32=allow_tf32
            )
        )
    return launches


def _compile(launch, arch: int):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, _, args, meta = launch
    signature, constants, attrs = _jit_specialization(kernel, args, meta)
    source = ASTSource(fn=kernel, signature=signature, constexprs=constants, attrs=attrs)
    options = {"num_warps": meta["num_warps"], "num_stages": meta.get("num_stages", 3)}
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


@pytest.mark.parametrize(
    "dtype,allow_tf32,arch,instruction",
    [
        (torch.bfloat16, False, 90, "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16"),
        (torch.float32, True, 90, "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32"),
        (torch.float16, False, 80, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"),
    ],
    ids=["bf16-sm90", "tf32-sm90", "fp16-sm80"],
)
def test_the_chunk_scan_runs_on_tensor_cores(dtype, allow_tf32, arch, instruction):
    """mamba2-130m's chunk_scan (the largest product) compiles to the architecture's MMA; float32
    without TF32 compiles to FMAs (the fp32 build is in test_triton_aot's mamba2-tiny build)."""
    launch = next(
        launch
        for launch in _ssd_launches(24, dtype, allow_tf32)
        if launch[0].fn.__name__ == "_ssd_chunk_scan_kernel"
    )
    compiled = _compile(launch, arch)
    assert instruction in compiled.asm["ptx"]
    assert compiled.metadata.shared <= SHARED_LIMIT[arch]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [90, 80, 86, 89])
def test_mamba2_ssd_binaries_do_not_spill(arch):
    """Every SSD specialisation of mamba2-130m (24 heads) and mamba2-2.7b (80 heads), head_dim
    64, state 128, one group, from zeros and from a state: fp32 (IEEE and TF32), bf16, fp16."""
    compiled = {}
    for heads in (24, 80):
        for dtype, allow_tf32 in (
            (torch.float32, False),
            (torch.float32, True),
            (torch.bfloat16, False),
            (torch.float16, False),
        ):
            for launch in _ssd_launches(heads, dtype, allow_tf32):
                kernel, _, args, meta = launch
                key = (kernel.fn.__name__, repr(_jit_specialization(kernel, args, meta)))
                if key not in compiled:
                    compiled[key] = aot.compile_with_usage(
                        lambda launch=launch: _compile(launch, arch), arch
                    )
    usage = {}
    for (name, _), (binary, report) in compiled.items():
        spilled = report["spill_store_bytes"] + report["spill_load_bytes"]
        usage.setdefault(name, []).append((report["registers"], spilled, binary.metadata.shared))
    assert set(usage) >= SSD_DOT_KERNELS
    for name, rows in usage.items():
        assert all(spilled == 0 for _, spilled, _ in rows), (name, rows)
        assert all(shared <= SHARED_LIMIT[arch] for _, _, shared in rows), (name, rows)
