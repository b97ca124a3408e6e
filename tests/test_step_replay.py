"""The torch target's step replay (``lowering/torch/replay.py``, ``kernels/cpu/replay.cpp``):
bitwise the fx module's results over consecutive steps for every family and weight format it
records, fresh result memory per step, one recording per input layout, and the module's own path
wherever a node or a layout cannot be replayed (refusal names the node)."""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch
from torch import fx

import ssmcc
from ssmcc.kernels.cpu import native
from ssmcc.kernels.cpu.linear_binding import GEMV_MAX_ROWS
from ssmcc.lowering.torch.linear import linear_cpu
from ssmcc.lowering.torch.replay import StepReplay
from ssmcc.presets import build_preset

pytestmark = pytest.mark.skipif(not native.available(), reason="no C++ compiler here")


def _compiled(preset: str, quantize: str = "none"):
    compiled = ssmcc.compile(build_preset(preset, seed=3), target="torch", quantize=quantize)
    executable = compiled.executable
    return compiled, executable, executable.module("step")


def _start(compiled, batch: int):
    ids = torch.randint(
        0, compiled.vocab_size, (batch, 5), generator=torch.Generator().manual_seed(1)
    )
    _, state = compiled.prefill(ids)
    return [state[spec.name] for spec in compiled.executable.specs]


def _steps(run, states, tokens):
    """Logits and states of consecutive steps, each fed the previous step's states."""
    logits = []
    for token in tokens:
        outputs = list(run(token, *states))
        logits.append(outputs[0])
        states = outputs[1:]
    return logits, states


@pytest.mark.parametrize(
    "preset,quantize,batch",
    [
        ("mamba-tiny", "none", 1),
        ("mamba-tiny", "int8", 2),
        ("mamba2-tiny", "fp16", 3),
        pytest.param("mamba-tiny", "none", 3, marks=pytest.mark.slow),
        pytest.param("mamba-tiny", "bf16", 1, marks=pytest.mark.slow),
        pytest.param("falcon-mamba-tiny", "none", 2, marks=pytest.mark.slow),
        pytest.param("mamba2-tiny", "none", 1, marks=pytest.mark.slow),
        pytest.param("mamba2-tiny", "int8-g32", 1, marks=pytest.mark.slow),
    ],
)
def test_replayed_steps_equal_the_module_bitwise(preset, quantize, batch):
    compiled, executable, module = _compiled(preset, quantize)
    states = _start(compiled, batch)
    g = torch.Generator().manual_seed(7)
    tokens = [torch.randint(0, compiled.vocab_size, (batch, 1), generator=g) for _ in range(4)]
    expected_logits, expected_states = _steps(module, states, tokens)
    got_logits, got_states = _steps(lambda *a: executable.run("step", *a), states, tokens)
    replay = executable.step_replay()
    assert replay.refusal is None
    assert len(replay._plans) == 1
    for got, expected in zip(
        got_logits + got_states, expected_logits + expected_states, strict=True
    ):
        assert got.shape == expected.shape and got.stride() == expected.stride()
        assert torch.equal(got, expected)


def test_each_step_returns_fresh_memory():
    compiled, executable, _ = _compiled("mamba-tiny")
    states = _start(compiled, 2)
    token = torch.tensor([[3], [4]])
    first = executable.run("step", token, *states)
    kept = [t.clone() for t in first]
    second = executable.run("step", token, *first[1:])
    for before, copy in zip(first, kept, strict=True):
        assert torch.equal(before, copy)  # the next step wrote elsewhere
    pointers = {t.data_ptr() for t in first}
    assert not pointers & {t.data_ptr() for t in second}
    assert not pointers & {t.data_ptr() for t in states}


def test_one_recording_per_layout_and_the_same_results_after_switching():
    compiled, executable, module = _compiled("mamba2-tiny")
    for batch in (1, 2, 1, 2):
        states = _start(compiled, batch)
        token = torch.ones(batch, 1, dtype=torch.long)
        expected = list(module(token, *states))
        got = executable.run("step", token, *states)
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert len(executable.step_replay()._plans) == 2


def test_a_layout_with_a_temporary_copy_runs_through_the_module():
    """A state passed as a transposed view reaches its kernel as a copy the binding makes per
    call: that layout is refused, naming the node; the contiguous layout is still replayed."""
    compiled, executable, module = _compiled("mamba-tiny")
    states = _start(compiled, 1)
    strided = [s.transpose(-1, -2).contiguous().transpose(-1, -2) for s in states]
    assert any(not s.is_contiguous() for s in strided)
    token = torch.tensor([[5]])
    got = executable.run("step", token, *strided)
    replay = executable.step_replay()
    assert replay.refusal is not None and "mamba_mixer_step" in replay.refusal
    assert "temporary" in replay.refusal and not replay.disabled
    expected = list(module(token, *states))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    got = executable.run("step", token, *states)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    assert sum(not isinstance(plan, str) for plan in replay._plans.values()) == 1


