"""The fused decode-step kernels (``kernels/triton/mixer_steps.py``, launched by ``mixers.py``'s
``mamba_mixer_step_fwd`` / ``ssd_mixer_step_fwd``) against the ops' references, in Triton's
interpreter, and their sm_90 builds.

Odd shapes (channels not a power of two, state 5 and 7, head_dim 19, several B/C groups, norm
groups of several heads and of half a head, conv widths 1-4, every activation code), batch 1 and
3, float32 at the state-update tolerances of ``fuzzing.py`` and float16 / bfloat16 inputs (float32
states); each under the interpreter's meta-parameters (one program per row or head) and under
small tiles split over many programs (``_many_programs``: the GPU's shape of the work: loops,
several x_proj parts, several programs counting on a row's counter). States through slot indices:
a permuted, sparse set of slots of a pool, int32 and int64, each row reading and writing its slot
only, the other slots bitwise untouched, a padding row (slot -1) skipped.
"""

from __future__ import annotations

import re
import subprocess

import pytest
import torch

from . import fuzzing

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import configs  # noqa: E402
from ssmcc.kernels.triton.mixers import (  # noqa: E402
    mamba_mixer_step_fwd,
    mamba_mixer_step_workspace,
    ssd_mixer_step_fwd,
    ssd_mixer_step_workspace,
)
from ssmcc.ops.mamba_mixer import mamba_mixer_step_ref  # noqa: E402
from ssmcc.ops.quantized_linear import quantize_weight  # noqa: E402
from ssmcc.ops.ssd_mixer import ssd_mixer_step_ref  # noqa: E402

STATE_F32 = fuzzing.TOLERANCES["step", torch.float32]

