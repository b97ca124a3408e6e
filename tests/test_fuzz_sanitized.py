"""The fuzz corpus once more against kernels built with ``-fsanitize=address,undefined``.

Value comparisons cannot see a read past the end of a buffer that happens to hold plausible
numbers; AddressSanitizer can. The C++ kernel path and the ORT library path run in a fresh
process with ``SSMCC_SANITIZE=1`` (kernels rebuilt at -O1 with the sanitizers into their own
cache entries) and the sanitizer runtimes preloaded; any report aborts that process. The first 150
cases per op: every shape family the generator draws (empty and long sequences, strides, groups,
widths, projections stored small) appears in them; the instrumented kernels run ~10x slower, so
the further cases of the long run are left to the uninstrumented fuzz test.
``SSMCC_SANITIZED_CASES=N`` runs N, for a deeper search by hand. (600 until 2026-12-04, 400 until
2026-12-06: cut to bring CI's wall time towards 20 minutes on 2 cores.)
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

SANITIZED_CASES = int(os.environ.get("SSMCC_SANITIZED_CASES", "150"))

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _runtime(name: str) -> str | None:
    compiler = shutil.which(os.environ.get("CXX", "g++"))
    if compiler is None:
        return None
    found = subprocess.run(
        [compiler, f"-print-file-name={name}"], capture_output=True, text=True
    ).stdout.strip()
    return found if os.path.isabs(found) and os.path.exists(found) else None


def _sanitized(*command: str) -> subprocess.CompletedProcess:
    """``python command...`` with the sanitizer-built kernels and runtimes."""
    runtimes = [_runtime("libasan.so"), _runtime("libubsan.so")]
    assert all(runtimes), "g++ ships no sanitizer runtimes here"
    env = dict(
        os.environ,
        SSMCC_SANITIZE="1",
        LD_PRELOAD=":".join(runtimes),
        ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1",
        UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1",
        OMP_NUM_THREADS="2",  # the kernels' work split across threads, as users run them
    )
    return subprocess.run(
        [sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800
    )


# A kernel told its input is twice as long as the buffer: the control that the run can fail.
_OVERREAD = """
import torch
from ssmcc.kernels.cpu import torch_binding
x, w = torch.ones(1, 1, 4), torch.ones(1, 2)
out, state = torch.empty(1, 1, 8), torch.empty(1, 1, 1)
torch_binding.library().ssmcc_causal_conv1d_f32(
    x.data_ptr(), w.data_ptr(), None, None, out.data_ptr(), state.data_ptr(), 1, 1, 8, 2, 0, 1
)
print("not caught")
"""


@pytest.mark.slow
def test_the_sanitizer_catches_an_out_of_bounds_read():
    done = _sanitized("-c", _OVERREAD)
    assert done.returncode != 0 and "heap-buffer-overflow" in done.stderr, done.stderr[-2000:]
    assert "not caught" not in done.stdout


@pytest.mark.slow
def test_fuzz_corpus_under_sanitizers():
    cases = str(SANITIZED_CASES)
    done = _sanitized(
        "-m", "tests.fuzzing", "--paths", "cpp,ort-lib", "--cases", cases, "--no-compare"
    )
    report = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, report
    assert "AddressSanitizer" not in done.stderr and "runtime error" not in done.stderr, report
    assert "sanitized: True" in done.stdout, report  # the instrumented libraries ran
    assert "fuzz: 0 failure(s)" in done.stdout, report


# The quantised-weight kernels over odd shapes: partial row blocks, vector tails, groups, empty
# inputs, every storage; values against the reference, memory against the sanitizers.
_QUANTIZED = """
import random, torch
from ssmcc.kernels.cpu import native
from ssmcc.kernels.cpu.quantized_binding import dequantize_cpu, quantized_linear_cpu
from ssmcc.ops.quantized_linear import SCHEMES, dequantize_weight, quantize_weight
from ssmcc.ops.quantized_linear import quantized_linear_ref
assert native.available()
rng = random.Random(0)
for case in range(300):
    scheme = rng.choice(sorted(SCHEMES))
    group = SCHEMES[scheme][1] or 1
    cols = group * rng.choice((1, 2, 3)) + (0 if group > 1 else rng.choice((0, 1, 5, 17, 40)))
    rows, out = rng.choice((0, 1, 2, 7, 8, 9, 13)), rng.choice((1, 3, 8, 9, 17, 37))
    stored, scale = quantize_weight(torch.randn(out, max(cols, 1)), scheme)
    x = torch.randn(rows, max(cols, 1))
    bias = torch.randn(out) if rng.random() < 0.5 else None
    got = quantized_linear_cpu(x, stored, scale, bias)
    want = quantized_linear_ref(x, stored, scale, bias)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(dequantize_cpu(stored, scale), dequantize_weight(stored, scale))
print("quantized: ok")
"""


@pytest.mark.slow
def test_quantized_kernels_under_sanitizers():
    done = _sanitized("-c", _QUANTIZED)
    report = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, report
    assert "AddressSanitizer" not in done.stderr and "runtime error" not in done.stderr, report
    assert "quantized: ok" in done.stdout, report
