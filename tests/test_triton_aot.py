"""Ahead-of-time builds of the Triton kernels (``kernels/triton/aot.py``, ``ssmcc kernels
build``): every specialisation a model's programs launch compiles to PTX and cubin for each
architecture, and the manifest describes how to launch it. No GPU is needed (ptxas ships with
Triton); nothing here runs a binary.

Default: the tiny Mamba-1 preset for sm_90, with each binary's registers and spills checked
against the cubin itself (cuobjdump) and a spill forced to show the report sees one. Slow (the
acceptance checks): mamba-130m and mamba2-130m for sm_80, sm_86, sm_89 and sm_90; no spill in the
mamba-130m, mamba2-130m and granite-hybrid-200m builds (float32 and bfloat16, sm_90; ~6 minutes on
a 2-core CPU).
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess

import pytest
import torch

import ssmcc
from ssmcc.errors import OptionError
from ssmcc.presets import build_preset

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import aot  # noqa: E402
from ssmcc.kernels.triton.catalog import GRID_RULES  # noqa: E402


@functools.cache
@functools.cache
def _specs(name: str, dtype: str | None = None) -> tuple:
    """The specialisations a preset's build needs (recorded once per module: ~15 s each; the
    four-architecture and the no-spill tests share the 130M models' float32 ones)."""
    model = build_preset(name).eval()
    compiled = ssmcc.compile(model, target="triton", interpret=True, dtype=dtype)
    return tuple(aot.model_specializations(compiled))


def _cuobjdump_registers(cubin_path) -> int:
    """Registers per thread as the cubin itself records them (Triton's cuobjdump)."""
    from triton.backends.nvidia.compiler import get_ptxas

    tool = os.path.join(os.path.dirname(get_ptxas(90).path), "cuobjdump")
    usage = subprocess.run(
        [tool, "--dump-resource-usage", str(cubin_path)], capture_output=True, text=True, check=True
    ).stdout
    return int(re.search(r"REG:(\d+)", usage).group(1))


def _check_manifest(folder, specs, archs):
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["archs"] == list(archs)
    entries = manifest["kernels"]
    assert len(entries) == len(specs) * len(archs)
    assert {(e["specialization"], e["arch"]) for e in entries} == {
        (s.key, a) for s in specs for a in archs
    }
    by_key = {s.key: s for s in specs}
    for entry in entries:
        spec = by_key[entry["specialization"]]
        ptx = (folder / entry["ptx"]).read_text()
        cubin = (folder / entry["cubin"]).read_bytes()
        assert f".entry {entry['entry']}(" in ptx and cubin[:4] == b"\x7fELF"
        assert f".target {entry['arch']}" in ptx
        # the launch: parameters in the PTX's order (the runtime ones, then two scratch pointers)
        assert ptx.split(f".entry {entry['entry']}(")[1].split(")")[0].count(".param") == len(
            entry["params"]
        )
        assert entry["grid"]["rule"] == GRID_RULES[entry["kernel"]]
        assert all(g >= 1 for g in entry["grid"]["recorded"])
        assert entry["num_warps"] >= 1 and entry["shared_bytes"] >= 0
        # ptxas -v's report is the written binary's
        assert entry["registers"] == _cuobjdump_registers(folder / entry["cubin"])
        assert min(entry[k] for k in ("spill_store_bytes", "spill_load_bytes")) >= 0
        assert entry["stack_frame_bytes"] >= 0
        # the launch's constants and run-time parameters are the recorded specialisation's
        assert entry["constexprs"] == {n: aot._json_value(v) for n, v in spec.constexprs}
        runtime = [[n, t] for n, t in spec.signature if t != "constexpr"]
        assert entry["params"] == runtime + [["global_scratch", "*i8"], ["profile_scratch", "*i8"]]
    return manifest


def test_the_tiny_model_builds_for_one_arch(tmp_path):
    specs = _specs("mamba-tiny")
    kernels = {s.kernel for s in specs}
    assert {"_selective_scan_chunk_scan_kernel", "_mamba_step_update_kernel", "_linear_kernel"} <= (
        kernels
    )
    manifest = _check_manifest_after_build(tmp_path / "out", specs, ("sm_90",))
    # float attributes are compile-time constants (an AOT plugin cannot pass them at run time)
    norm = [e for e in manifest["kernels"] if e["kernel"] == "_rmsnorm_gated_kernel"]
    assert norm and all(e["constexprs"]["eps"] == 1e-5 for e in norm)


def _check_manifest_after_build(folder, specs, archs):
    aot.build(specs, archs, str(folder))
    return _check_manifest(folder, specs, archs)


