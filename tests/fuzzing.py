"""Differential fuzzing of the ssmcc ops: every path against a float64 oracle.

A case is drawn from a seeded generator (``draw(op, seed)``): random sizes including 1, 0-length
sequences and odd sizes, B and C grouped independently (shared, grouped by any divisor of d, one
group per channel), optional inputs on and off, softplus on and off, extreme dt bias (+-10),
input dtypes float32 / bfloat16 / float16 / float64, non-contiguous inputs, and now and then a
long sequence (300-2048). The oracle computes the op's math (the docstrings of ``ssmcc/ops``) in
float64 from the same, already rounded, inputs. Paths:

    reference   the op library's PyTorch reference (``ssmcc.ops.*_ref``)
    cpp         the C++ kernel through its checked torch entry (``kernels/cpu/torch_binding.py``)
    ort-lib     the op as one ssmcc ONNX node in ONNX Runtime with the ssmcc custom-op library
    portable    the same node in stock ONNX Runtime, i.e. its model-local function body
    triton      the op's Triton launcher (``kernels/triton``) in Triton's interpreter on the CPU;
                not in ``PATHS`` (the interpreter is slow: ``tests/test_triton_kernels.py`` runs
                it on its own case counts, and on sequences of at most 64 positions)

The ONNX paths take the node form of the op (``lowering/onnx/schemas.py``): neutral values for
absent inputs and B/C brought to one group count, as the emitters do; they skip 0-length cases
(ssmcc never feeds an ONNX graph an empty sequence: prompts have at least one token).

Tolerances (FACTS.md, mamba_ssm's tests), by output dtype: scan and conv rtol 6e-4 / atol 2e-3,
state update 3e-4 / 1e-3 in float32 and float64; bfloat16 3e-2 / 5e-2; float16 3e-3 / 5e-3. The
Triton SSD scan forms its products in a 16-bit case's dtype (``SIXTEEN_BIT_PRODUCTS``): there
the float32 final state is held to that dtype's tolerance too.

``python -m tests.fuzzing --cases N [--paths cpp,ort-lib] [--ops ...]`` runs the corpus outside
pytest and exits 1 on the first mismatch (``tests/test_fuzz_sanitized.py`` runs it with the
sanitizer-built kernels).
"""

from __future__ import annotations

import argparse
import sys

import torch

from .fuzz_cases import Case, draw  # noqa: F401  (the cases, for tests and the command line)
from .fuzz_onnx import node_form, run_onnx, session_for  # noqa: F401
from .fuzz_oracles import oracle

OPS = (
    "selective_scan",
    "selective_state_update",
    "causal_conv1d",
    "causal_conv1d_update",
    "ssd_scan",
    "ssd_state_update",
    "rmsnorm_gated",
    "ssd_mixer",
    "ssd_mixer_step",
    "mamba_mixer",
    "mamba_mixer_step",
)
FAMILY = {"selective_state_update": "step", "ssd_state_update": "step", "rmsnorm_gated": "norm"}
PATHS = ("reference", "cpp", "ort-lib", "portable")
HALF = (torch.bfloat16, torch.float16)
TOLERANCES = {  # (op family, output dtype) -> (rtol, atol)
    ("scan", torch.float32): (6e-4, 2e-3),
    ("step", torch.float32): (3e-4, 1e-3),
    ("scan", torch.bfloat16): (3e-2, 5e-2),
    ("step", torch.bfloat16): (3e-2, 5e-2),
    ("scan", torch.float16): (3e-3, 5e-3),
    ("step", torch.float16): (5e-3, 1e-2),
    ("norm", torch.float32): (1e-5, 1e-5),
    ("norm", torch.bfloat16): (1e-2, 8e-3),
    ("norm", torch.float16): (1e-2, 8e-3),
}


# (path, op) whose matrix products take a 16-bit case's dtype (Triton's SSD scan on tensor cores,
# as mamba_ssm's): every output of such a case, its float32 final state included, is held to that
# dtype's tolerance; the state carries one 16-bit rounding per product.
SIXTEEN_BIT_PRODUCTS = {("triton", "ssd_scan")}


def run_reference(case: Case):
    from ssmcc.ops import SSMCC_REFERENCES

    return SSMCC_REFERENCES[case.op](**case.args)