# Mamba-1: (dim, state, dt rank, conv width, activation, FalconMamba eps, gate, optional inputs,
# projections stored small)
MAMBA_CASES = [
    (13, 5, 3, 4, "silu", None, True, True, None),
    (24, 16, 2, 3, "gelu", 1e-5, False, False, "int8"),
    (40, 7, 5, 2, "gelu_new", None, True, False, "bf16"),
    (5, 1, 1, 1, None, 1e-6, True, True, None),
    (30, 9, 8, 4, "relu", None, True, True, "int8-g"),
    (12, 16, 4, 3, "relu2", 1e-5, False, True, None),
]
# Mamba-2: (heads, head_dim, state, groups, norm group, conv width, activation, norm before gate,
# gate, D shape, dt clamp)
SSD_CASES = [
    (4, 19, 5, 2, 38, 4, "silu", False, True, "hp", (0.01, 0.5)),
    (6, 5, 7, 3, 15, 3, "gelu", True, True, "h", None),
    (3, 8, 16, 1, 24, 2, None, False, False, None, None),
    (2, 16, 5, 2, 8, 4, "relu", True, True, "hp", None),
    (4, 3, 4, 4, 12, 1, "relu2", False, True, "h", (0.0, 2.0)),
    (2, 19, 7, 1, 38, 4, "gelu_tanh", True, False, "hp", None),
]


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _stored(weight: torch.Tensor, scheme: str | None):
    if scheme is None:
        return weight, None
    if scheme == "int8-g":  # a scale per group of columns: the largest divisor below the width
        cols = weight.shape[1]
        groups = max(g for g in range(1, cols) if cols % g == 0) if cols > 1 else 1
        grouped = weight.reshape(weight.shape[0], groups, cols // groups)
        scale = grouped.abs().amax(-1).clamp_min(1e-8) / 127
        stored = torch.round(grouped / scale[..., None]).clamp(-127, 127).to(torch.int8)
        return stored.reshape(weight.shape), scale
    return quantize_weight(weight, scheme)


def mamba_args(case, batch: int, dtype=torch.float32, slots: int | None = None, seed: int = 0):
    dim, n, rank, width, activation, rms, gate, optional, scheme = case
    g = _gen(seed + dim * 7 + n)
    x_offset, z_offset = (1, dim + 3) if gate else (2, -1)
    zx = torch.randn(batch, 2 * dim + 5, generator=g).to(dtype)
    x_proj, x_scale = _stored(torch.randn(rank + 2 * n, dim, generator=g) * 0.3, scheme)
    dt_proj, dt_scale = _stored(torch.randn(dim, rank, generator=g) * 0.3, scheme)
    opt = (lambda t: t) if optional else (lambda t: None)  # noqa: E731
    rows = slots or batch
    return dict(
        zx=zx,
        conv_weight=torch.randn(dim, width, generator=g) * 0.5,
        conv_bias=opt(torch.randn(dim, generator=g)),
        x_proj_weight=x_proj,
        dt_proj_weight=dt_proj,
        A=-torch.exp(torch.randn(dim, n, generator=g) * 0.7),
        D=opt(torch.randn(dim, generator=g)),
        dt_bias=opt(torch.randn(dim, generator=g)),
        x_offset=x_offset,
        z_offset=z_offset,
        activation=activation,
        delta_softplus=optional or rms is not None,
        bcdt_rms_eps=rms,
        conv_state=torch.randn(rows, dim, width - 1, generator=g),
        ssm_state=torch.randn(rows, dim, n, generator=g),
        x_proj_scale=x_scale,
        dt_proj_scale=dt_scale,
    )


def ssd_args(case, batch: int, dtype=torch.float32, slots: int | None = None, seed: int = 0):
    heads, head_dim, n, groups, norm_group, width, activation, before, gate, D, clamp = case
    g = _gen(seed + heads * 100 + head_dim * 7 + n)
    inner = heads * head_dim
    channels = inner + 2 * groups * n
    offsets = dict(xbc_offset=2, dt_offset=2 + channels + 1, z_offset=2 + channels + heads + 2)
    if not gate:
        offsets["z_offset"] = -1
    zxbcdt = torch.randn(batch, channels + heads + inner + 6, generator=g).to(dtype)
    D_shape = {"h": (heads,), "hp": (heads, head_dim), None: None}[D]
    rows = slots or batch
    return dict(
        zxbcdt=zxbcdt,
        conv_weight=torch.randn(channels, width, generator=g) * 0.5,
        conv_bias=torch.randn(channels, generator=g) if gate else None,
        A=-torch.exp(torch.randn(heads, generator=g) * 0.7),
        D=None if D_shape is None else torch.randn(*D_shape, generator=g),
        dt_bias=torch.randn(heads, generator=g) if before or not gate else None,
        norm_weight=torch.randn(inner, generator=g),
        groups=groups,
        norm_group_size=norm_group,
        eps=1e-5,
        norm_before_gate=before,
        activation=activation,
        dt_softplus=True,
        dt_min=clamp[0] if clamp else 0.0,
        dt_max=clamp[1] if clamp else None,
        conv_state=torch.randn(rows, channels, width - 1, generator=g),
        ssm_state=torch.randn(rows, heads, head_dim, n, generator=g),
        **offsets,
    )


FAMILIES = {
    "mamba": (mamba_args, mamba_mixer_step_fwd, mamba_mixer_step_ref, MAMBA_CASES),
    "ssd": (ssd_args, ssd_mixer_step_fwd, ssd_mixer_step_ref, SSD_CASES),
}


def _y_tolerance(dtype) -> dict:
    rtol, atol = fuzzing.TOLERANCES["step", dtype if dtype != torch.float64 else torch.float32]
    return dict(rtol=rtol, atol=atol)


def _assert_step(got, expected, dtype):
    (y, conv, ssm), (y_ref, conv_ref, ssm_ref) = got, expected
    assert y.dtype == y_ref.dtype and y.shape == y_ref.shape
    torch.testing.assert_close(y.float(), y_ref.float(), **_y_tolerance(dtype))
    rtol, atol = STATE_F32
    for a, e in ((conv, conv_ref), (ssm, ssm_ref)):
        assert a.dtype == torch.float32 and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol)


@pytest.fixture
def many_programs(monkeypatch):
    """Small tiles split over many programs: the GPU's layout of the work, interpreted."""
    monkeypatch.setattr(configs, "MAMBA_STEP_CPU", dict(block=8, tile=64, parts=2, num_warps=1))
    monkeypatch.setattr(configs, "SSD_STEP_CPU", dict(block=4, tail=8, num_warps=1))
    monkeypatch.setattr(configs, "STEP_PROGRAMS_CPU", 12)


def _run(family: str, case, batch: int, dtype=torch.float32):
    make, fused, reference, _ = FAMILIES[family]
    args = make(case, batch, dtype)
    _assert_step(fused(**args), reference(**args), dtype)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", MAMBA_CASES, ids=lambda c: f"d{c[0]}n{c[1]}k{c[3]}-{c[4]}")
def test_mamba_step_matches_the_reference(case, batch):
    _run("mamba", case, batch)


@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("case", SSD_CASES, ids=lambda c: f"h{c[0]}p{c[1]}n{c[2]}g{c[3]}-{c[4]}")
def test_ssd_step_matches_the_reference(case, batch):
    _run("ssd", case, batch)


