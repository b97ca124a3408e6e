"""One-shot GPU check of ssmcc's Triton kernels: correctness at real sizes, time, bandwidth,
against the anchors measured in the same run.

For each op at the sizes of mamba-130m (Mamba-1: d 1536, state 16, conv 4, dt rank 48) and
mamba2-130m (Mamba-2: 24 heads x 64, state 128, 1 group), sequence lengths 512/2048/8192 and
batch 1/8 (the sequence ops; the step ops at batch 1/8/64), then, while the budget lasts, the
2.7B-class sizes (mamba-2.8b, mamba2-2.7b; bf16, L 2048, batch 1; steps at batch 1/64):

    ok        the Triton kernel's outputs against the op's PyTorch reference on the same device,
              at mamba_ssm's tolerances (fp32 6e-4/2e-3, fp16 3e-3/5e-3, bf16 3e-2/5e-2),
              elementwise; ``ok_scaled`` scales the absolute part by the output's largest
              value (a large output rounds near its cancelled elements); ``of``: that value
    triton    time per call of the kernel (CUDA events, median)
    torch     time per call of the reference (eager; the scans loop over the sequence)
    compiled  the reference under torch.compile, L=512 only (it unrolls the loop: compile time
              grows with L)
    GB/s      bytes of the inputs and outputs / kernel time, as a fraction of the device's
              published peak and of ``copy``: ``torch.Tensor.copy_`` between two 1 GiB buffers
              on the device, measured at the start of the run (the roofline)
    contenders  per row, each anchor on the same arguments (``gpu_anchors.py`` holds the
              mappings): mamba_ssm's Triton ``mamba_chunk_scan_combined`` (ssd_scan),
              ``selective_state_update`` (both steps) and ``rmsnorm_fn`` (rmsnorm_gated), from
              the source tree ``SSMCC_MAMBA_SSM_SRC``; fla's ``chunk_simple_gla`` (ssd_scan)
              from ``SSMCC_FLA_SRC`` or as installed. Each: checked against the reference like
              the kernel, its first call (compile, autotuning) and time per call, GB/s; or
              "skipped: <why>" / "failed: <error>" (``gpu_contenders.py``). ``gates`` counts,
              per anchor, the rows where ssmcc's time is at most the anchor's: met, not met,
              unmeasured (an anchor skipped, failed or wrong is never beaten)

Prints a table and writes JSON after every row. Depends on ssmcc's ops and Triton kernels and
runs on the machine's own torch and triton (install ssmcc there with
``pip install --no-deps --no-build-isolation -e .``); the anchors are optional. ``--dry`` runs the
same code on the CPU in Triton's interpreter at tiny shapes (the test suite does, so the script
cannot rot): mamba_ssm's kernels run there too (each autotuned kernel at its first config); fla's
do not, so its rows say "skipped: no GPU" and check the mapping through fla's own PyTorch
recurrence. ``benchmarks/README.md`` says how to carry the anchors to a GPU machine.

    SSMCC_MAMBA_SSM_SRC=mamba SSMCC_FLA_SRC=fla-core \
        python benchmarks/gpu_check.py --out gpu_check.json      # on a CUDA machine, < 5 min
    python benchmarks/gpu_check.py --dry --out /tmp/dry.json     # anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu_anchors import (  # noqa: E402
    CONTENDERS,
    cpu_device_scope,
    first_configs_only,
    fla_ssd_scan,
    load_fla,
    load_mamba_ssm,
)
from benchmarks.gpu_contenders import (  # noqa: E402
    describe,
    failed,
    gate_summary,
    is_measured,
    measured,
    skipped,
)

# Published peak memory bandwidth, GB/s (vendor data sheets), by a name fragment.
PEAK_GBS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100-SXM4-40GB": 1555.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "L4": 300.0,
    "A10": 600.0,
    "RTX 4090": 1008.0,
}
TOLERANCES = {
    torch.float32: (6e-4, 2e-3),
    torch.float16: (3e-3, 5e-3),
    torch.bfloat16: (3e-2, 5e-2),
}
MAMBA1 = dict(dim=1536, state=16, width=4, rank=48)
MAMBA2 = dict(heads=24, head_dim=64, state=128, groups=1, width=4)
TINY1 = dict(dim=13, state=7, width=4, rank=5)
TINY2 = dict(heads=3, head_dim=5, state=16, groups=1, width=4)
# 2.7B-class (state-spaces/mamba-2.8b: d_model 2560; mamba2-2.7b: 80 heads of 64): optional rows
MAMBA1_2P8B = dict(dim=5120, state=16, width=4, rank=160)
MAMBA2_2P7B = dict(heads=80, head_dim=64, state=128, groups=1, width=4)
ANCHOR_SHARE = 0.7  # contenders run while this share of the budget lasts
OPTIONAL_SHARE = 0.8  # the 2.7B-class rows, likewise


def _randn(gen, *shape, device, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dtype)


def scan_args(op, size, batch, length, dtype, device, gen):
    """The op's keyword arguments at one size (as a model calls it)."""
    r = lambda *s, **k: _randn(gen, *s, device=device, **k)  # noqa: E731
    if op in (
        "selective_scan",
        "selective_state_update",
        "causal_conv1d",
        "causal_conv1d_update",
        "mamba_mixer",
        "mamba_mixer_step",
    ):
        d, n, k, rank = size["dim"], size["state"], size["width"], size["rank"]
        A = -torch.rand(d, n, generator=gen).to(device) - 0.5
        if op == "selective_scan":
            return dict(
                u=r(batch, d, length, dtype=dtype),
                delta=r(batch, d, length, dtype=dtype),
                A=A,
                B=r(batch, n, length, dtype=dtype),
                C=r(batch, n, length, dtype=dtype),
                D=r(d),
                z=r(batch, d, length, dtype=dtype),
                delta_bias=r(d),
                delta_softplus=True,
                initial_state=r(batch, d, n),
            )
        if op == "selective_state_update":
            return dict(
                state=r(batch, d, n),
                x=r(batch, d, dtype=dtype),
                dt=r(batch, d, dtype=dtype),
                A=A,
                B=r(batch, n, dtype=dtype),
                C=r(batch, n, dtype=dtype),
                D=r(d),
                z=r(batch, d, dtype=dtype),
                dt_bias=r(d),
                dt_softplus=True,
            )
        if op == "causal_conv1d":
            return dict(
                x=r(batch, d, length, dtype=dtype),
                weight=r(d, k),
                bias=r(d),
                initial_state=r(batch, d, k - 1),
                activation="silu",
            )
        if op == "causal_conv1d_update":
            return dict(
                x=r(batch, d, dtype=dtype),
                conv_state=r(batch, d, k - 1),
                weight=r(d, k),
                bias=r(d),
                activation="silu",
            )
        common = dict(
            conv_weight=r(d, k),
            conv_bias=r(d),
            x_proj_weight=r(rank + 2 * n, d, scale=0.05),
            dt_proj_weight=r(d, rank, scale=0.1),
            A=A,
            D=r(d),
            dt_bias=r(d),
            x_offset=0,
            z_offset=d,
            activation="silu",
            delta_softplus=True,
            bcdt_rms_eps=None,
        )
        if op == "mamba_mixer":
            return dict(
                zx=r(batch, length, 2 * d, dtype=dtype),
                **common,
                conv_state=r(batch, d, k - 1),
                ssm_state=r(batch, d, n),
            )
        return dict(
            zx=r(batch, 2 * d, dtype=dtype),
            **common,
            conv_state=r(batch, d, k - 1),
            ssm_state=r(batch, d, n),
        )
    h, p, n, g, k = size["heads"], size["head_dim"], size["state"], size["groups"], size["width"]
    A = -torch.rand(h, generator=gen).to(device) - 0.5
    if op == "ssd_scan":
        return dict(
            x=r(batch, length, h, p, dtype=dtype),
            dt=r(batch, length, h, dtype=dtype),
            A=A,
            B=r(batch, length, g, n, dtype=dtype),
            C=r(batch, length, g, n, dtype=dtype),
            D=r(h),
            z=None,
            dt_bias=r(h),
            dt_softplus=True,
            dt_min=0.0,
            dt_max=None,
            initial_state=r(batch, h, p, n),
        )
    if op == "ssd_state_update":
        return dict(
            state=r(batch, h, p, n),
            x=r(batch, h, p, dtype=dtype),
            dt=r(batch, h, dtype=dtype),
            A=A,
            B=r(batch, g, n, dtype=dtype),
            C=r(batch, g, n, dtype=dtype),
            D=r(h),
            z=r(batch, h, p, dtype=dtype),
            dt_bias=r(h),
            dt_softplus=True,
        )
    if op == "rmsnorm_gated":
        return dict(
            x=r(batch, length, h * p, dtype=dtype),
            z=r(batch, length, h * p, dtype=dtype),
            weight=r(h * p),
            group_size=h * p,
            eps=1e-5,
            norm_before_gate=False,
        )
    inner, channels = h * p, h * p + 2 * g * n
    width = 2 * inner + 2 * g * n + h
    common = dict(
        conv_weight=r(channels, k),
        conv_bias=r(channels),
        A=A,
        D=r(h),
        dt_bias=r(h),
        norm_weight=r(inner),
        groups=g,
        z_offset=0,
        xbc_offset=inner,
        dt_offset=inner + channels,
        norm_group_size=inner,
        eps=1e-5,
        norm_before_gate=False,
        activation="silu",
        dt_softplus=True,
        dt_min=0.0,
        dt_max=None,
    )
    if op == "ssd_mixer":
        return dict(
            zxbcdt=r(batch, length, width, dtype=dtype),
            **common,
            conv_state=r(batch, channels, k - 1),
            ssm_state=r(batch, h, p, n),
        )
    return dict(
        zxbcdt=r(batch, width, dtype=dtype),
        **common,
        conv_state=r(batch, channels, k - 1),
        ssm_state=r(batch, h, p, n),
    )


