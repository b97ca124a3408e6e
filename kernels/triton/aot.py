"""Ahead-of-time builds of ssmcc's Triton kernels: PTX and cubin per GPU architecture, no GPU
needed, with a manifest a runtime can launch them from (the TensorRT target's plugins).

What a model needs is found by running it: ``record_launches`` runs the model's programs (prefill
from zeros and from a state, at a short and a long length, and a decode step) with every launch
recorded instead of run, under the GPU's meta-parameters (``configs.RECORDING_FOR_GPU``). Each
distinct (kernel, argument types, compile-time constants, warps) is one specialisation:

    tensors        ``*fp32``, ``*fp16``, ``*bf16``, ``*i64``, ``*i8`` ... (their dtype)
    integers       ``i32`` (``i64`` beyond its range): sizes and strides stay run-time values
    floats         compile-time constants (eps, dt limits, the attention scale): an AOT plugin
                   cannot pass a float attribute at run time, so each value is its own binary
    meta           the launcher's ``BLOCK_*`` / ``HAS_*`` constants, and ``num_warps``

``build`` compiles each specialisation for each architecture with ``triton.compile`` and writes
``<kernel>-<hash>.<arch>.ptx`` / ``.cubin`` and ``manifest.json``: per binary its kernel, entry
name, parameters in order (Triton appends two scratch pointers, NULL when their sizes are 0),
constants, warps, shared memory, what ``ptxas -v`` reports (registers per thread, spill store and
load bytes, stack frame bytes) and the grid (the rule, and the one recorded). The folder is
written whole or not at all. It needs Triton compiled, not interpreted (``TRITON_INTERPRET``
unset): ``ssmcc kernels build`` runs in a process of its own.

Registers and spills: Triton 3.9's compiled metadata has neither without a GPU (``n_regs`` and
``n_spills`` are attributes of the compiled kernel set only when a CUDA driver loads the binary,
and ``n_spills`` there is the local memory size), and it runs ``ptxas -v`` but drops the log unless
``knobs.nvidia.dump_ptxas_log`` is set: ``build`` sets it and reads the log of the ptxas run that
wrote the cubin. A binary served from Triton's cache had no ptxas run; ``ptxas_resources`` then
runs Triton's own ptxas (``get_ptxas``, as Triton finds it) on the PTX with Triton's flags, whose
cubin is byte for byte Triton's (tested), so either report is the binary's. A spill
(``spill_store_bytes`` > 0) is local-memory traffic in the kernel's inner loop: the tests fail on
any in the 130m-200m presets' builds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import math
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from typing import Any

import torch

from ssmcc.errors import OptionError
from ssmcc.kernels.triton import configs, runtime
from ssmcc.kernels.triton.catalog import GRID_RULES

ARCHS = {"sm_80": 80, "sm_86": 86, "sm_89": 89, "sm_90": 90, "sm_100": 100, "sm_120": 120}
DEFAULT_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90")
POINTER_TYPES = {
    torch.float32: "*fp32",
    torch.float16: "*fp16",
    torch.bfloat16: "*bf16",
    torch.float64: "*fp64",
    torch.int64: "*i64",
    torch.int32: "*i32",
    torch.int8: "*i8",
    torch.bool: "*i1",
}
COMPILE_OPTIONS = ("num_warps", "num_stages")
# Triton 3.9's ``make_cubin`` flags (backends/nvidia/compiler.py); the architecture, fused
# multiply-add and ``ptx_options`` come from the compiled kernel's metadata.
PTXAS_FLAGS = ("-lineinfo", "-v", "--regAllocOptLevel=2")
_PTXAS_REGISTERS = re.compile(r"Used (\d+) registers")
_PTXAS_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)


@dataclasses.dataclass(frozen=True)
class Specialization:
    """One binary's worth of a kernel: its argument types and compile-time constants."""

    kernel: str
    source: str  # file of kernels/triton
    signature: tuple[tuple[str, str], ...]  # (argument, type or "constexpr"), in order
    constexprs: tuple[tuple[str, object], ...]
    num_warps: int
    grid: tuple[int, ...]  # as recorded
    num_stages: int | None = None  # None: Triton's default (3)

    @property
    def key(self) -> str:
        fields = [self.kernel, self.signature, self.constexprs, self.num_warps]
        if self.num_stages is not None:  # (keys of the default stay what they were)
            fields.append(self.num_stages)
        text = json.dumps(fields)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