@pytest.mark.parametrize("family", ["mamba", "ssd"])
@pytest.mark.parametrize(
    "index", [0, 1, *(pytest.param(i, marks=pytest.mark.slow) for i in range(2, 6))]
)
def test_step_split_over_many_programs(many_programs, family, index):
    _run(family, FAMILIES[family][3][index], 3)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("family", ["mamba", "ssd"])
def test_step_with_16_bit_inputs(family, dtype):
    _run(family, FAMILIES[family][3][0], 2, dtype)


def _pool_check(family: str, case, indices: torch.Tensor, slots: int, in_place: bool = True):
    """The pool after the fused step: live rows' slots as the reference steps them, every other
    slot bitwise as before; padding rows' y zero."""
    make, fused, reference, _ = FAMILIES[family]
    batch = indices.shape[0]
    args = make(case, batch, slots=slots, seed=11)
    pool = (args["conv_state"].clone(), args["ssm_state"].clone())
    live = (indices >= 0).nonzero().flatten()
    ref_args = dict(args, conv_state=pool[0][indices[live]], ssm_state=pool[1][indices[live]])
    proj = "zx" if family == "mamba" else "zxbcdt"
    ref_args[proj] = args[proj][live]
    expected = reference(**ref_args)
    y, conv, ssm = fused(**args, state_indices=indices, in_place=in_place)
    torch.testing.assert_close(y[live], expected[0], **_y_tolerance(torch.float32))
    assert torch.equal(y[indices < 0], torch.zeros_like(y[indices < 0]))
    if in_place:
        assert conv is args["conv_state"] and ssm is args["ssm_state"]
        touched = indices[live]
        others = torch.ones(slots, dtype=torch.bool)
        others[touched] = False
        for new, old, ref in zip((conv, ssm), pool, expected[1:], strict=True):
            torch.testing.assert_close(new[touched], ref, rtol=STATE_F32[0], atol=STATE_F32[1])
            assert torch.equal(new[others], old[others])
    else:  # read from the slots, new (b, ...) states returned, the pool untouched
        for new, ref in zip((conv, ssm), expected[1:], strict=True):
            assert new.shape[0] == batch
            torch.testing.assert_close(new[live], ref, rtol=STATE_F32[0], atol=STATE_F32[1])
        assert torch.equal(args["conv_state"], pool[0]) and torch.equal(args["ssm_state"], pool[1])


@pytest.mark.parametrize("index_dtype,split", [(torch.int32, "fewest"), (torch.int64, "many")])
@pytest.mark.parametrize("family", ["mamba", "ssd"])
def test_states_through_slot_indices(request, family, index_dtype, split):
    if split == "many":
        request.getfixturevalue("many_programs")
    case = FAMILIES[family][3][0]
    _pool_check(family, case, torch.tensor([5, 0, 3], dtype=index_dtype), slots=7)
    _pool_check(family, case, torch.tensor([4, -1, 1, 6], dtype=index_dtype), slots=7)
    _pool_check(family, case, torch.tensor([2], dtype=index_dtype), slots=3)


@pytest.mark.parametrize("family", ["mamba", "ssd"])
def test_slots_read_without_writing_and_in_place_by_row(family):
    make, fused, reference, cases = FAMILIES[family]
    _pool_check(family, cases[1], torch.tensor([6, -1, 2]), slots=7, in_place=False)
    # in place without indices: row i is slot i of a pool that may hold more slots
    args = make(cases[1], 2, slots=4, seed=3)
    pool = (args["conv_state"].clone(), args["ssm_state"].clone())
    ref_args = dict(args, conv_state=pool[0][:2], ssm_state=pool[1][:2])
    expected = reference(**ref_args)
    y, conv, ssm = fused(**args, in_place=True)
    torch.testing.assert_close(y, expected[0], **_y_tolerance(torch.float32))
    for new, old, ref in zip((conv, ssm), pool, expected[1:], strict=True):
        torch.testing.assert_close(new[:2], ref, rtol=STATE_F32[0], atol=STATE_F32[1])
        assert torch.equal(new[2:], old[2:])