MAMBA1_OPS = ("selective_scan", "causal_conv1d", "mamba_mixer")
MAMBA1_STEPS = ("selective_state_update", "causal_conv1d_update", "mamba_mixer_step")
MAMBA2_OPS = ("ssd_scan", "rmsnorm_gated", "ssd_mixer")
MAMBA2_STEPS = ("ssd_state_update", "ssd_mixer_step")
COMPILED_AT = 512  # torch.compile of the reference only at this length (it unrolls the loop)


def _nbytes(values) -> int:
    total = 0
    for v in values:
        if isinstance(v, torch.Tensor):
            total += v.numel() * v.element_size()
        elif isinstance(v, (tuple, list)):
            total += _nbytes(v)
    return total


def _time(fn, device, repeats: int) -> float:
    """Median seconds per call."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def _compare(got, expected, dtype) -> dict:
    """Elementwise at mamba_ssm's tolerances (``ok``: |got - ref| <= atol + rtol |ref|), and
    against the output's scale (``ok_scaled``: atol times max(1, max |ref|)), which tells
    rounding near a cancelled element of a large output from a wrong kernel."""
    rtol, atol = TOLERANCES[dtype]
    got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
    expected = (expected,) if isinstance(expected, torch.Tensor) else tuple(expected)
    worst, scale, ok, ok_scaled = 0.0, 0.0, True, True
    for g, e in zip(got, expected, strict=True):
        diff, e = (g.float() - e.float()).abs(), e.float()
        if not diff.numel():
            continue
        worst, largest = max(worst, float(diff.max())), float(e.abs().max())
        scale = max(scale, largest)
        ok = ok and bool(torch.all(diff <= atol + rtol * e.abs()))
        ok_scaled = ok_scaled and bool(torch.all(diff <= atol * max(1.0, largest) + rtol * e.abs()))
    return dict(ok=ok, ok_scaled=ok_scaled, max_abs_diff=worst, max_abs_ref=scale)


def peak_bandwidth(device) -> tuple[float, str]:
    """(GB/s, where it came from): the published figure of the device, nan where unknown."""
    if device.type != "cuda":
        return float("nan"), "cpu (dry run)"
    name = torch.cuda.get_device_name(device)
    for fragment, gbs in PEAK_GBS.items():
        if fragment in name:
            return gbs, f"published ({name})"
    return float("nan"), f"unpublished ({name})"


def copy_bandwidth(device) -> float:
    """GB/s of ``torch.Tensor.copy_`` between two buffers on the device (1 GiB each on a GPU),
    bytes read plus written: the roofline every row is set against, measured in this run."""
    numel = (1 << 28) if device.type == "cuda" else (1 << 22)
    a = torch.ones(numel, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    seconds = _time(lambda: b.copy_(a), device, 10)
    return 2 * a.numel() * a.element_size() / seconds / 1e9


@dataclasses.dataclass
class Run:
    """What every row of one run shares."""

    device: torch.device
    dry: bool
    repeats: int
    budget_s: float
    peak: float  # published GB/s, nan where unknown
    peak_source: str
    copy_GBps: float
    anchors: dict  # name -> gpu_anchors.Anchor
    started: float = dataclasses.field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started


def _result(run: Run, rows) -> dict:
    checked = [r for r in rows if "skipped" not in r]
    return {
        "device": torch.cuda.get_device_name(run.device)
        if run.device.type == "cuda"
        else platform.processor() or "cpu",
        "dry": run.dry,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": sys.version.split()[0],
        "peak_GBps": None if math.isnan(run.peak) else run.peak,
        "peak_source": run.peak_source,
        "copy_GBps": run.copy_GBps,
        "anchors": {name: anchor.status for name, anchor in run.anchors.items()},
        "seconds": run.elapsed(),
        "rows": rows,
        "gates": gate_summary(rows, {"ms": "triton_ms"}),
        "all_ok": all(r.get("ok") for r in checked),
        "all_ok_scaled": all(r.get("ok_scaled") for r in checked),
    }


def write_json(result: dict, out: str | None) -> None:
    """Written whole (a temporary file, then renamed) after every row: a run cut short by its
    time limit still leaves its rows."""
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(out + ".tmp", out)


def _kernel_row(kernel, reference, row, dtype, args, run: Run, slow_reference):
    """``row`` (op, family, batch, length) completed with the kernel's check and times; and the
    reference's outputs (None where it failed), which the contenders are checked against."""
    length, expected = row["length"], None
    row["dtype"] = str(dtype).removeprefix("torch.")
    try:
        got = kernel(**args)
        expected = reference(**args)
        row.update(_compare(got, expected, dtype))
        row["triton_ms"] = _time(functools.partial(kernel, **args), run.device, run.repeats) * 1e3
        row["torch_ms"] = (
            None
            if slow_reference
            else _time(functools.partial(reference, **args), run.device, 1 if length > 512 else 3)
            * 1e3
        )
        row["moved_bytes"] = _nbytes(args.values()) + _nbytes(got)
        _bandwidth(row, row["triton_ms"], row["moved_bytes"], run)
    except Exception as error:  # a kernel that fails is a finding: keep going
        row["ok"] = False
        row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    return row, expected