def run_cpp(case: Case):
    from ssmcc.kernels.cpu import torch_binding

    return torch_binding.KERNELS[case.op](**case.args)


def run_triton(case: Case):
    from ssmcc.kernels.triton.registry import TRITON_KERNELS

    return TRITON_KERNELS[case.op](**case.args)


TRITON_MAX_LENGTH = 64  # the interpreter runs ~0.1 ms per position and program

RUNNERS = {
    "reference": run_reference,
    "triton": run_triton,
    "cpp": run_cpp,
    "ort-lib": lambda case: run_onnx(case, library=True),
    "portable": lambda case: run_onnx(case, library=False),
}


def applies(case: Case, path: str) -> bool:
    """Whether ``path`` takes this case (the ONNX graphs never see an empty sequence)."""
    sequence = {
        "selective_scan": ("u", -1),
        "causal_conv1d": ("x", -1),
        "ssd_scan": ("x", 1),
        "ssd_mixer": ("zxbcdt", 1),
        "mamba_mixer": ("zx", 1),
    }
    name, axis = sequence.get(case.op, (None, None))
    if path == "triton":
        return name is None or case.args[name].shape[axis] <= TRITON_MAX_LENGTH
    empty = name is not None and case.args[name].shape[axis] == 0
    # numpy has no bfloat16: a projection stored so reaches ONNX Runtime only from a model file
    bfloat16 = any(
        isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16 and k.endswith("_proj_weight")
        for k, v in case.args.items()
    )
    return not ((empty or bfloat16) and path in ("ort-lib", "portable"))


def check(case: Case, path: str) -> str | None:
    """None when ``path`` matches the oracle on ``case``, else what differs."""
    expected = oracle(case)
    try:
        got = RUNNERS[path](case)
    except Exception as error:  # a path that refuses a valid case is a finding too
        return f"{path} raised {type(error).__name__}: {str(error).strip()[:300]}"
    family = FAMILY.get(case.op, "scan")
    got = (got,) if isinstance(got, torch.Tensor) else tuple(got)
    if len(got) != len(expected):
        return f"{path} returned {len(got)} outputs, expected {len(expected)}"
    names = ("out", "state", "second state")[: len(got)]
    sixteen = (path, case.op) in SIXTEEN_BIT_PRODUCTS and case.dtype in HALF
    for name, g, e in zip(names, got, expected, strict=True):
        dtype = g.dtype if g.dtype in HALF else case.dtype if sixteen else torch.float32
        rtol, atol = TOLERANCES[family, dtype]
        if tuple(g.shape) != tuple(e.shape):
            return f"{path}: {name} has shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        try:
            torch.testing.assert_close(g.double(), e, rtol=rtol, atol=atol)
        except AssertionError as error:
            return f"{path}: {name} differs: {str(error).strip().splitlines()[-3:]}"
    return None


def run(ops, paths, cases: int, first_seed: int = 0, compare: bool = True) -> list[str]:
    """Every (op, path) on ``cases`` cases; the failures, each with its case. Without
    ``compare`` the paths only run (what a sanitizer run needs: it reports bad accesses itself,
    and the values were compared in an uninstrumented run)."""
    failures = []
    for op in ops:
        for seed in range(first_seed, first_seed + cases):
            case = draw(op, seed)
            for path in paths:
                if not applies(case, path):
                    continue
                if compare:
                    problem = check(case, path)
                else:
                    try:
                        RUNNERS[path](case)
                        problem = None
                    except Exception as error:
                        problem = f"{path} raised {type(error).__name__}: {error}"
                if problem is not None:
                    failures.append(f"{case.describe()}\n    {problem}")
    return failures


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200, help="cases per op")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--ops", default=",".join(OPS))
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument(
        "--no-compare", action="store_true", help="only run the paths (for a sanitizer run)"
    )
    args = parser.parse_args(argv)
    from ssmcc.kernels.cpu.build import build_ort_library, build_torch_kernels, sanitizing

    print(f"kernels: {build_torch_kernels()}, {build_ort_library()}; sanitized: {sanitizing()}")
    failures = run(
        args.ops.split(","), args.paths.split(","), args.cases, args.first_seed, not args.no_compare
    )
    for failure in failures[:20]:
        print(failure)
    print(f"fuzz: {len(failures)} failure(s)", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
