"""The Mamba-1 selective scan's Triton kernels (``kernels/triton/selective_scan.py``) beyond the
fuzz corpus of ``test_triton_kernels.py``: in Triton's interpreter against the op's reference with
small tiles (4 channels x 4 positions a tile, so that tile, channel-block, chunk and group
boundaries all fall inside short sequences), in each memory layout the launcher tells apart, in
float32 / float16 / bfloat16; the chunk-count heuristic and the launches it makes at mamba-130m's
and mamba-2.8b's sizes on the GPU (recorded, not run); and the kernels compiled for sm_90 and
sm_80 with ``ptxas``'s register and spill counts, and the layout Triton chose for the tiles (no
GPU needed).
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import tempfile

import pytest
import torch

from .fuzzing import TOLERANCES

triton = pytest.importorskip(
    "triton", reason='Triton is an optional extra: pip install ".[triton]"'
)
import triton.language as tl  # noqa: E402

from ssmcc.kernels.triton import aot, configs, runtime, scan_tiles  # noqa: E402
from ssmcc.kernels.triton import selective_scan as scan  # noqa: E402
from ssmcc.kernels.triton.catalog import GRID_RULES  # noqa: E402
from ssmcc.ops.selective_scan import selective_scan_ref  # noqa: E402

SMALL_TILES = configs.SelectiveScanConfig(block_d=4, block_l=4, num_warps=1, chunk=1 << 30)
KERNELS = (
    "_selective_scan_chunk_state_kernel",
    "_selective_scan_pass_states_kernel",
    "_selective_scan_chunk_scan_kernel",
)


@pytest.fixture
def small_tiles(monkeypatch):
    monkeypatch.setattr(configs, "SELECTIVE_SCAN_CPU", SMALL_TILES)


def _case(gen, b, d, n, length, groups, optional, dtype):
    """The op's arguments: B and C (b, n, l) when ``groups`` is None, else (b, g, n, l)."""
    bc = (b, n, length) if groups is None else (b, groups, n, length)
    r = lambda *s, dt=dtype: torch.randn(*s, generator=gen).to(dt)  # noqa: E731
    opt = (lambda t: t) if optional else (lambda t: None)  # noqa: E731
    return dict(
        u=r(b, d, length),
        delta=r(b, d, length) - 1.0 if optional else r(b, d, length).abs() * 0.5,  # dt > 0
        A=-torch.rand(d, n, generator=gen) - 0.1,
        B=r(*bc),
        C=r(*bc),
        D=opt(r(d, dt=torch.float32)),
        z=opt(r(b, d, length)),
        delta_bias=opt(r(d, dt=torch.float32)),
        delta_softplus=optional,
        initial_state=opt(r(b, d, n, dt=torch.float32)),
    )


def _check(got, args):
    """``got`` against the reference at mamba_ssm's tolerances for each output's dtype."""
    expected = selective_scan_ref(**args)
    for name, g, e in zip(("out", "last_state"), got, expected, strict=True):
        assert g.dtype == e.dtype and g.shape == e.shape, name
        rtol, atol = TOLERANCES["scan", e.dtype]
        torch.testing.assert_close(
            g.float(), e.float(), rtol=rtol, atol=atol, msg=lambda m, name=name: f"{name}: {m}"
        )


CASES = [  # (length, dim, state, groups, chunk, optional inputs, dtype)
    (1, 5, 7, None, None, True, torch.float32),
    (7, 13, 16, 1, 3, False, torch.float16),
    (37, 12, 7, 4, 16, True, torch.bfloat16),  # 3 channels a group: blocks of 4 straddle groups
    (64, 16, 16, 2, 24, True, torch.float32),  # 8 channels a group: one group per block
    (37, 6, 5, 3, None, False, torch.float32),
    pytest.param(64, 13, 9, None, 5, True, torch.float16, marks=pytest.mark.slow),
    (37, 5, 3, 5, 7, True, torch.bfloat16),  # a group per channel
]


@pytest.mark.parametrize("length,dim,state,groups,chunk,optional,dtype", CASES)
def test_small_tiles_match_the_reference(
    small_tiles, length, dim, state, groups, chunk, optional, dtype
):
    g = torch.Generator().manual_seed(length * 1000 + dim * 10 + state)
    args = _case(g, 1 if length == 64 else 2, dim, state, length, groups, optional, dtype)
    _check(scan.selective_scan_fwd(**args, chunk=chunk), args)


