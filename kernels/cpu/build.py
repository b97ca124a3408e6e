"""Build the ssmcc CPU kernel libraries on first use, cached by content.

Two shared libraries from one set of kernel headers (``ssm_kernels.h``, ``ssd_kernels.h``):

- ``libssmcc_kernels.so`` (``torch_entry.cpp``, ``replay.cpp``): C entry points the torch target
  calls via ctypes, and the replay of a recorded sequence of them;
- ``libssmcc_ort.so`` (``ort_ops.cpp``, ``ort_ssd_ops.cpp``, ``ort_mixer_ops.cpp``,
  ``ort_mamba_mixer_ops.cpp``, ``ort_quantized_ops.cpp``, ``ort_linear_ops.cpp``,
  ``ort_moe_ops.cpp``): the ONNX Runtime custom-op library of the ``ssmcc`` domain;
  needs ONNX Runtime's C++ headers (``fetch_ort_headers.sh``, or ``SSMCC_ORT_INCLUDE``).

The cache key hashes the sources, flags, compiler version and CPU flags (the build uses
``-march=native``); the cache lives in ``$SSMCC_CACHE_DIR`` or ``~/.cache/ssmcc/kernels``. A library
is compiled to a temporary file and renamed into place, so no reader sees half a file; a lock
beside it makes a second process wait for the first build instead of repeating it. The sources
compile in parallel, one per core.
When no compiler or no headers are found, ``build_*`` returns None and says once, on stderr, what
is missing and which slower path runs instead.
"""

from __future__ import annotations

import concurrent.futures
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

SOURCE_DIR = os.path.dirname(os.path.abspath(__file__))
COMPILE_FLAGS = [
    "-std=c++17",
    "-O3",
    "-ffast-math",  # compiling only: see LINK_FLAGS
    "-fopenmp-simd",  # the kernels' `omp simd` loops, also in the ORT library (no OpenMP runtime)
    "-march=native",
    "-fPIC",
    "-fvisibility=hidden",
]
# Linked without -ffast-math: with it GCC links crtfastmath.o, which sets flush-to-zero and
# denormals-are-zero in the loading process (every later float computation of the user's
# program, torch's included, would lose its denormals).
LINK_FLAGS = ["-shared", "-fPIC"]
# -fsanitize builds (SSMCC_SANITIZE=1): the fuzz corpus runs once against these in CI, because
# an out-of-bounds read is invisible to value comparisons. Loading them needs the sanitizer
# runtimes preloaded (tests/test_fuzz_sanitized.py shows how).
# -O1 in place of -O3: AddressSanitizer's guide recommends it, and it builds the two libraries
# in ~45 s instead of ~110 s on a 2-core machine (the vector paths chosen by -march=native and
# the source's intrinsics are kept).
SANITIZE_FLAGS = [
    "-O1",
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
]
KERNEL_HEADERS = [
    "ssm_kernels.h",
    "ssd_kernels.h",
    "ssd_chunked.h",
    "ssd_mixer.h",
    "conv_channels_last.h",
    "mamba_mixer.h",
    "mixer_weight.h",
    "moe_experts.h",
    "activations.h",
    "vector_math.h",
    "denormals.h",
    "small_gemm.h",
    "gemv.h",
    "gemv_quantized.h",
    "tuning.h",
    "contracts.h",
    "ort_common.h",
    "torch_entry.h",
]
HEADER = "onnxruntime_cxx_api.h"


def sanitizing() -> bool:
    """Whether this process builds (and loads) the sanitizer-instrumented kernels."""
    return os.environ.get("SSMCC_SANITIZE") == "1"


def _cache_root() -> str:
    return os.environ.get("SSMCC_CACHE_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "ssmcc"
    )


def cache_dir() -> str:
    return os.path.join(_cache_root(), "kernels")


def default_header_dir() -> str:
    return os.path.join(_cache_root(), "ort-headers", "onnxruntime")


def find_ort_headers() -> str | None:
    candidates = [
        os.environ.get("SSMCC_ORT_INCLUDE"),
        default_header_dir(),
        "/usr/include/onnxruntime",
        "/usr/local/include/onnxruntime",
    ]
    for folder in candidates:
        if folder and os.path.isfile(os.path.join(folder, HEADER)):
            return folder
    return None


def _compiler() -> str | None:
    return shutil.which(os.environ.get("CXX", "g++"))


@functools.cache
def _say_once(message: str) -> None:
    print(f"[ssmcc] {message}", file=sys.stderr, flush=True)


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("flags"):
                    return line
    except OSError:
        pass
    return os.uname().machine


