"""The triton target end to end, its kernels in Triton's interpreter on the CPU
(``interpret=True``): logits against Hugging Face eager (1e-4, fp32), greedy generation against
HF's, prefill + steps against one prefill, save/load, and the errors a user meets (no GPU, no
Triton).

Families: Mamba-1 and Mamba-2 (the tiny presets), and the hybrids (attention with its K/V cache,
MoE, rotary positions), slow: GraniteMoeHybrid (Mamba-2 + attention + MoE; Jamba's Mamba-1 +
attention + MoE passed here too, 2026-12-04); the attention and MoE kernels run against their
references by default in ``test_triton_kernels.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import ssmcc
from ssmcc.errors import OptionError
from ssmcc.presets import build_preset

from .test_hybrids import _greedy_by_full_forward, _logits, hybrid

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

TOLERANCE = 1e-4
MODELS = [  # Mamba-2's kernels by default in test_triton_ssd and test_triton_kernels
    "mamba-tiny",
    pytest.param("mamba2-tiny", marks=pytest.mark.slow),
    pytest.param("granite-hybrid-tiny", marks=pytest.mark.slow),
]


def _model(name):
    return hybrid(name) if name == "granite-hybrid-tiny" else build_preset(name)


@pytest.fixture(scope="module", params=MODELS)
def compiled(request):
    model = _model(request.param).eval()
    return model, ssmcc.compile(model, target="triton", interpret=True)


def test_logits_match_hf(compiled):
    model, program = compiled
    ids = torch.randint(
        0, model.config.vocab_size, (2, 13), generator=torch.Generator().manual_seed(0)
    )
    assert (program(ids) - _logits(model, ids)).abs().max() <= TOLERANCE


def test_greedy_generation_matches_hf(compiled):
    model, program = compiled
    prompt = torch.randint(
        0, model.config.vocab_size, (1, 7), generator=torch.Generator().manual_seed(1)
    )
    assert torch.equal(program.generate(prompt, 16), _greedy_by_full_forward(model, prompt, 16))


def test_prefill_then_steps_equals_prefill(compiled):
    model, program = compiled
    ids = torch.randint(
        0, model.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(2)
    )
    full, full_state = program.prefill(ids)
    _, state = program.prefill(ids[:, :5])
    for position in range(5, 9):
        logits, state = program.step(ids[:, position], state)
        assert (logits - full[:, position]).abs().max() <= TOLERANCE
    for name in full_state:
        assert (state[name] - full_state[name]).abs().max() <= TOLERANCE, name


def test_the_programs_call_triton_kernels():
    model = build_preset("mamba-tiny").eval()
    program = ssmcc.compile(model, target="triton", interpret=True)
    step = program.executable.module("step")
    targets = {getattr(n.target, "__module__", "") for n in step.graph.nodes}
    assert "ssmcc.kernels.triton.mixers" in targets
    assert not any(str(getattr(n.target, "namespace", "")) == "ssmcc" for n in step.graph.nodes)


@pytest.mark.slow
def test_save_and_load(tmp_path):
    model = build_preset("mamba2-tiny").eval()
    program = ssmcc.compile(model, target="triton", interpret=True)
    program.save(str(tmp_path / "artifact"))
    loaded = ssmcc.load(str(tmp_path / "artifact"), interpret=True)
    ids = torch.randint(0, model.config.vocab_size, (1, 6))
    assert torch.equal(loaded(ids), program(ids))
    assert loaded.generate(ids, 4).shape == (1, 10)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error on a machine without GPU")
def test_without_a_gpu_it_says_to_interpret():
    model = build_preset("mamba-tiny").eval()
    with pytest.raises(OptionError, match=r"no[ne]*.*interpret=True"):
        ssmcc.compile(model, target="triton")


@pytest.mark.slow  # a fresh interpreter that compiles a model: ~8 s
def test_without_triton_it_says_what_to_install():
    """A Python that cannot import Triton: compile says what to install, other targets work."""
    script = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'triton' else real(n, *a)\n"
        "sys.modules['triton'] = None\n"
        "import ssmcc, torch\n"
        "from ssmcc.presets import build_preset\n"
        "model = build_preset('mamba-tiny').eval()\n"
        "ssmcc.compile(model, target='torch')\n"
        "from ssmcc.lowering.registry import coverage\n"
        "rows = [r for r in coverage() if r['backend'] == 'triton']\n"
        "assert rows and all(r['status'] == 'unsupported' for r in rows), rows\n"
        "try:\n"
        "    ssmcc.compile(model, target='triton', interpret=True)\n"
        "except ssmcc.OptionError as e:\n"
        "    print('ERROR', e)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "ERROR" in result.stdout and 'pip install -e ".[triton]"' in result.stdout


def test_coverage_lists_a_triton_kernel_for_every_op():
    from ssmcc.lowering.registry import coverage

    rows = [r for r in coverage() if r["backend"] == "triton"]
    assert rows and all(r["status"] == "supported" for r in rows), rows
    assert all("kernels/triton/" in r["detail"] for r in rows)


@pytest.mark.parametrize("name", ["mamba-tiny", "mamba2-tiny"])
def test_every_tensor_the_programs_read_moves_to_the_device(name):
    """On a GPU the lowered module must hold every tensor its graph reads on the GPU; checked
    here with the meta device (no GPU needed), for every program."""
    from ssmcc.lowering.triton.target import lower_to_triton

    program = ssmcc.compile(build_preset(name).eval(), target="torch").executable.programs
    for graph in ("prefill", "chunk", "step"):
        module = lower_to_triton(program.program(graph), "auto", torch.device("meta"))
        read = [getattr(module, n.target) for n in module.graph.nodes if n.op == "get_attr"]
        read = [v for v in read if isinstance(v, torch.Tensor)]
        assert read and all(v.device.type == "meta" for v in read), graph


def test_lowering_leaves_the_programs_weights_where_they_are():
    """Lowering moves a copy: CPU -> CUDA (like a dtype change on the CPU, used here) would
    otherwise move the captured program's parameters in place (found on a GPU: every stateful
    graph derived after the first lowering failed with tensors on two devices)."""
    from ssmcc.lowering.triton.target import moved_without_sharing

    model = build_preset("mamba-tiny").eval()
    program = ssmcc.compile(model, target="torch").executable.programs.program("forward")
    module = program.module()
    before = {name: (p, p.dtype) for name, p in module.named_parameters()}
    memo = {}
    moved = moved_without_sharing(module, lambda t: t.to(torch.float64), memo)
    assert {p.dtype for p in moved.parameters()} == {torch.float64}
    again = moved_without_sharing(program.module(), lambda t: t.to(torch.float64), memo)
    assert {id(p) for p in again.parameters()} == {id(p) for p in moved.parameters()}
    assert all(p.dtype == dtype for p, dtype in before.values())
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {v.dtype for v in program.state_dict.values()} == {torch.float32}