def test_ptxas_report_is_of_tritons_own_cubin():
    """The report's ptxas run, with Triton's flags, writes Triton's cubin byte for byte (a Triton
    upgrade that changes its flags fails here), and a kernel held to 32 registers reports its
    spills."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernels = aot._jit_functions()
    specs = _specs("mamba-tiny")
    for spec in specs:
        compiled = aot._compile(spec, 90, kernels)
        usage, cubin = aot.ptxas_resources(compiled.asm["ptx"], 90, compiled.metadata)
        assert cubin == compiled.asm["cubin"], spec.kernel
        assert usage["registers"] > 0
    scan = next(s for s in specs if s.kernel == "_selective_scan_chunk_scan_kernel")
    source = ASTSource(
        fn=kernels[scan.kernel], signature=dict(scan.signature), constexprs=dict(scan.constexprs)
    )
    held = triton.compile(
        source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "maxnreg": 32}
    )
    usage, _ = aot.ptxas_resources(held.asm["ptx"], 90, held.metadata)
    assert usage["registers"] <= 32 and usage["spill_store_bytes"] > 0
    assert "1 spilling: _selective_scan_chunk_scan_kernel sm_90" in aot.describe_resources(
        [{"kernel": scan.kernel, "arch": "sm_90", **usage}]
    )
    with pytest.raises(OptionError, match="no resource usage for k"):
        aot.parse_ptxas_log("ptxas info    : 0 bytes gmem", "k")


def test_a_build_reads_tritons_own_ptxas_log_or_reruns_ptxas_on_a_cached_binary():
    """``compile_with_usage``: a fresh compile is reported from the log of the ptxas run that
    wrote the cubin, a binary from Triton's cache by a ptxas run of its own; both say what
    ``ptxas_resources`` says, and nothing reaches stdout."""
    from triton import knobs

    kernels = aot._jit_functions()
    spec = next(s for s in _specs("mamba-tiny") if s.kernel == "_selective_scan_chunk_scan_kernel")
    reran = []
    real = aot.ptxas_resources

    def counted(*args):
        reran.append(args)
        return real(*args)

    def compile_():
        return aot._compile(spec, 90, kernels)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(aot, "ptxas_resources", counted)
        with knobs.compilation.scope():
            knobs.compilation.always_compile = True
            fresh, fresh_usage = aot.compile_with_usage(compile_, 90)
        assert reran == []  # read from Triton's own log
        cached, cached_usage = aot.compile_with_usage(compile_, 90)
        assert len(reran) == 1  # Triton's cache ran no ptxas
    assert fresh.asm["cubin"] == cached.asm["cubin"]
    expected = real(fresh.asm["ptx"], 90, fresh.metadata)[0]
    assert fresh_usage == cached_usage == expected and expected["registers"] > 0


def test_a_failed_build_leaves_nothing(tmp_path, monkeypatch):
    specs = _specs("mamba-tiny")
    with pytest.raises(OptionError, match="unknown architecture"):
        aot.build(specs, ("sm_42",), str(tmp_path / "out"))
    real = aot._compile
    calls = []

    def failing(spec, arch, kernels):
        calls.append(spec)
        if len(calls) == 2:
            raise RuntimeError("ptxas died")
        return real(spec, arch, kernels)

    monkeypatch.setattr(aot, "_compile", failing)
    with pytest.raises(RuntimeError, match="ptxas"):
        aot.build(specs, ("sm_90",), str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []


def test_recording_runs_no_kernel():
    """While recording, launches are listed, not run: the outputs stay as allocated."""
    from ssmcc.kernels.triton.registry import TRITON_KERNELS

    u = torch.randn(1, 64, 3)
    recorded = aot.record_launches(
        lambda: TRITON_KERNELS["selective_scan"](
            u, u, -torch.ones(64, 2), torch.ones(1, 2, 3), torch.ones(1, 2, 3)
        )
    )
    assert [r[0].fn.__name__ for r in recorded] == ["_selective_scan_chunk_scan_kernel"]
    meta = recorded[0][3]  # the GPU's meta-parameters, not the interpreter's
    assert (meta["BLOCK_D"], meta["BLOCK_L"], meta["num_warps"]) == (16, 4, 1)


def test_cli_builds_and_refuses_bad_arch(tmp_path, capsys):
    from ssmcc.cli import main

    assert (
        main(["kernels", "build", "mamba-tiny", "--arch", "sm_77", "--out", str(tmp_path / "k")])
        == 2
    )
    assert "unknown" in capsys.readouterr().err and not (tmp_path / "k").exists()
    assert (
        main(["kernels", "build", "mamba2-tiny", "--arch", "sm_90", "--out", str(tmp_path / "k")])
        == 0
    )
    manifest = json.loads((tmp_path / "k" / "manifest.json").read_text())
    assert manifest["models"] == ["mamba2-tiny"]
    assert {"_ssd_chunk_scan_kernel", "_ssd_step_kernel"} <= {
        e["kernel"] for e in manifest["kernels"]
    }
    # the summary line carries the registers and names any spilling binary
    out = capsys.readouterr().out
    assert re.search(r"registers \d+-\d+ per thread, (no spills|\d+ spilling: )", out), out


@pytest.mark.slow
def test_130m_models_build_for_four_architectures(tmp_path):
    archs = ("sm_80", "sm_86", "sm_89", "sm_90")
    specs = {}
    for name in ("mamba-130m", "mamba2-130m"):
        for spec in _specs(name, "float32"):
            specs.setdefault(spec.key, spec)
    specs = list(specs.values())
    kernels = {s.kernel for s in specs}
    assert {
        "_selective_scan_chunk_scan_kernel",
        "_ssd_chunk_scan_kernel",
        "_ssd_chunk_state_kernel",
        "_mamba_step_conv_proj_kernel",
        "_mamba_step_update_kernel",
        "_ssd_step_kernel",
        "_causal_conv1d_kernel",
        "_rmsnorm_gated_kernel",
        "_linear_kernel",
    } <= kernels
    _check_manifest_after_build(tmp_path / "out", specs, archs)


@pytest.mark.slow
def test_presets_build_without_spills(tmp_path):
    """Issue 47's acceptance: no binary of the mamba-130m, mamba2-130m and granite-hybrid-200m
    builds (float32 and bfloat16, sm_90) spills registers to local memory."""
    where: dict[str, set] = {}
    specs = {}
    for name in ("mamba-130m", "mamba2-130m", "granite-hybrid-200m"):
        for dtype in ("float32", "bfloat16"):
            for spec in _specs(name, dtype):
                specs.setdefault(spec.key, spec)
                where.setdefault(spec.key, set()).add(f"{name} {dtype}")
    manifest = aot.build(list(specs.values()), ("sm_90",), str(tmp_path / "out"))
    spilling = [
        f"{e['kernel']} {e['constexprs']} warps {e['num_warps']}: {e['registers']} registers, "
        f"{e['spill_store_bytes']} B stored / {e['spill_load_bytes']} B loaded "
        f"({', '.join(sorted(where[e['specialization']]))})"
        for e in manifest["kernels"]
        if e["spill_store_bytes"] or e["spill_load_bytes"]
    ]
    assert not spilling, "binaries that spill:\n" + "\n".join(spilling)


def test_interpreted_runs_leave_triton_as_they_found_it(tmp_path):
    """Triton's interpreter patches the language for every library call made inside a kernel and
    never restores those patches; ``runtime.interpreted_language`` puts back every name, so a
    compiled build later in the same process (here: the kernels no model preset above launches:
    attention, MoE experts, quantised linear and embedding, positions) still compiles."""
    from ssmcc.kernels.triton import runtime
    from ssmcc.kernels.triton.registry import TRITON_KERNELS
    from ssmcc.ops.quantized_linear import quantize_weight

    before = [(owner, dict(vars(owner))) for owner in runtime._language_namespaces()]
    q = torch.randn(1, 4, 5, 16)
    k = torch.randn(1, 2, 5, 16)
    long_q, long_k = torch.randn(1, 4, 20, 16), torch.randn(1, 2, 20, 16)
    weight, scale = quantize_weight(torch.randn(24, 64), "int8-g32")
    hidden, index = torch.randn(3, 64), torch.tensor([[0, 1], [1, 0], [2, 1]])
    up, down = torch.randn(3, 64, 64), torch.randn(3, 64, 32)

    def run_all():
        TRITON_KERNELS["attention"](q, k, k, 0.25, k, k)  # decode: split keys
        TRITON_KERNELS["attention"](long_q, long_k, long_k, 0.25)  # prefill
        TRITON_KERNELS["moe_experts"](hidden, index, torch.rand(3, 2), up, down, "gelu", True)
        TRITON_KERNELS["moe_experts"](hidden[:1], index[:1], torch.rand(1, 2), up, down)
        TRITON_KERNELS["quantized_linear"](torch.randn(3, 64), weight, scale)
        TRITON_KERNELS["quantized_embedding"](torch.tensor([[1, 2]]), weight, scale)
        TRITON_KERNELS["positions"](torch.zeros(2, 3, dtype=torch.long), torch.tensor([[4], [0]]))
        TRITON_KERNELS["rmsnorm_gated"](hidden, hidden, torch.ones(64), 32)

    run_all()  # interpreted
    for owner, saved in before:
        now = vars(owner)
        changed = [n for n, v in saved.items() if now.get(n) is not v]
        added = [n for n in now if n not in saved] if isinstance(owner, type) else []
        assert not changed and not added, (owner, changed, added)
    specs = {}
    for launch in aot.record_launches(run_all):
        spec = aot.specialization(*launch)
        specs.setdefault(spec.key, spec)
    kernels = {s.kernel for s in specs.values()}
    assert {
        "_attention_kernel",
        "_attention_split_kernel",
        "_attention_combine_kernel",
        "_moe_up_kernel",
        "_moe_down_kernel",
        "_moe_route_kernel",
        "_moe_up_grouped_kernel",
        "_moe_down_grouped_kernel",
        "_moe_sum_kernel",
        "_embedding_kernel",
        "_positions_kernel",
    } <= kernels
    _check_manifest_after_build(tmp_path / "out", list(specs.values()), ("sm_90",))