def _argument_type(value) -> str:
    if isinstance(value, torch.Tensor):
        if value.dtype not in POINTER_TYPES:
            raise OptionError(f"no Triton pointer type for a {value.dtype} tensor")
        return POINTER_TYPES[value.dtype]
    if isinstance(value, bool):
        return "constexpr"
    if isinstance(value, int):
        return "i32" if -(2**31) <= value < 2**31 else "i64"
    if isinstance(value, float):
        return "constexpr"
    raise OptionError(f"cannot type a kernel argument {value!r} ({type(value).__name__})")


def specialization(kernel, grid, args, meta) -> Specialization:
    """The specialisation of one recorded launch."""
    names = list(kernel.arg_names)
    signature, constexprs = [], []
    for name, value in zip(names, args, strict=False):
        kind = _argument_type(value)
        signature.append((name, kind))
        if kind == "constexpr":
            constexprs.append((name, value))
    for name in names[len(args) :]:
        if name not in meta:
            raise OptionError(f"{kernel.fn.__name__}: argument {name!r} was not given")
        signature.append((name, "constexpr"))
        constexprs.append((name, meta[name]))
    return Specialization(
        kernel=kernel.fn.__name__,
        source=os.path.basename(kernel.fn.__code__.co_filename),
        signature=tuple(signature),
        constexprs=tuple(constexprs),
        num_warps=int(meta.get("num_warps", 4)),
        grid=tuple(int(g) for g in grid),
        num_stages=int(meta["num_stages"]) if "num_stages" in meta else None,
    )


def record_launches(run: Callable[[], object]) -> list[tuple]:
    """The launches ``run()`` makes, with the GPU's meta-parameters, none of them run."""
    previous = (runtime.RECORDED, configs.RECORDING_FOR_GPU)
    runtime.RECORDED, configs.RECORDING_FOR_GPU = [], True
    try:
        run()
        return runtime.RECORDED
    finally:
        runtime.RECORDED, configs.RECORDING_FOR_GPU = previous


def model_specializations(compiled, lengths=(5, 80)) -> list[Specialization]:
    """Every specialisation a compiled model's programs launch: prefill from zeros and from a
    state at each length (a short and a long one take different row blocks), and a step.
    ``compiled``: ``ssmcc.compile(model, target="triton", interpret=True)`` (CPU tensors)."""
    vocab = compiled.vocab_size or 2

    def run():
        for length in lengths:
            ids = torch.randint(0, vocab, (1, length))
            _, state = compiled.prefill(ids)
            _, state = compiled.prefill(ids, state)
            compiled.step(ids[:, -1], state)

    unique = {}
    for launch in record_launches(run):
        spec = specialization(*launch)
        unique.setdefault(spec.key, spec)
    return sorted(unique.values(), key=lambda s: (s.kernel, s.key))