def _bandwidth(entry: dict, ms: float, moved: int, run: Run) -> None:
    entry["GBps"] = moved / (ms / 1e3) / 1e9
    entry["of_peak"] = entry["GBps"] / run.peak if run.peak == run.peak else None
    entry["of_copy"] = entry["GBps"] / run.copy_GBps


def _contender(anchor, mapping, args, expected, dtype, row, run: Run) -> dict:
    """One anchor on the row's arguments: checked against the op's reference, then timed as the
    kernel is. In a dry run its kernels run in Triton's interpreter on the CPU."""
    scope = cpu_device_scope() if run.dry else contextlib.nullcontext()
    try:
        with scope:
            call = mapping(anchor.functions, args)
            started = time.perf_counter()
            got = call()  # the first call: Triton's compile and the anchor's autotuning
            if run.device.type == "cuda":
                torch.cuda.synchronize()
            entry = measured(first_call_s=time.perf_counter() - started)
            entry.update(_compare(got, expected, dtype))
            entry["ms"] = _time(call, run.device, run.repeats) * 1e3
    except Exception as error:  # an anchor that fails is reported, never counted as beaten
        return failed(error)
    if row.get("moved_bytes"):
        _bandwidth(entry, entry["ms"], row["moved_bytes"], run)
    return entry