def _build(name: str, sources: list[str], flags: list[str], extra_key: str = "") -> str | None:
    compiler = _compiler()
    if compiler is None:
        _say_once(
            "no C++ compiler found (g++ or $CXX): the ssmcc CPU kernels cannot be built; "
            "using the pure-PyTorch reference / portable ONNX bodies (much slower). "
            "Install g++ to get the fast kernels."
        )
        return None
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    digest = hashlib.sha256()
    compile_flags = COMPILE_FLAGS
    if sanitizing():
        flags = [*flags, *SANITIZE_FLAGS]
        compile_flags = [flag for flag in COMPILE_FLAGS if not flag.startswith("-O")]
    for part in [version, _cpu_flags(), " ".join(compile_flags + LINK_FLAGS + flags), extra_key]:
        digest.update(part.encode())
    for source in sorted(set(sources + KERNEL_HEADERS)):
        with open(os.path.join(SOURCE_DIR, source), "rb") as f:
            digest.update(f.read())
    folder = os.path.join(cache_dir(), digest.hexdigest()[:16])
    target = os.path.join(folder, f"lib{name}.so")
    if os.path.isfile(target):
        return target
    os.makedirs(folder, exist_ok=True)
    # One builder per library: a second process (an xdist worker, a server's stubs) waits for
    # the first instead of compiling the same library beside it.
    with open(os.path.join(folder, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.isfile(target):
            return target
        _say_once(f"building {os.path.basename(target)} (once; cached in {folder})")
        return _compile_and_link(compiler, name, sources, [*compile_flags, *flags], flags, target)


def _compile_and_link(
    compiler: str,
    name: str,
    sources: list[str],
    compile_flags: list[str],
    flags: list[str],
    target: str,
) -> str | None:
    """Compile each source (at most one per core at once) and link them into ``target``."""
    folder = os.path.dirname(target)
    handle, tmp = tempfile.mkstemp(suffix=".so", dir=folder)
    os.close(handle)
    with tempfile.TemporaryDirectory(dir=folder) as objects:
        # compile and link apart: linking with -ffast-math would add GCC's crtfastmath.o, whose
        # constructor turns on flush-to-zero for the whole process that loads the library
        objects_of = [os.path.join(objects, f"{index}.o") for index in range(len(sources))]
        compiles = [
            [compiler, *compile_flags, "-c", os.path.join(SOURCE_DIR, source), "-o", obj]
            for source, obj in zip(sources, objects_of, strict=True)
        ]
        link_flags = [f for f in flags if not f.startswith(("-I", "-D"))]
        link = [compiler, *LINK_FLAGS, *link_flags, *objects_of, "-o", tmp]
        workers = max(1, min(len(compiles), os.cpu_count() or 1))
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            results = list(pool.map(_run, compiles))
        if all(done.returncode == 0 for done in results):
            results.append(_run(link))
        failed = next((done for done in results if done.returncode != 0), None)
        if failed is not None:
            os.unlink(tmp)
            _say_once(
                f"building lib{name}.so failed; using the slower path. Compiler said:\n"
                f"{failed.stderr[-2000:]}"
            )
            return None
    os.replace(tmp, target)
    return target


def _run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True)


@functools.cache
def build_torch_kernels() -> str | None:
    """Path of ``libssmcc_kernels.so``, or None when it cannot be built here."""
    return _build("ssmcc_kernels", ["torch_entry.cpp", "replay.cpp"], ["-fopenmp"])


@functools.cache
def build_ort_library() -> str | None:
    """Path of the ONNX Runtime custom-op library ``libssmcc_ort.so``, or None."""
    headers = find_ort_headers()
    if headers is None:
        _say_once(
            "ONNX Runtime C++ headers not found, so the ssmcc ONNX Runtime kernels cannot "
            "be built; ONNX models run with their portable function bodies. Get the "
            f"headers with {os.path.join(SOURCE_DIR, 'fetch_ort_headers.sh')} or set "
            "SSMCC_ORT_INCLUDE to a folder holding onnxruntime_cxx_api.h."
        )
        return None
    with open(os.path.join(headers, "onnxruntime_c_api.h"), "rb") as f:
        header_key = hashlib.sha256(f.read()).hexdigest()
    return _build(
        "ssmcc_ort",
        [
            "ort_ops.cpp",
            "ort_ssd_ops.cpp",
            "ort_mixer_ops.cpp",
            "ort_mamba_mixer_ops.cpp",
            "ort_quantized_ops.cpp",
            "ort_linear_ops.cpp",
            "ort_moe_ops.cpp",
        ],
        ["-DORT_API_MANUAL_INIT", f"-I{headers}"],
        header_key,
    )