@pytest.mark.parametrize("family", ["mamba", "ssd"])
def test_a_kept_workspace_and_output_serve_every_step(family):
    """What a CUDA graph replays: one workspace and one output buffer for many steps, the states
    in place; the Mamba-2 row counters (four programs count on each) are back at zero after each
    step."""
    make, fused, reference, cases = FAMILIES[family]
    args = make(cases[0], 3, slots=5, seed=5)
    indices = torch.tensor([3, 1, 4])
    if family == "mamba":
        work = mamba_mixer_step_workspace(
            3, args["conv_weight"], args["x_proj_weight"], args["dt_proj_weight"], args["A"], "cpu"
        )
        proj = "zx"
    else:
        work = ssd_mixer_step_workspace(3, args["norm_weight"], "cpu")
        proj = "zxbcdt"
    out = torch.empty(3, args["A"].shape[0] if family == "mamba" else args["norm_weight"].shape[0])
    states = (args["conv_state"][indices].clone(), args["ssm_state"][indices].clone())
    for step in range(3):
        args[proj] = torch.randn(args[proj].shape, generator=_gen(step))
        expected = reference(**dict(args, conv_state=states[0], ssm_state=states[1]))
        y, _, _ = fused(**args, state_indices=indices, out=out, workspace=work)
        assert y is out
        torch.testing.assert_close(y, expected[0], **_y_tolerance(torch.float32))
        if work.counts is not None:
            assert torch.equal(work.counts, torch.zeros_like(work.counts))
        states = expected[1:]
        kept = args["ssm_state"][indices]
        torch.testing.assert_close(kept, states[1], rtol=STATE_F32[0], atol=STATE_F32[1])


def test_bad_slot_arguments_are_one_line_errors():
    args = ssd_args(SSD_CASES[2], 2, slots=4)
    with pytest.raises(Exception, match=r"ssd_mixer_step: state_indices must be int32 or int64"):
        ssd_mixer_step_fwd(**args, state_indices=torch.tensor([0.0, 1.0]))
    with pytest.raises(Exception, match=r"pass state_indices to address slots"):
        ssd_mixer_step_fwd(**args)
    args = mamba_args(MAMBA_CASES[0], 2)
    work = mamba_mixer_step_workspace(
        5, args["conv_weight"], args["x_proj_weight"], args["dt_proj_weight"], args["A"], "cpu"
    )
    with pytest.raises(Exception, match=r"the workspace does not fit this call \(batch 2\)"):
        mamba_mixer_step_fwd(**args, workspace=work)


def _step_specializations():
    """Every specialisation the step launchers make at the mamba-130m (d 1536, n 16, R 48) and
    mamba2-130m (24 heads x 64, n 128, 1 group, norm over 1536) shapes, batch 1 and 64, float32
    and bfloat16 projection outputs, with and without slot indices (recorded, not run)."""
    from ssmcc.kernels.triton import aot

    mamba = (1536, 16, 48, 4, "silu", None, True, True, None)
    ssd = (24, 64, 128, 1, 1536, 4, "silu", False, True, "h", None)
    found = {}
    for batch in (1, 64):
        for dtype in (torch.float32, torch.bfloat16):
            for family, case in (("mamba", mamba), ("ssd", ssd)):
                make, fused, _, _ = FAMILIES[family]
                for indices in (None, torch.arange(batch, dtype=torch.int32)):
                    args = make(case, batch, dtype, slots=batch + 1)
                    if indices is None:
                        args["conv_state"] = args["conv_state"][:batch]
                        args["ssm_state"] = args["ssm_state"][:batch]
                    for launch in aot.record_launches(
                        lambda args=args, i=indices, f=fused: f(**args, state_indices=i)
                    ):
                        spec = aot.specialization(*launch)
                        found.setdefault(spec.key, spec)
    return list(found.values())


def _ptxas_report(ptx: str) -> tuple[int, int]:
    """(registers, spill bytes) of a PTX kernel by the ptxas Triton uses for sm_90."""
    import tempfile

    from triton.backends.nvidia.compiler import get_ptxas

    target = re.search(r"\.target (\w+)", ptx).group(1)
    with tempfile.TemporaryDirectory() as folder:
        with open(f"{folder}/k.ptx", "w") as f:
            f.write(ptx)
        done = subprocess.run(
            [get_ptxas(90).path, "-v", "--regAllocOptLevel=2", f"--gpu-name={target}",
             f"{folder}/k.ptx", "-o", f"{folder}/k.cubin"],
            capture_output=True, text=True, timeout=300,
        )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    registers = int(re.search(r"Used (\d+) registers", log).group(1))
    spills = sum(int(v) for v in re.findall(r"(\d+) bytes spill (?:stores|loads)", log))
    return registers, spills


@pytest.mark.slow
def test_step_kernels_build_for_sm90_without_spills():
    from ssmcc.kernels.triton import aot

    specs = _step_specializations()
    assert {s.kernel for s in specs} == {
        "_mamba_step_conv_proj_kernel",
        "_mamba_step_update_kernel",
        "_ssd_step_kernel",
    }
    kernels = aot._jit_functions()
    for spec in specs:
        registers, spills = _ptxas_report(aot._compile(spec, 90, kernels).asm["ptx"])
        assert spills == 0 and registers <= 255, (spec.kernel, registers, spills)