def _fla_mapping_only(anchor, args, expected, dtype) -> dict:
    """A dry run's fla entry: its chunk kernels need a GPU (``import``: whether they imported),
    but the mapping runs through fla's own PyTorch recurrence, checked against the reference."""
    entry = skipped("no GPU (fla's chunk kernels do not run in Triton's interpreter)")
    entry["import"] = anchor.status
    try:
        got = fla_ssd_scan(anchor.functions, args, kernel="naive_recurrent_simple_gla")()
        entry["mapping"] = {"via": "naive_recurrent_simple_gla", **_compare(got, expected, dtype)}
    except Exception as error:
        entry["mapping"] = failed(error)
    return entry


def _contenders(op, args, expected, dtype, row, run: Run) -> dict:
    entries = {}
    for name, mapping in CONTENDERS.get(op, ()):
        anchor = run.anchors[name]
        if run.dry and name == "fla" and "naive_recurrent_simple_gla" in anchor.functions:
            entries[name] = _fla_mapping_only(anchor, args, expected, dtype)
        elif not anchor.loaded:
            entries[name] = {"status": anchor.status}
        elif expected is None:
            entries[name] = skipped("the op's reference failed on this row")
        elif run.elapsed() > ANCHOR_SHARE * run.budget_s:
            entries[name] = skipped("time budget")
        else:
            entries[name] = _contender(anchor, mapping, args, expected, dtype, row, run)
    return entries