def test_a_batch_past_the_matrix_vector_kernel_does_not_stop_the_replay():
    """Above GEMV_MAX_ROWS rows a linear runs on oneDNN, in Python between kernels: that layout
    runs through the module, and smaller batches are still replayed."""
    compiled, executable, module = _compiled("mamba-tiny", "int8")
    for batch in (GEMV_MAX_ROWS + 1, 1):
        states = _start(compiled, batch)
        token = torch.ones(batch, 1, dtype=torch.long)
        got = executable.run("step", token, *states)
        expected = list(module(token, *states))
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    replay = executable.step_replay()
    assert not replay.disabled
    assert [isinstance(plan, str) for plan in replay._plans.values()] == [True, False]


def test_an_in_place_op_between_kernels_is_not_taken_for_a_view():
    """``y.add_(1)`` returns y's storage but writes it: the replay must not skip it."""
    graph = fx.Graph()
    x, weight = graph.placeholder("x"), graph.placeholder("weight")
    y = graph.call_function(linear_cpu, (x, weight))
    bumped = graph.call_function(torch.ops.aten.add_.Tensor, (y, 1.0))
    graph.output((graph.call_function(linear_cpu, (bumped, weight)),))
    replay = StepReplay(fx.GraphModule(torch.nn.Module(), graph))
    x, weight = torch.randn(1, 1, 6), torch.randn(6, 6)
    expected = linear_cpu(linear_cpu(x, weight) + 1.0, weight)
    for _ in range(2):
        (got,) = replay(x, weight)
        assert torch.equal(got, expected)
    assert replay.disabled and "add_" in replay.refusal


def test_the_replayed_add_keeps_denormals_as_aten_does():
    lib = native.library()
    arity = ctypes.c_int32()
    entry = lib.ssmcc_replay_entry(b"ssmcc_add_f32", ctypes.byref(arity))
    tiny = torch.finfo(torch.float32).tiny
    a = torch.tensor([tiny / 4, -tiny / 8, 1.0, tiny / 2])
    b = torch.tensor([tiny / 8, tiny / 16, 2.0, -tiny / 4])
    out = torch.empty(4)
    words = torch.tensor([entry, 4, 0, a.data_ptr(), b.data_ptr(), out.data_ptr(), 4])
    slots = (ctypes.c_int64 * 1)(0)
    assert lib.ssmcc_replay(words.data_ptr(), words.numel(), slots, 1) == 0
    assert torch.equal(out, a + b) and (out[[0, 1, 3]] != 0).all()


def test_a_hybrid_step_runs_through_the_module_and_is_not_recorded_again():
    """Jamba's step reads its growing attention cache's length: a node that runs in Python
    between kernels, so the replay stops for good (its cache's layout changes every step)."""
    compiled, executable, module = _compiled("jamba-tiny")
    states = _start(compiled, 1)
    token = torch.tensor([[2]])
    got = executable.run("step", token, *states)
    replay = executable.step_replay()
    assert replay.disabled and replay.refusal.startswith("node ")
    expected = list(module(token, *states))
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    executable.run("step", token, *got[1:])
    assert len(replay._plans) == 1


def test_threads_decoding_one_model_get_their_own_tokens():
    compiled, _, _ = _compiled("mamba-tiny")
    prompts = [torch.tensor([[1, 2, 3]]), torch.tensor([[9, 8]]), torch.tensor([[4]])]
    expected = [compiled.generate(p, max_new_tokens=12) for p in prompts]
    got: dict[int, torch.Tensor] = {}

    def decode(index):
        for _ in range(3):
            got[index] = compiled.generate(prompts[index], max_new_tokens=12)

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for index, tokens in enumerate(expected):
        assert torch.equal(got[index], tokens)


def test_malformed_code_and_unknown_entries_are_refused_by_the_library():
    lib = native.library()
    arity = ctypes.c_int32()
    assert lib.ssmcc_replay_entry(b"ssmcc_linear_f32", ctypes.byref(arity)) >= 0
    assert arity.value == len(native.KINDS["ssmcc_linear_f32"])
    assert lib.ssmcc_replay_entry(b"system", ctypes.byref(arity)) == -1
    entry = lib.ssmcc_replay_entry(b"ssmcc_add_f32", ctypes.byref(arity))
    slots = (ctypes.c_int64 * 1)(0)
    for code in (
        [entry, 3, 0, 0, 0, 0],
        [entry + 100, 4, 0, 0, 0, 0, 0],
        [entry, 4, 1, 0, 0, 0, 0],
    ):
        words = torch.tensor(code, dtype=torch.int64)
        assert lib.ssmcc_replay(words.data_ptr(), words.numel(), slots, 1) == -1
    a, b, out = torch.randn(5), torch.randn(5), torch.empty(5)
    words = torch.tensor([entry, 4, 0, a.data_ptr(), b.data_ptr(), out.data_ptr(), 5])
    assert lib.ssmcc_replay(words.data_ptr(), words.numel(), slots, 1) == 0
    assert torch.equal(out, a + b)