def _position_major(args, dtype_out=None):
    """The mixers' layout: u, delta, z as (b, l, d) and B, C as (b, l, [g,] n) storage, seen as
    the op's (b, d, l) / (b, [g,] n, l) views; ``out`` a (b, l, d) buffer of ``dtype_out``."""
    moved = dict(args)
    for name in ("u", "delta", "z"):
        if args[name] is not None:
            moved[name] = args[name].transpose(1, 2).contiguous().transpose(1, 2)
    for name in ("B", "C"):
        t = args[name]
        moved[name] = t.movedim(-1, 1).contiguous().movedim(1, -1)
    b, d, length = args["u"].shape
    out = torch.empty(b, length, d, dtype=dtype_out or args["u"].dtype).transpose(1, 2)
    return moved, out


def _every_other(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a view with stride 2 along its last axis (no axis of stride 1)."""
    wide = torch.zeros(*t.shape[:-1], 2 * t.shape[-1], dtype=t.dtype)
    wide[..., ::2] = t
    return wide[..., ::2]


@pytest.mark.parametrize(
    "groups,dtype",
    [
        (4, torch.bfloat16),  # 3 channels a group: a group tile per channel
        pytest.param(None, torch.float32, marks=pytest.mark.slow),  # one tile for the block
        pytest.param(4, torch.float32, marks=pytest.mark.slow),
        pytest.param(None, torch.bfloat16, marks=pytest.mark.slow),
    ],
)
def test_each_layout_reads_its_contiguous_axis(small_tiles, groups, dtype):
    """Channel-major tensors are read along the sequence, the mixers' position-major views across
    it, other strides with both strides at run time: the same results."""
    g = torch.Generator().manual_seed(7)
    args = _case(g, 2, 12, 7, 37, groups, True, dtype)

    def layouts(a, out):
        B, C = (t if t.dim() == 4 else t.unsqueeze(1) for t in (a["B"], a["C"]))
        return scan._layouts(a["u"], a["delta"], a["z"], out, B, C, 12, 4)

    out = torch.empty(2, 12, 37, dtype=dtype)
    assert layouts(args, out) == dict(
        X_UNIT=scan_tiles.ALONG.value, BC_UNIT=scan_tiles.ALONG.value, BC_SHARED=groups is None
    )
    _check(scan.selective_scan_fwd(**args, chunk=16, out=out), args)

    moved, out = _position_major(args)
    assert layouts(moved, out)["X_UNIT"] == layouts(moved, out)["BC_UNIT"] == scan_tiles.ACROSS
    _check(scan.selective_scan_fwd(**moved, chunk=16, out=out), args)

    strided = args | {name: _every_other(args[name]) for name in ("u", "delta", "z", "B", "C")}
    out = _every_other(torch.empty(2, 12, 37, dtype=dtype))
    assert layouts(strided, out)["X_UNIT"] == layouts(strided, out)["BC_UNIT"] == 0
    _check(scan.selective_scan_fwd(**strided, chunk=16, out=out), args)


def test_out_may_have_another_dtype(small_tiles):
    """``out=`` takes the output in its own dtype (the mixer: float32 inputs, a bf16 output)."""
    g = torch.Generator().manual_seed(3)
    args = _case(g, 1, 13, 16, 20, None, True, torch.float32)
    moved, out = _position_major(args, torch.bfloat16)
    got, last = scan.selective_scan_fwd(**moved, chunk=8, out=out)
    expected, expected_last = selective_scan_ref(**args)
    assert got is out
    torch.testing.assert_close(
        got.float(), expected.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2
    )
    torch.testing.assert_close(last, expected_last, rtol=6e-4, atol=2e-3)


@triton.jit
def _first_order(a1, b1, a2, b2):
    return a1 * a2, a2 * b1 + b2


@triton.jit
def _scan_probe_kernel(a_ptr, b_ptr, out_ptr, AXIS: tl.constexpr):
    i = tl.arange(0, 4)[:, None, None] * 8 + tl.arange(0, 2)[None, :, None] * 4
    offsets = i + tl.arange(0, 4)[None, None, :]
    a, b = tl.associative_scan(
        (tl.load(a_ptr + offsets), tl.load(b_ptr + offsets)), AXIS, _first_order
    )
    tl.store(out_ptr + offsets, b)


@pytest.mark.parametrize("axis", [0, 2])
def test_the_interpreter_scans_slice_by_slice_as_triton_does(monkeypatch, axis):
    """``runtime.scans_by_slices`` (the interpreter's scan one slice at a time) gives Triton's own
    element-by-element results, bit for bit, and the recurrence's."""
    g = torch.Generator().manual_seed(axis)
    a, b = torch.rand(4, 2, 4, generator=g), torch.randn(4, 2, 4, generator=g)
    by_slices, by_elements = torch.empty_like(b), torch.empty_like(b)
    runtime.launch(_scan_probe_kernel, (1,))(a, b, by_slices, AXIS=axis)
    monkeypatch.setattr(runtime, "scans_by_slices", contextlib.nullcontext)
    runtime.launch(_scan_probe_kernel, (1,))(a, b, by_elements, AXIS=axis)
    assert torch.equal(by_slices, by_elements)
    h, states = torch.zeros_like(b.select(axis, 0)), []
    for t in range(b.shape[axis]):
        h = a.select(axis, t) * h + b.select(axis, t)
        states.append(h)
    assert torch.equal(by_slices, torch.stack(states, axis))


def test_unit_axis():
    along, across, neither = (
        a.value for a in (scan_tiles.ALONG, scan_tiles.ACROSS, scan_tiles.NEITHER)
    )
    assert scan_tiles.unit_axis([(1, 37, 37, 12), (1, 37, 74, 12)]) == along
    assert scan_tiles.unit_axis([(12, 37, 1, 12), (1, 37, 74, 12)]) == neither
    assert scan_tiles.unit_axis([(12, 37, 1, 12)]) == across
    assert scan_tiles.unit_axis([(5, 1, 1, 12)]) == across  # one position: a single row
    assert scan_tiles.unit_axis([(1, 37, 9, 1)]) == along  # one channel: the sequence


@pytest.mark.parametrize("batch,dim", [(1, 1536), (1, 5120), (4, 5120), (16, 1536)])
def test_the_gpu_launches_fill_the_sms(batch, dim):
    """At L 2048 on the default GPU (132 SMs) the scan's programs make one wave of
    ``programs_per_sm`` per SM, its chunks are whole tiles, and the recorded grids are the grid
    rules' (the launches are recorded, not run)."""
    gpu, length, n = configs.SELECTIVE_SCAN_GPU, 2048, 16
    u = torch.empty(batch, dim, length, dtype=torch.bfloat16)
    B = torch.empty(batch, n, length, dtype=torch.bfloat16)
    recorded = aot.record_launches(
        lambda: scan.selective_scan_fwd(u, u, -torch.ones(dim, n), B, B, delta_softplus=True)
    )
    launched = [r[0].fn.__name__ for r in recorded]
    kernel, _, args, _ = recorded[-1]
    chunk = dict(zip(kernel.arg_names, args, strict=False))["chunk_len"]
    chunks = -(-length // chunk)
    blocks = batch * (-(-dim // gpu.block_d))
    assert launched == (list(KERNELS) if chunks > 1 else [KERNELS[-1]])
    assert chunk % gpu.block_l == 0 and (chunks == 1 or chunk >= gpu.min_chunk)
    wave = configs.DEFAULT_SMS * gpu.programs_per_sm
    assert blocks * chunks >= wave  # every SM holds programs_per_sm programs
    assert blocks * (chunks - 1) < wave  # and no chunk more than that needs
    sizes = dict(batch=batch, dim=dim, length=length, chunk_len=chunk, BLOCK_D=gpu.block_d)
    for kernel, grid, _, meta in recorded:
        rule = GRID_RULES[kernel.fn.__name__]
        assert eval(rule, {"cdiv": lambda a, b: -(-a // b)}, sizes) == grid, rule
        assert meta.get("BLOCK_L", gpu.block_l) == gpu.block_l
        assert meta["num_warps"] == gpu.num_warps


def _ptxas_usage(ptx: str, arch: int) -> tuple[int, int]:
    """(registers, spill store bytes) that Triton's own ptxas reports for ``ptx``."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    with tempfile.NamedTemporaryFile("w", suffix=".ptx") as source:
        source.write(ptx)
        source.flush()
        done = subprocess.run(
            [
                get_ptxas(arch).path,
                "-v",
                f"--gpu-name={sm_arch_from_capability(arch)}",
                source.name,
                "-o",
                "/dev/null",
            ],
            capture_output=True,
            text=True,
            check=True,
        )
    registers = int(re.search(r"Used (\d+) registers", done.stderr).group(1))
    spilled = int(re.search(r"(\d+) bytes spill stores", done.stderr).group(1))
    return registers, spilled


def _scan_specs(dim: int, dtype: torch.dtype, layout: str) -> list[aot.Specialization]:
    """The specialisations a model's scan launches on the GPU at batch 1, L 2048 (every pass),
    channel-major (Hugging Face's layout) or position-major (the mixers')."""
    length, n = 2048, 16
    if layout == "channel-major":
        u = torch.empty(1, dim, length, dtype=dtype)
        B, out = torch.empty(1, n, length, dtype=dtype), None
    else:
        u = torch.empty(1, length, dim, dtype=dtype).transpose(1, 2)
        B = torch.empty(1, length, n, dtype=dtype).transpose(1, 2)
        out = torch.empty(1, length, dim, dtype=dtype).transpose(1, 2)
    A, D, h0 = -torch.ones(dim, n), torch.ones(dim), torch.zeros(1, dim, n)
    recorded = aot.record_launches(
        lambda: scan.selective_scan_fwd(u, u, A, B, B, D, u, D, True, h0, out=out)
    )
    return [aot.specialization(*launch) for launch in recorded]


def _tile_walks_within_threads(ttgir: str) -> int:
    """How many scans and reductions down axis 0 of a 3-D tile (the sequence: the recurrence,
    a tile's last state, pass 1's sum) the compiled kernel has; each must keep that axis within
    threads (one lane and one warp along it: no shuffles, no shared memory)."""
    layouts = dict(re.findall(r"^(#\w+) = #ttg\.blocked<(.*)>$", ttgir, re.M))
    found = 0
    for segment in re.split(r'(?="tt\.(?:scan|reduce)")', ttgir)[1:]:
        axis = int(re.search(r"axis = (\d+) : i32", segment).group(1))
        operand = re.search(r"\}\) : \(tensor<([\dx]+)x\w+, (#\w+)>", segment)
        if axis != 0 or operand.group(1).count("x") != 2:
            continue
        layout = layouts[operand.group(2)]
        lanes = re.search(r"threadsPerWarp = \[(\d+)", layout).group(1)
        warps = re.search(r"warpsPerCTA = \[(\d+)", layout).group(1)
        assert (lanes, warps) == ("1", "1"), layout
        found += 1
    return found


def _check_no_spills(dim, dtype, layout, archs):
    kernels = aot._jit_functions()
    specs = _scan_specs(dim, dtype, layout)
    assert [s.kernel for s in specs] == list(KERNELS)
    for spec in specs:
        for arch in archs:
            compiled = aot._compile(spec, aot.ARCHS[arch], kernels)
            assert f".target {arch}" in compiled.asm["ptx"]
            registers, spilled = _ptxas_usage(compiled.asm["ptx"], aot.ARCHS[arch])
            assert spilled == 0 and registers <= 255, (spec.kernel, arch, registers, spilled)
            walks = _tile_walks_within_threads(compiled.asm["ttgir"])
            assert walks >= (0 if "pass_states" in spec.kernel else 1), spec.kernel


def test_the_kernels_compile_for_sm_90_without_spills():
    """mamba-130m's shape (d 1536, state 16) in bfloat16, as the mixers lay it out."""
    _check_no_spills(1536, torch.bfloat16, "position-major", ("sm_90",))


@pytest.mark.slow
@pytest.mark.parametrize("dim", [1536, 5120])  # mamba-130m, mamba-2.8b
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["channel-major", "position-major"])
def test_the_kernels_compile_without_spills(dim, dtype, layout):
    _check_no_spills(dim, dtype, layout, ("sm_80", "sm_90"))