def _compiled_reference(reference, row, args, device, repeats) -> None:
    """``torch.compile`` of the op's reference: first call (compile) and time per call. A
    failure to compile is recorded in the row; it says nothing about the kernel."""
    try:
        compiled = torch.compile(reference)
        t = time.perf_counter()
        compiled(**args)
        row["compile_s"] = time.perf_counter() - t
        row["compiled_ms"] = _time(functools.partial(compiled, **args), device, repeats) * 1e3
    except Exception as error:
        row["compiled_ms"] = "failed"
        row["compile_error"] = f"{type(error).__name__}: {str(error)[:300]}"


def load_anchors(dry: bool) -> dict:
    """mamba_ssm and fla from where the environment says (``gpu_anchors``); in a dry run each
    of mamba_ssm's autotuned kernels keeps its first config (the interpreter cannot time)."""
    import triton

    anchors = {"mamba_ssm": load_mamba_ssm(), "fla": load_fla()}
    mamba = anchors["mamba_ssm"]
    if dry and mamba.loaded and not triton.knobs.runtime.interpret:
        mamba.status = (
            "skipped: no GPU, and TRITON_INTERPRET=1 was not set when the run started (mamba_ssm's "
            "kernels run in Triton's interpreter only then)"
        )
    elif dry and mamba.loaded:
        first_configs_only(mamba.modules)
    for anchor in anchors.values():
        print(f"anchor {anchor.name}: {anchor.status}", flush=True)
    return anchors