def _compile(spec: Specialization, arch: int, kernels: dict):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    source = ASTSource(
        fn=kernels[spec.kernel], signature=dict(spec.signature), constexprs=dict(spec.constexprs)
    )
    options = {"num_warps": spec.num_warps}
    if spec.num_stages is not None:
        options["num_stages"] = spec.num_stages
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def compile_with_usage(compile: Callable[[], Any], arch: int) -> tuple[Any, dict]:
    """``compile()`` (a ``triton.compile`` for ``arch``) and the binary's ``ptxas -v`` resource
    usage. Triton prints its own ptxas log when ``knobs.nvidia.dump_ptxas_log`` is set, so a fresh
    compile is reported from the run that wrote the cubin; one served from Triton's cache (no
    ptxas run) is reported by running ptxas again (``ptxas_resources``)."""
    from triton import knobs

    printed = io.StringIO()
    with knobs.nvidia.scope(), contextlib.redirect_stdout(printed):
        knobs.nvidia.dump_ptxas_log = True
        compiled = compile()
    log, entry = printed.getvalue(), compiled.metadata.name
    if f"Compiling entry function '{entry}'" in log:
        return compiled, parse_ptxas_log(log, entry)
    return compiled, ptxas_resources(compiled.asm["ptx"], arch, compiled.metadata)[0]


def _jit_functions() -> dict:
    """Every ``@triton.jit`` kernel of kernels/triton, by name (compiled, not interpreted): the
    launchers', the captured decode's (``kv_pool.py``) and the TensorRT plugins'
    (``plugin_kernels.py``)."""
    from triton.runtime.jit import JITFunction

    from ssmcc.kernels.triton import kv_pool, plugin_kernels, registry

    found = {}
    modules = [__import__(f.__module__, fromlist=["_"]) for f in registry.TRITON_KERNELS.values()]
    for module in [*modules, kv_pool, plugin_kernels]:
        for name, value in vars(module).items():
            if name.endswith("_kernel") and not isinstance(value, JITFunction):
                raise OptionError(
                    "ahead-of-time builds need Triton compiled, not interpreted: unset "
                    "TRITON_INTERPRET (ssmcc kernels build runs in a process of its own)"
                )
            if isinstance(value, JITFunction):
                found[name] = value
    return found


def _json_value(value):
    """A constant as JSON holds it: a non-finite float as its text ("-inf"), as JSON has none."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def parse_ptxas_log(log: str, entry: str) -> dict:
    """Registers, spill and stack bytes of ``entry`` from a ``ptxas -v`` log. Spills are summed
    over every function of the module (a called ``.func`` spills into the same kernel)."""
    _, found, body = log.partition(f"Compiling entry function '{entry}'")
    registers = _PTXAS_REGISTERS.search(body) if found else None
    frames = _PTXAS_FRAME.findall(log)
    if registers is None or not frames:
        raise OptionError(f"ptxas -v printed no resource usage for {entry}: {log.strip()[:300]!r}")
    entry_frame = _PTXAS_FRAME.search(body)
    return {
        "registers": int(registers.group(1)),
        "spill_store_bytes": sum(int(f[1]) for f in frames),
        "spill_load_bytes": sum(int(f[2]) for f in frames),
        "stack_frame_bytes": int(entry_frame.group(1)) if entry_frame else 0,
    }


def ptxas_resources(ptx: str, arch: int, metadata) -> tuple[dict, bytes]:
    """``ptxas -v`` of a compiled kernel's PTX, as Triton ran it: (resource usage, the cubin)."""
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

    flags = [*PTXAS_FLAGS, f"--gpu-name={sm_arch_from_capability(arch)}"]
    if not metadata.enable_fp_fusion:
        flags.append("--fmad=false")
    if metadata.ptx_options:
        flags += metadata.ptx_options.split(" ")
    with tempfile.TemporaryDirectory(prefix="ssmcc-ptxas-") as folder:
        source, binary = os.path.join(folder, "k.ptx"), os.path.join(folder, "k.cubin")
        with open(source, "w") as f:
            f.write(ptx)
        run = subprocess.run(
            [get_ptxas(arch).path, *flags, source, "-o", binary], capture_output=True, text=True
        )
        if run.returncode != 0:
            raise OptionError(
                f"ptxas -v failed on {metadata.name} for sm_{arch} (exit {run.returncode}): "
                f"{run.stderr.strip()[:300]}"
            )
        with open(binary, "rb") as f:
            cubin = f.read()
    return parse_ptxas_log(run.stdout + run.stderr, metadata.name), cubin


