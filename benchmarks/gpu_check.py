"""One-shot GPU check of ssmcc's Triton kernels: correctness at real sizes, time, bandwidth.

For each op at the sizes of mamba-130m (Mamba-1: d 1536, state 16, conv 4, dt rank 48) and
mamba2-130m (Mamba-2: 24 heads x 64, state 128, 1 group), sequence lengths 512/2048/8192 and
batch 1/8 (the sequence ops; the step ops at batch 1/8/64):

    ok        the Triton kernel's outputs against the op's PyTorch reference on the same device,
              at mamba_ssm's tolerances (fp32 6e-4/2e-3, fp16 3e-3/5e-3, bf16 3e-2/5e-2),
              elementwise; ``ok_scaled`` scales the absolute part by the output's largest
              value (a large output rounds near its cancelled elements); ``of``: that value
    triton    time per call of the kernel (CUDA events, median)
    torch     time per call of the reference (eager; the scans loop over the sequence)
    compiled  the reference under torch.compile, L=512 only (it unrolls the loop: compile time
              grows with L)
    GB/s      bytes of the inputs and outputs / kernel time, and that as a fraction of the
              device's peak (a published figure where the device is known, else the measured
              device-to-device copy rate)

Prints a table and writes JSON. Depends only on ssmcc's ops and Triton kernels and runs on the
machine's own torch and triton (install ssmcc there with
``pip install --no-deps --no-build-isolation -e .``). ``--dry`` runs the same code on the CPU in
Triton's interpreter at tiny shapes (the test suite does, so the script cannot rot).

    python benchmarks/gpu_check.py --out gpu_check.json          # on a CUDA machine, < 5 min
    python benchmarks/gpu_check.py --dry --out /tmp/dry.json     # anywhere
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import platform
import statistics
import sys
import time

import torch

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
    """(GB/s, where it came from): the published figure, else a measured copy."""
    if device.type != "cuda":
        return float("nan"), "cpu (dry run)"
    name = torch.cuda.get_device_name(device)
    for fragment, gbs in PEAK_GBS.items():
        if fragment in name:
            return gbs, f"published ({name})"
    a = torch.empty(1 << 28, dtype=torch.float32, device=device)
    b = torch.empty_like(a)
    seconds = _time(lambda: b.copy_(a), device, 10)
    return 2 * a.numel() * 4 / seconds / 1e9, f"measured copy ({name})"


def _result(device, dry, peak, peak_source, started, rows) -> dict:
    return {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else platform.processor() or "cpu",
        "dry": dry,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "python": sys.version.split()[0],
        "peak_GBps": None if math.isnan(peak) else peak,
        "peak_source": peak_source,
        "seconds": time.perf_counter() - started,
        "rows": rows,
        "all_ok": all(r.get("ok") for r in rows),
        "all_ok_scaled": all(r.get("ok_scaled") for r in rows),
    }


def write_json(result: dict, out: str | None) -> None:
    """Written whole (a temporary file, then renamed) after every row: a run cut short by its
    time limit still leaves its rows."""
    if out:
        with open(out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(out + ".tmp", out)


def _kernel_row(kernel, reference, row, dtype, args, device, repeats, peak, slow_reference):
    """``row`` (op, family, batch, length) completed with the kernel's check and times."""
    length = row["length"]
    row["dtype"] = str(dtype).removeprefix("torch.")
    try:
        got = kernel(**args)
        expected = reference(**args)
        row.update(_compare(got, expected, dtype))
        row["triton_ms"] = _time(functools.partial(kernel, **args), device, repeats) * 1e3
        row["torch_ms"] = (
            None
            if slow_reference
            else _time(functools.partial(reference, **args), device, 1 if length > 512 else 3) * 1e3
        )
        moved = _nbytes(args.values()) + _nbytes(got)
        row["GBps"] = moved / (row["triton_ms"] / 1e3) / 1e9
        row["of_peak"] = row["GBps"] / peak if peak == peak else None
    except Exception as error:  # a kernel that fails is a finding: keep going
        row["ok"] = False
        row["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    return row


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


def run_check(dry: bool, out: str | None, budget_s: float = 270.0) -> dict:
    """Every kernel row first (the check itself), then, in what is left of ``budget_s``, the
    ``torch.compile`` references at L=512 (each compile unrolls a 512-step loop: minutes)."""
    from ssmcc.kernels.triton.registry import TRITON_KERNELS
    from ssmcc.ops import SSMCC_REFERENCES

    device = torch.device("cpu" if dry else "cuda")
    dtypes = [torch.float32, torch.float16] + ([] if dry else [torch.bfloat16])
    lengths, batches, step_batches = (
        ((7,), (2,), (3,)) if dry else ((512, 2048, 8192), (1, 8), (1, 8, 64))
    )
    size1, size2 = (TINY1, TINY2) if dry else (MAMBA1, MAMBA2)
    repeats = 1 if dry else 10
    peak, peak_source = peak_bandwidth(device)
    started = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    rows, to_compile = [], []
    plan = []
    for ops, size, family in ((MAMBA1_OPS, size1, "mamba1"), (MAMBA2_OPS, size2, "mamba2")):
        plan += [(op, size, family, b, length) for op in ops for length in lengths for b in batches]
    for ops, size, family in ((MAMBA1_STEPS, size1, "mamba1"), (MAMBA2_STEPS, size2, "mamba2")):
        plan += [(op, size, family, b, 1) for op in ops for b in step_batches]
    for op, size, family, batch, length in plan:
        for dtype in dtypes:
            if dtype != torch.float32 and length > lengths[0] and not dry:
                continue  # 16-bit at the shortest length only: the budget goes to fp32 lengths
            args = scan_args(op, size, batch, length, dtype, device, gen)
            slow_reference = length >= 2048 and time.perf_counter() - started > budget_s / 2
            row = _kernel_row(
                TRITON_KERNELS[op],
                SSMCC_REFERENCES[op],
                dict(op=op, family=family, batch=batch, length=length),
                dtype,
                args,
                device,
                repeats,
                peak,
                slow_reference,
            )
            rows.append(row)
            _print_row(row)
            write_json(_result(device, dry, peak, peak_source, started, rows), out)
            if not dry and length == COMPILED_AT and batch == 1 and dtype == torch.float32:
                to_compile.append((row, size))
            if device.type == "cuda":
                torch.cuda.empty_cache()
    for row, size in to_compile:
        if time.perf_counter() - started > budget_s:
            row["compiled_ms"] = "skipped (time budget)"
            continue
        args = scan_args(row["op"], size, 1, COMPILED_AT, torch.float32, device, gen)
        _compiled_reference(SSMCC_REFERENCES[row["op"]], row, args, device, repeats)
        _print_row(row)
        write_json(_result(device, dry, peak, peak_source, started, rows), out)
    result = _result(device, dry, peak, peak_source, started, rows)
    write_json(result, out)
    print(
        f"{sum(1 for r in rows if r.get('ok'))}/{len(rows)} ok in {result['seconds']:.0f} s; "
        f"peak {result['peak_GBps']} GB/s ({peak_source})"
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
        f"({_fmt(row.get('of_peak'), '.0%')}) {row.get('error', '')}"
        f"{row.get('compile_error', '')}",
        flush=True,
    )


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
        help="seconds after which slow references and compiles are skipped",
    )
    args = parser.parse_args(argv)
    if not args.dry and cuda_missing("gpu_check", "the same checks"):
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    result = run_check(args.dry, args.out, args.budget)
    return 0 if result["all_ok"] else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