def _plan(dry: bool) -> list[tuple]:
    """(op, size, family, batch, length, dtypes, optional) in the order they run: float32 at
    every length, 16-bit at the shortest (the budget goes to the float32 lengths), then the
    optional 2.7B-class rows (16-bit, one length), run while the budget lasts."""
    dtypes = [torch.float32, torch.float16] + ([] if dry else [torch.bfloat16])
    lengths, batches, step_batches = (
        ((7,), (2,), (3,)) if dry else ((512, 2048, 8192), (1, 8), (1, 8, 64))
    )
    size1, size2 = (TINY1, TINY2) if dry else (MAMBA1, MAMBA2)
    big1, big2 = (TINY1, TINY2) if dry else (MAMBA1_2P8B, MAMBA2_2P7B)
    big_dtypes, big_length = ([torch.float16], 7) if dry else ([torch.bfloat16], 2048)
    big_steps = (1,) if dry else (1, 64)
    plan = []
    for ops, size, family in ((MAMBA1_OPS, size1, "mamba1"), (MAMBA2_OPS, size2, "mamba2")):
        for op in ops:
            for length in lengths:
                kinds = dtypes if length == lengths[0] or dry else dtypes[:1]
                plan += [(op, size, family, b, length, kinds, False) for b in batches]
    for ops, size, family in ((MAMBA1_STEPS, size1, "mamba1"), (MAMBA2_STEPS, size2, "mamba2")):
        plan += [(op, size, family, b, 1, dtypes, False) for op in ops for b in step_batches]
    for ops, steps, size, family in (
        (MAMBA1_OPS, MAMBA1_STEPS, big1, "mamba1-2.8b"),
        (MAMBA2_OPS, MAMBA2_STEPS, big2, "mamba2-2.7b"),
    ):
        if dry:  # the path, not the sizes: one sequence op and one step per family
            ops, steps = ops[:1], steps[:1]
        plan += [(op, size, family, 1, big_length, big_dtypes, True) for op in ops]
        plan += [(op, size, family, b, 1, big_dtypes, True) for op in steps for b in big_steps]
    return plan


def run_check(dry: bool, out: str | None, budget_s: float = 270.0) -> dict:
    """Every kernel row with its contenders (the anchors while ``ANCHOR_SHARE`` of ``budget_s``
    lasts), the optional 2.7B-class rows while ``OPTIONAL_SHARE`` of it lasts, then, in what is
    left, the ``torch.compile`` references at L=512 (each compile unrolls a 512-step loop)."""
    from ssmcc.kernels.triton.registry import TRITON_KERNELS
    from ssmcc.ops import SSMCC_REFERENCES

    started = time.perf_counter()
    device = torch.device("cpu" if dry else "cuda")
    peak, peak_source = peak_bandwidth(device)
    anchors = load_anchors(dry)
    copy = copy_bandwidth(device)
    run = Run(device, dry, 1 if dry else 10, budget_s, peak, peak_source, copy, anchors, started)
    print(f"copy {run.copy_GBps:.1f} GB/s (the roofline of this run)", flush=True)
    gen = torch.Generator().manual_seed(0)
    rows, to_compile = [], []
    for op, size, family, batch, length, dtypes, optional in _plan(dry):
        for dtype in dtypes:
            row = dict(op=op, family=family, batch=batch, length=length)
            if optional and run.elapsed() > OPTIONAL_SHARE * budget_s:
                row.update(dtype=str(dtype).removeprefix("torch."), skipped="time budget")
                rows.append(row)
                continue
            args = scan_args(op, size, batch, length, dtype, device, gen)
            slow_reference = length >= 2048 and run.elapsed() > budget_s / 2
            row, expected = _kernel_row(
                TRITON_KERNELS[op], SSMCC_REFERENCES[op], row, dtype, args, run, slow_reference
            )
            row["contenders"] = _contenders(op, args, expected, dtype, row, run)
            rows.append(row)
            _print_row(row)
            write_json(_result(run, rows), out)
            if not dry and length == COMPILED_AT and batch == 1 and dtype == torch.float32:
                to_compile.append((row, size))
            del args, expected
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for row, size in to_compile:
        if run.elapsed() > budget_s:
            row["compiled_ms"] = "skipped (time budget)"
            continue
        args = scan_args(row["op"], size, 1, COMPILED_AT, torch.float32, device, gen)
        _compiled_reference(SSMCC_REFERENCES[row["op"]], row, args, device, run.repeats)
        _print_row(row)
        write_json(_result(run, rows), out)
    result = _result(run, rows)
    write_json(result, out)
    checked = [r for r in rows if "skipped" not in r]
    print(
        f"{sum(1 for r in checked if r.get('ok'))}/{len(checked)} ok in {result['seconds']:.0f} s "
        f"({len(rows) - len(checked)} optional rows skipped); copy {run.copy_GBps:.1f} GB/s, "
        f"peak {result['peak_GBps']} GB/s ({peak_source}); gates (ssmcc at most the anchor's "
        f"time): {json.dumps(result['gates'])}"
    )
    return result