def _entry(spec: Specialization, arch_name: str, compiled, files: dict, usage: dict) -> dict:
    runtime_params = [[n, t] for n, t in spec.signature if t != "constexpr"]
    return {
        "kernel": spec.kernel,
        "source": f"kernels/triton/{spec.source}",
        "specialization": spec.key,
        "arch": arch_name,
        **files,
        "entry": compiled.metadata.name,
        "params": runtime_params + [["global_scratch", "*i8"], ["profile_scratch", "*i8"]],
        "constexprs": {n: _json_value(v) for n, v in spec.constexprs},
        "num_warps": compiled.metadata.num_warps,
        "num_stages": compiled.metadata.num_stages,
        "shared_bytes": compiled.metadata.shared,
        **usage,
        "grid": {"rule": GRID_RULES.get(spec.kernel, ""), "recorded": list(spec.grid)},
    }


def describe_resources(entries: list[dict]) -> str:
    """One line on a build's registers and spills (the command line prints it)."""
    if not entries:
        return "no binaries"
    registers = [e["registers"] for e in entries]
    spilling = [e for e in entries if e["spill_store_bytes"] or e["spill_load_bytes"]]
    text = f"registers {min(registers)}-{max(registers)} per thread, "
    if not spilling:
        return text + "no spills"
    named = ", ".join(
        f"{e['kernel']} {e['arch']} ({e['registers']} registers, {e['spill_store_bytes']} B "
        f"stored / {e['spill_load_bytes']} B loaded)"
        for e in spilling
    )
    return text + f"{len(spilling)} spilling: {named}"


def build(
    specs: list[Specialization],
    archs=DEFAULT_ARCHS,
    out_dir: str = "kernels-aot",
    progress: Callable[[str], None] | None = None,
    models: list[str] | None = None,
) -> dict:
    """Compile ``specs`` for ``archs`` into ``out_dir`` (replaced whole); returns the manifest."""
    unknown = [a for a in archs if a not in ARCHS]
    if unknown:
        raise OptionError(f"unknown architecture(s) {unknown}; known: {', '.join(ARCHS)}")
    import triton

    kernels = _jit_functions()
    parent = os.path.dirname(os.path.abspath(out_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".ssmcc-kernels-", dir=parent)
    try:
        entries = []
        for index, spec in enumerate(specs):
            for arch_name in archs:
                arch = ARCHS[arch_name]
                compiled, usage = compile_with_usage(
                    lambda spec=spec, arch=arch: _compile(spec, arch, kernels), arch
                )
                stem = f"{spec.kernel.strip('_')}-{spec.key}.{arch_name}"
                files = {}
                for kind in ("ptx", "cubin"):
                    data = compiled.asm[kind]
                    mode = "w" if isinstance(data, str) else "wb"
                    with open(os.path.join(staging, f"{stem}.{kind}"), mode) as f:
                        f.write(data)
                    files[kind] = f"{stem}.{kind}"
                entries.append(_entry(spec, arch_name, compiled, files, usage))
            if progress:
                done = entries[-len(archs) :]
                summary = ", ".join(
                    f"{e['arch']}: {e['registers']} regs"
                    + (f", spills {e['spill_store_bytes']} B" if e["spill_store_bytes"] else "")
                    for e in done
                )
                progress(f"[{index + 1}/{len(specs)}] {spec.kernel} ({summary})")
        manifest = {
            "format": "ssmcc-triton-aot/1",
            "triton": triton.__version__,
            "models": list(models or []),
            "archs": list(archs),
            "kernels": entries,
        }
        with open(os.path.join(staging, "manifest.json"), "w") as f:
            json.dump(manifest, f, indent=1, allow_nan=False)
        if os.path.exists(out_dir):
            shutil.rmtree(out_dir)
        os.replace(staging, out_dir)
        return manifest
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
