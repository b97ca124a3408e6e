"""The GPU check's anchors (``benchmarks/gpu_anchors.py``, ``gpu_contenders.py``): mamba_ssm's
Triton kernels loaded from a source tree without its CUDA extensions and leaving no module behind,
fla's simple GLA mapped onto the SSD scan (checked against ``ssd_scan``'s reference through fla's
own PyTorch recurrences, on the CPU), and gates that never count a missing contender as beaten.
The anchors' kernels themselves run in ``test_gpu_check.py``'s dry run."""

from __future__ import annotations

import sys

import pytest
import torch

from benchmarks import gpu_anchors
from benchmarks.gpu_contenders import failed, gate, gate_summary, measured, skipped
from ssmcc.ops.ssd_scan import ssd_scan_ref
from tests.anchor_trees import anchor_tree


@pytest.fixture(scope="module")
def mamba_tree(tmp_path_factory):
    tree = anchor_tree("SSMCC_MAMBA_SSM_SRC", tmp_path_factory.mktemp("mamba"))
    if tree is None:
        pytest.skip("no state-spaces/mamba tree: set SSMCC_MAMBA_SSM_SRC or SSMCC_ANCHOR_MIRRORS")
    return tree


@pytest.fixture(scope="module")
def fla_tree(tmp_path_factory):
    tree = anchor_tree("SSMCC_FLA_SRC", tmp_path_factory.mktemp("fla"))
    if tree is None:
        pytest.skip("no fla tree: set SSMCC_FLA_SRC or SSMCC_ANCHOR_MIRRORS")
    return tree


def test_mamba_ssm_loads_its_triton_ops_and_leaves_no_module(mamba_tree):
    pytest.importorskip("einops", reason="mamba_ssm's kernels import einops")
    before = set(sys.modules)
    anchor = gpu_anchors.load_mamba_ssm(mamba_tree)
    assert anchor.loaded, anchor.status
    assert set(anchor.functions) == set(gpu_anchors.MAMBA_SSM_FUNCTIONS)
    assert all(callable(f) for f in anchor.functions.values())
    assert any(m.__name__.endswith("ssd_chunk_scan") for m in anchor.modules)
    planted = {"mamba_ssm", *gpu_anchors.CUDA_EXTENSIONS}
    assert not {n for n in set(sys.modules) - before if n.split(".")[0] in planted}
    # its package __init__ (model classes, CUDA extensions) never ran
    assert "mamba_ssm.modules" not in sys.modules


def test_mamba_ssm_says_why_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_anchors.MAMBA_SSM_ENV, raising=False)
    assert gpu_anchors.load_mamba_ssm().status == (
        "skipped: SSMCC_MAMBA_SSM_SRC is not set (a state-spaces/mamba tree)"
    )
    assert "has no mamba_ssm/ops/triton/ssd_combined.py" in (
        gpu_anchors.load_mamba_ssm(str(tmp_path)).status
    )
    broken = tmp_path / "mamba_ssm" / "ops" / "triton"
    broken.mkdir(parents=True)
    for name in ("layernorm_gated", "selective_state_update"):
        (broken / f"{name}.py").write_text("")
    (broken / "ssd_combined.py").write_text("from causal_conv1d import causal_conv1d_fn\n")
    anchor = gpu_anchors.load_mamba_ssm(str(tmp_path))
    assert anchor.status.startswith("failed: import: ImportError") and not anchor.loaded
    assert "causal_conv1d" not in sys.modules and "mamba_ssm" not in sys.modules


def _ssd_args(dtype=torch.float32, D_per_channel=False, seed=0):
    """ssd_scan's arguments with every option on: groups, an odd length, bias, softplus, a dt
    clamp that binds, D, z and an initial state."""
    gen = torch.Generator().manual_seed(seed)
    b, length, h, p, g, n = 2, 37, 4, 5, 2, 16

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    return dict(
        x=r(b, length, h, p),
        dt=r(b, length, h),
        A=-torch.rand(h, generator=gen) - 0.5,
        B=r(b, length, g, n, scale=0.5),
        C=r(b, length, g, n, scale=0.5),
        D=torch.randn(h, p, generator=gen) if D_per_channel else torch.randn(h, generator=gen),
        z=r(b, length, h, p),
        dt_bias=torch.randn(h, generator=gen),
        dt_softplus=True,
        dt_min=0.01,
        dt_max=1.5,
        initial_state=torch.randn(b, h, p, n, generator=gen),
    )


@pytest.mark.parametrize("recurrence", ["naive_recurrent_simple_gla", "naive_chunk_simple_gla"])
@pytest.mark.parametrize("D_per_channel", [False, True])
def test_fla_simple_gla_mapping_is_the_ssd_scan(fla_tree, recurrence, D_per_channel):
    """q = C, k = B per head, v = x dt, g = dt A, scale 1, states transposed; D and z outside:
    fla's own PyTorch recurrences (token by token, and chunked) give ssd_scan's reference."""
    pytest.importorskip("einops", reason="fla's reference imports einops")
    anchor = gpu_anchors.load_fla(fla_tree, kernels=False)
    assert anchor.loaded, anchor.status
    args = _ssd_args(D_per_channel=D_per_channel)
    out, final = gpu_anchors.fla_ssd_scan(anchor.functions, args, kernel=recurrence)()
    want_out, want_final = ssd_scan_ref(**args)
    torch.testing.assert_close(out, want_out, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(final, want_final, rtol=1e-5, atol=1e-5)
    # the clamp binds here: without it the mapping would not match
    assert float(torch.nn.functional.softplus(args["dt"] + args["dt_bias"]).max()) > 1.5


def test_fla_says_why_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.delenv(gpu_anchors.FLA_ENV, raising=False)
    anchor = gpu_anchors.load_fla(str(tmp_path))
    assert anchor.status.startswith(f"skipped: {tmp_path} has no fla/") and not anchor.loaded


def test_a_skipped_or_failed_contender_is_never_beaten():
    assert gate(1.0, True, measured(ms=2.0)) is True
    assert gate(3.0, True, measured(ms=2.0)) is False
    assert gate(1.0, False, measured(ms=2.0)) is False  # ssmcc wrong: not met
    assert gate(1.0, True, measured(ms=2.0, ok=False)) is None  # the anchor wrong
    assert gate(1.0, True, skipped("no GPU")) is None
    assert gate(1.0, True, failed(RuntimeError("boom"))) is None
    assert gate(1.0, True, None) is None
    rows = [
        {"ok": True, "triton_ms": 1.0, "contenders": {"a": measured(ms=2.0), "b": skipped("x")}},
        {"ok": True, "triton_ms": 3.0, "contenders": {"a": measured(ms=2.0), "b": failed("y")}},
    ]
    assert gate_summary(rows, {"ms": "triton_ms"}) == {
        "a": {"ms": {"met": 1, "not_met": 1, "unmeasured": 0}},
        "b": {"ms": {"met": 0, "not_met": 0, "unmeasured": 2}},
    }
    assert failed(RuntimeError("boom"))["status"] == "failed: RuntimeError: boom"