def _fmt(value, spec=".3f"):
    return "-" if value is None else value if isinstance(value, str) else format(value, spec)


def _print_row(row: dict) -> None:
    print(
        f"{row['op']:24s} b{row['batch']:<3d} L{row['length']:<5d} {row['dtype']:8s} "
        f"{'ok ' if row.get('ok') else 'ok~' if row.get('ok_scaled') else 'BAD'} "
        f"diff {_fmt(row.get('max_abs_diff'), '.1e'):>8s} "
        f"of {_fmt(row.get('max_abs_ref'), '.1e'):>8s} "
        f"triton {_fmt(row.get('triton_ms')):>9s} ms  torch {_fmt(row.get('torch_ms')):>9s} ms  "
        f"compiled {_fmt(row.get('compiled_ms')):>9s} ms  {_fmt(row.get('GBps'), '.1f'):>7s} GB/s "
        f"({_fmt(row.get('of_peak'), '.0%')} of peak, {_fmt(row.get('of_copy'), '.0%')} of copy) "
        f"{row.get('error', '')}{row.get('compile_error', '')}",
        flush=True,
    )
    for name, entry in row.get("contenders", {}).items():
        ratio = ""
        if is_measured(entry) and isinstance(row.get("triton_ms"), float):
            ratio = f"  ssmcc/{name} time {row['triton_ms'] / entry['ms']:.2f}"
            ratio += (
                f"  {_fmt(entry.get('GBps'), '.1f')} GB/s ({_fmt(entry.get('of_copy'), '.0%')})"
            )
        mapping = entry.get("mapping", {})
        if mapping:
            ok = mapping.get("ok")
            ratio += f"  mapping {'ok' if ok else mapping.get('status', 'BAD')}"
        print(f"    {name:10s} {describe(entry)}{ratio}", flush=True)


def cuda_missing(script: str, dry_runs: str) -> bool:
    """True, with the message, where torch sees no CUDA device."""
    if torch.cuda.is_available():
        return False
    print(
        f"{script}: no CUDA device (torch.cuda.is_available() is False); --dry runs "
        f"{dry_runs} on the CPU in Triton's interpreter",
        file=sys.stderr,
    )
    return True


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dry",
        action="store_true",
        help="CPU, tiny shapes, Triton's interpreter (what the test suite runs)",
    )
    parser.add_argument("--out", default="gpu_check.json", help="JSON file to write")
    parser.add_argument(
        "--budget",
        type=float,
        default=270.0,
        help="seconds of the run: the anchors run in its first 70%%, the 2.7B-class rows in "
        "its first 80%%, the torch.compile references in what is left; slow references are "
        "skipped after half of it",
    )
    args = parser.parse_args(argv)
    if not args.dry and cuda_missing("gpu_check", "the same checks"):
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    result = run_check(args.dry, args.out, args.budget)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
