"""Get the native CPU kernels a target's artifact runs with ready at compile time, so that the
first run of the artifact never builds (``ssmcc compile`` calls ``prepare_native_kernels``).

    torch   ``libssmcc_kernels.so`` (the C++ kernels the torch target calls)
    onnx    ``libssmcc_ort.so`` (the ONNX Runtime custom-op library); ONNX Runtime's C++ headers
            first, fetched from Debian's ``libonnxruntime-dev`` (``fetch_ort_headers.sh``) into
            ``$SSMCC_CACHE_DIR/ort-headers`` when no copy is found

Both are cached by content (``build.py``): a later compile or run finds them. What cannot be had
here (no compiler, no network for the headers) is said once, on stderr, and the artifact runs
with the slower path (the PyTorch references, the ONNX functions' portable bodies), as at run
time. ``kernels="reference"`` needs nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable

from ssmcc.kernels.cpu.build import (
    SOURCE_DIR,
    build_ort_library,
    build_torch_kernels,
    default_header_dir,
    find_ort_headers,
)

FETCH_SCRIPT = os.path.join(SOURCE_DIR, "fetch_ort_headers.sh")


def fetch_ort_headers(progress: Callable[[str], None]) -> tuple[str | None, str | None]:
    """``(folder, None)`` with ONNX Runtime's headers, fetched if needed; ``(None, why)`` when
    they cannot be had here."""
    found = find_ort_headers()
    if found is not None:
        return found, None
    missing = [tool for tool in ("bash", "apt-get", "dpkg") if shutil.which(tool) is None]
    if missing:
        return None, f"fetching them needs {', '.join(missing)} (a Debian or Ubuntu system)"
    destination = os.path.dirname(default_header_dir())
    progress(f"fetching ONNX Runtime's C++ headers (Debian libonnxruntime-dev) into {destination}")
    done = subprocess.run(
        ["bash", FETCH_SCRIPT, destination], capture_output=True, text=True, timeout=600
    )
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return None, f"{FETCH_SCRIPT} failed ({said[0]}); no network to deb.debian.org?"
    return find_ort_headers(), None


def prepare_native_kernels(
    target: str, kernels: str, progress: Callable[[str], None]
) -> list[str]:
    """Build what ``target`` runs natively (module docstring); returns the libraries ready."""
    if kernels == "reference":
        return []
    if target == "torch":
        progress("preparing the C++ kernels of the torch target (built once, then cached)")
        path = build_torch_kernels()
        return [path] if path else []
    if target == "onnx":
        headers, why = fetch_ort_headers(progress)
        if headers is None:
            progress(
                f"ONNX Runtime's C++ headers are not here and {why}: the artifact runs with its "
                "portable ONNX bodies (slower); set SSMCC_ORT_INCLUDE to a folder holding "
                "onnxruntime_cxx_api.h to build the fast kernels"
            )
            return []
        progress("preparing the ONNX Runtime kernel library (built once, then cached)")
        path = build_ort_library()
        return [path] if path else []
    return []  # triton builds per GPU at load; tensorrt on the machine that builds its engines
