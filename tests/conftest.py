"""Shared fixtures: small Hugging Face models with random weights, and golden-file checks."""

from __future__ import annotations

import difflib
import os
import pathlib

# Under pytest-xdist the workers share the machine's cores (CI: 2 workers, 2 cores): one OpenMP
# thread per worker (torch's intra-op pool, ssmcc's C++ kernels) instead of each worker's pool
# competing for the cores the other is using. Set before torch is imported; the subprocesses tests
# start inherit it. ONNX Runtime keeps its own pool (one thread per session measured slower).
# Measured here (AMD EPYC, 2 vCPUs), the default hybrid/Mamba-2/ONNX tests: 117 s -> 97-100 s.
if "PYTEST_XDIST_WORKER" in os.environ:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

GOLDEN_DIR = pathlib.Path(__file__).parent / "golden"
# Modules of the C++ kernels' own tests: they run with two threads whatever the worker's default,
# so the kernels' work split across threads stays tested.
TWO_THREAD_MODULES = {
    "test_fuzz_kernels",
    "test_kernels_cpu",
    "test_kernels_ssd",
    "test_kernel_contracts",
    "test_step_replay",
    "test_mamba_mixer",
    "test_ssd_mixer",
}


@pytest.fixture(autouse=True)
def _kernel_threads(request):
    if request.module.__name__.rsplit(".", 1)[-1] not in TWO_THREAD_MODULES:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/<pass>/<case>.txt from the current output instead of comparing",
    )


# The quick tier (``-m quick``): what to run after touching an op or a pass. Every test of these
# files but the slow and the thorough (end-to-end) ones.
QUICK_FILES = frozenset(
    {
        "test_ops_reference.py",
        "test_ops_registration.py",
        "test_op_definitions.py",
        "test_state_contracts.py",
        "test_layout.py",
        "test_commit_subjects.py",
        "test_pass_rules.py",
        "test_pass_manager.py",
        "test_pass_canonicalize.py",
        "test_pass_chunk_state_passing.py",
        "test_pass_detect_causal_conv1d.py",
        "test_pass_detect_selective_scan.py",
        "test_pass_eliminate_dead_code.py",
        "test_pass_fold_batched_matmul.py",
        "test_pass_fuse_scan_norm_mlp.py",
        "test_pass_quantize_weights.py",
        "test_pass_scan_to_recurrent_step.py",
    }
)


# Files whose every test goes through a whole external runtime, a server, a subprocess per
# command or an ahead-of-time GPU build: CI runs them (it runs everything); the default run
# (``-m "not slow"``, the tier before a commit) leaves them out. Given the ``slow`` marker here.
SLOW_FILES = frozenset(
    {
        "test_benchmarks_harness.py",
        "test_dynamo_backend.py",
        "test_examples.py",
        "test_gpu_check.py",
        "test_onnx_reference_evaluator.py",
        "test_openvino.py",
        "test_serving_triton.py",
        "test_tensorrt_graphs.py",
        "test_tensorrt_target.py",
        "test_torch_compile_bench.py",
        "test_triton_aot.py",
        "test_triton_decode_graph.py",
        "test_weights_in_place.py",
    }
)


def pytest_collection_modifyitems(config, items):
    here = {path.name for path in pathlib.Path(__file__).parent.glob("test_*.py")}
    unknown = (QUICK_FILES | SLOW_FILES) - here
    if unknown:
        raise pytest.UsageError(f"tests/conftest.py names test files that do not exist: {unknown}")
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
        if (
            item.path.name in QUICK_FILES
            and item.get_closest_marker("slow") is None
            and item.get_closest_marker("thorough") is None
        ):
            item.add_marker(pytest.mark.quick)


@pytest.fixture
def golden(request):
    """``golden(pass_name, case, before, after)``: compare with (or rewrite) the golden file."""
    update = request.config.getoption("--update-golden")

    def check(pass_name: str, case: str, before: str, after: str) -> None:
        path = GOLDEN_DIR / pass_name / f"{case}.txt"
        text = f"# before\n{before}# after\n{after}"
        if update:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        if not path.exists():
            pytest.fail(f"golden file {path} is missing; create it with pytest --update-golden")
        expected = path.read_text()
        if text != expected:
            diff = "".join(
                difflib.unified_diff(
                    expected.splitlines(keepends=True),
                    text.splitlines(keepends=True),
                    fromfile=str(path),
                    tofile="current output",
                )
            )
            pytest.fail(
                f"graph differs from golden file (pytest --update-golden rewrites it):\n{diff}"
            )

    return check


# Pass options that keep each layer's conv and scan apart (the fusion pass treats the mixer ops
# as ones the target cannot run) but fuse the norms: for tests of the single-state ops.
KEEP_MIXERS = {
    "fuse_scan_norm_mlp": {
        "unsupported": {"mamba_mixer": "kept apart (test)", "ssd_mixer": "kept apart (test)"}
    }
}


def make_hf_model(family: str, seed: int = 0, **overrides):
    """A small HF causal LM with random weights, odd sizes (hidden 24, state 5, ...):
    ``mamba``, ``falcon_mamba`` or ``mamba2``."""
    import transformers

    config = dict(
        vocab_size=101,
        hidden_size=24,
        state_size=5,
        num_hidden_layers=3,
        expand=2,
        conv_kernel=4,
        time_step_rank=3,
    )
    if family == "mamba2":  # 6 heads of 8 in 2 groups (intermediate 48 = heads x head_dim)
        config.pop("time_step_rank")
        config.update(num_heads=6, head_dim=8, n_groups=2, chunk_size=16)
    config.update(overrides)
    config_class, model_class = {
        "mamba": (transformers.MambaConfig, transformers.MambaForCausalLM),
        "falcon_mamba": (transformers.FalconMambaConfig, transformers.FalconMambaForCausalLM),
        "mamba2": (transformers.Mamba2Config, transformers.Mamba2ForCausalLM),
    }[family]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config_class(**config))
        # Random (not the init scheme's) A_log, D and dt bias so every term of the scan matters.
        for name, param in model.named_parameters():
            if name.endswith(("A_log", ".D", "dt_proj.bias", "dt_bias")):
                param.data.uniform_(-1.0, 1.0)
    return model.eval()


def odd_mamba2_sizes(heads: int, head_dim: int, groups: int, state: int) -> dict:
    """Mamba-2 config overrides for odd shapes: ``2 * heads`` heads of ``head_dim`` (hidden
    ``heads * head_dim``, expand 2), ``groups`` groups, state ``state``, chunk 17."""
    return dict(
        hidden_size=heads * head_dim,
        expand=2,
        num_heads=2 * heads,
        head_dim=head_dim,
        n_groups=groups,
        state_size=state,
        chunk_size=17,
    )


# FalconMamba differs from Mamba by RMS norms on B, C and dt: its cases run with the slow ones.
FAMILIES = ["mamba", pytest.param("falcon_mamba", marks=pytest.mark.slow)]


@pytest.fixture(params=FAMILIES)
def hf_family(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def trained_mamba_model(request):
    """A small byte-level Mamba trained on a short text (``tests/trained_models.py``), trained
    once and then loaded from pytest's cache (``.pytest_cache/d/trained_mamba``)."""
    from .trained_models import trained_mamba

    cache = getattr(request.config, "cache", None)  # absent under -p no:cacheprovider
    return trained_mamba(cache.mkdir("trained_mamba") if cache is not None else None)

