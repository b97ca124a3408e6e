"""The separate step launchers through slot indices (``causal_conv1d_update_fwd``,
``selective_state_update_fwd``, ``ssd_state_update_fwd`` with ``state_indices``: what the captured
decode runs for Jamba's and Zamba's Mamba-1 layers and ``pipeline="unfused"``), in Triton's
interpreter, against the same launchers on the gathered states: each live row's output and new
state equal, written in place at its slot; the other slots bitwise untouched; a padding row's
output zeros; int32 and int64 indices, float32 and float16 inputs; bad indices and pools are
one-line errors naming the op.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_update_fwd  # noqa: E402
from ssmcc.kernels.triton.state_update import (  # noqa: E402
    selective_state_update_fwd,
    ssd_state_update_fwd,
)

SLOTS = 6
ROWS = [4, -1, 0, 2]  # row 1: padding


def _conv(g, batch):
    dim, width = 13, 4
    return dict(
        x=torch.randn(batch, dim, generator=g),
        conv_state=torch.randn(SLOTS, dim, width - 1, generator=g),
        weight=torch.randn(dim, width, generator=g),
        bias=torch.randn(dim, generator=g),
        activation="silu",
    )


def _mamba(g, batch):
    dim, n = 10, 5
    return dict(
        state=torch.randn(SLOTS, dim, n, generator=g),
        x=torch.randn(batch, dim, generator=g),
        dt=torch.randn(batch, dim, generator=g),
        A=-torch.rand(dim, n, generator=g),
        B=torch.randn(batch, n, generator=g),
        C=torch.randn(batch, n, generator=g),
        D=torch.randn(dim, generator=g),
        z=torch.randn(batch, dim, generator=g),
        dt_bias=torch.randn(dim, generator=g),
        dt_softplus=True,
    )


def _ssd(g, batch):
    heads, head_dim, n, groups = 4, 3, 7, 2
    return dict(
        state=torch.randn(SLOTS, heads, head_dim, n, generator=g),
        x=torch.randn(batch, heads, head_dim, generator=g),
        dt=torch.randn(batch, heads, generator=g),
        A=-torch.rand(heads, generator=g),
        B=torch.randn(batch, groups, n, generator=g),
        C=torch.randn(batch, groups, n, generator=g),
        D=torch.randn(heads, generator=g),
        z=torch.randn(batch, heads, head_dim, generator=g),
        dt_bias=torch.randn(heads, generator=g),
        dt_softplus=True,
    )


CASES = {
    "causal_conv1d_update": (causal_conv1d_update_fwd, _conv, "conv_state"),
    "selective_state_update": (selective_state_update_fwd, _mamba, "state"),
    "ssd_state_update": (ssd_state_update_fwd, _ssd, "state"),
}


@pytest.mark.parametrize(
    "index_dtype,dtype",
    [(torch.int32, torch.float32), (torch.int64, torch.float32), (torch.int32, torch.float16)],
)
@pytest.mark.parametrize("op", list(CASES))
def test_rows_read_and_write_their_slots_in_place(op, index_dtype, dtype):
    """float16 inputs: the per-row tensors (the state pool stays float32)."""
    launcher, make, state_name = CASES[op]
    args = make(torch.Generator().manual_seed(len(op)), len(ROWS))
    args = {k: v.to(dtype) if _per_row(k, v) else v for k, v in args.items()}
    pool = args[state_name]
    before = pool.clone()
    indices = torch.tensor(ROWS, dtype=index_dtype)
    out, new = launcher(**args, state_indices=indices)
    assert new is pool  # the pool is the new state
    live = [i for i, s in enumerate(ROWS) if s >= 0]
    slots = [ROWS[i] for i in live]
    plain = {k: (v[live] if k not in (state_name,) and _per_row(k, v) else v)
             for k, v in args.items()}
    plain[state_name] = before[slots]
    want_out, want_new = launcher(**plain)
    torch.testing.assert_close(out[live], want_out, rtol=0, atol=0)
    torch.testing.assert_close(pool[slots], want_new, rtol=0, atol=0)
    assert not out[1].any()  # the padding row
    untouched = [s for s in range(SLOTS) if s not in slots]
    assert torch.equal(pool[untouched], before[untouched])


def _per_row(name: str, value) -> bool:
    """The arguments with a batch dim (weights and flags have none)."""
    return isinstance(value, torch.Tensor) and name in ("x", "dt", "B", "C", "z")


def test_bad_indices_and_pools_are_one_line_errors():
    args = _conv(torch.Generator().manual_seed(0), 2)
    with pytest.raises(RuntimeError, match=r"causal_conv1d_update: state_indices must be int32"):
        causal_conv1d_update_fwd(**args, state_indices=torch.tensor([0.0, 1.0]))
    args = _mamba(torch.Generator().manual_seed(0), 2)
    args["state"] = args["state"].double()
    with pytest.raises(RuntimeError, match=r"pool updated in place is contiguous float32") as e:
        selective_state_update_fwd(**args, state_indices=torch.tensor([0, 1]))
    assert "\n" not in str(e.value) and "selective_state_update" in str(e.value)


def test_slot_variants_build_for_sm90_without_spills():
    """The launches with slot indices at mamba-130m's shapes (d 1536, n 16; conv width 4) and a
    Mamba-2 layer of mamba2-130m (24 heads of 64, n 128), batch 64, recorded with the GPU's
    meta-parameters and compiled for sm_90: no spills."""
    from ssmcc.kernels.triton import aot

    from .test_triton_mixer_steps import _ptxas_report

    batch, slots = 64, torch.arange(64, dtype=torch.int32)
    g = torch.Generator().manual_seed(0)
    conv = dict(x=torch.zeros(batch, 1536), conv_state=torch.zeros(batch, 1536, 3),
                weight=torch.zeros(1536, 4), bias=torch.zeros(1536), activation="silu")
    mamba = dict(state=torch.zeros(batch, 1536, 16), x=torch.zeros(batch, 1536),
                 dt=torch.zeros(batch, 1536), A=torch.zeros(1536, 16), B=torch.zeros(batch, 16),
                 C=torch.zeros(batch, 16), D=torch.zeros(1536), z=torch.zeros(batch, 1536),
                 dt_bias=torch.zeros(1536), dt_softplus=True)
    ssd = _ssd(g, batch)
    ssd.update(state=torch.zeros(batch, 24, 64, 128), x=torch.zeros(batch, 24, 64),
               dt=torch.zeros(batch, 24), A=torch.zeros(24), B=torch.zeros(batch, 1, 128),
               C=torch.zeros(batch, 1, 128), D=torch.zeros(24), z=torch.zeros(batch, 24, 64),
               dt_bias=torch.zeros(24))

    def run():
        causal_conv1d_update_fwd(**conv, state_indices=slots)
        selective_state_update_fwd(**mamba, state_indices=slots)
        ssd_state_update_fwd(**ssd, state_indices=slots)

    kernels = aot._jit_functions()
    specs = [aot.specialization(*launch) for launch in aot.record_launches(run)]
    assert {s.kernel for s in specs} == {"_causal_conv1d_update_kernel", "_state_update_kernel"}
    for spec in specs:
        registers, spills = _ptxas_report(aot._compile(spec, 90, kernels).asm["ptx"])
        assert spills == 0 and registers <= 255, (spec.kernel, registers, spills)
