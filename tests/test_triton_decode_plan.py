"""The captured decode's bookkeeping on the CPU, with no capture
(``lowering/triton/decode_plan.py``, ``device_sampling.py``): bucket choice, padding a batch to
its bucket, slot assignment and release, capacity errors, the state pools' sizes (K/V caches at
a fixed capacity), the static buffers' layout, which decode path a generation takes, and the
device sampler against the eager loop's filters and distribution."""

from __future__ import annotations

import pytest
import torch

from ssmcc.errors import InputError
from ssmcc.ops.contracts import StateSpec
from ssmcc.runtime.generation import Sampling, filtered_scores

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.lowering.triton import decode_plan as plan  # noqa: E402
from ssmcc.lowering.triton import device_sampling as ds  # noqa: E402

SPECS = (
    StateSpec("layers.0.conv_state", "conv_state", (24, 3)),
    StateSpec("layers.0.ssm_state", "ssm_state", (4, 6, 16)),
)


@pytest.mark.parametrize(
    "batch, bucket", [(1, 1), (2, 2), (3, 4), (5, 8), (16, 16), (17, 32), (33, 64), (64, 64)]
)
def test_a_batch_runs_in_the_smallest_bucket_that_holds_it(batch, bucket):
    assert plan.bucket_for(batch) == bucket


def test_above_the_largest_bucket_there_is_none():
    assert plan.bucket_for(65) is None
    with pytest.raises(InputError, match="at least one row, got 0"):
        plan.bucket_for(0)


def test_padding_rows_get_slot_minus_one():
    assert plan.row_slots([5, 2, 7], 4) == [5, 2, 7, -1]
    assert plan.row_slots([0, 1], 2) == [0, 1]
    with pytest.raises(InputError, match="3 rows do not fit a bucket of 2"):
        plan.row_slots([0, 1, 2], 2)


def test_slots_are_lowest_free_first_and_come_back():
    pool = plan.SlotPool(6)
    first = pool.acquire(3)
    second = pool.acquire(2)
    assert (first, second, pool.in_use, pool.free) == ([0, 1, 2], [3, 4], 5, 1)
    pool.release([1, 3])
    assert pool.acquire(3) == [1, 3, 5] and pool.free == 0
    with pytest.raises(InputError, match="released twice"):
        pool.release([1, 1, 9])


def test_admitting_more_than_the_free_slots_names_the_numbers():
    pool = plan.SlotPool(8)
    pool.acquire(6)
    with pytest.raises(InputError, match="has 8 slots with 6 in use: cannot admit 3 more"):
        pool.acquire(3)
    with pytest.raises(InputError, match="cannot grow while 6 of its slots are in use"):
        pool.grow(16)
    pool.release(list(range(6)))
    pool.grow(16)
    assert pool.capacity == 16 and pool.acquire(16) == list(range(16))


def test_the_pools_hold_every_state_per_slot():
    layout = plan.PoolLayout(SPECS, 8)
    assert layout.shapes == [
        ("layers.0.conv_state", (8, 24, 3), torch.float32),
        ("layers.0.ssm_state", (8, 4, 6, 16), torch.float32),
    ]
    assert layout.nbytes == 8 * 4 * (24 * 3 + 4 * 6 * 16) + 8 * 4  # + the lengths
    pools, lengths = layout.allocate("cpu")
    assert [tuple(p.shape) for p in pools] == [(8, 24, 3), (8, 4, 6, 16)]
    assert all(not p.any() for p in pools)
    assert lengths.dtype == torch.int32 and lengths.tolist() == [0] * 8


def test_kv_caches_get_a_fixed_capacity_in_their_pools():
    """The growing axis (positions) of a K/V cache is ``capacity`` long in its pool; the other
    states keep their shapes; the dtype is the spec's."""
    kv = (
        StateSpec("position", "position", (1,), "int64"),
        *SPECS,
        StateSpec("layers.1.key", "key", (2, 0, 8), "bfloat16", grows=(1,)),
        StateSpec("layers.1.value", "value", (2, 0, 5), "bfloat16", grows=(1,)),
    )
    layout = plan.PoolLayout(kv, 4, capacity=512)
    shapes = {name: (shape, dtype) for name, shape, dtype in layout.shapes}
    assert shapes["position"] == ((4, 1), torch.int64)
    assert shapes["layers.1.key"] == ((4, 2, 512, 8), torch.bfloat16)
    assert shapes["layers.1.value"] == ((4, 2, 512, 5), torch.bfloat16)
    assert shapes["layers.0.conv_state"] == ((4, 24, 3), torch.float32)
    kv_bytes = 4 * 2 * 512 * (8 + 5) * 2
    assert layout.nbytes == plan.PoolLayout(SPECS, 4).nbytes + 4 * 8 + kv_bytes


@pytest.mark.parametrize(
    "positions, capacity",
    [(0, 256), (1, 256), (256, 256), (257, 512), (1000, 1024), (1024, 1024), (1025, 2048)],
)
def test_the_capacity_is_a_power_of_two_holding_the_positions(positions, capacity):
    assert plan.capacity_for(positions) == capacity


@pytest.mark.parametrize("mode", [ds.GREEDY, ds.SAMPLE, ds.FILTER])
def test_static_buffers_of_a_bucket(mode):
    buffers = plan.StaticBuffers.allocate(4, 50, "cpu", mode)
    layout = {
        name: (tuple(t.shape), t.dtype)
        for name, t in vars(buffers).items()
        if isinstance(t, torch.Tensor)
    }
    expected = {
        "ids": ((4, 1), torch.int64),
        "slots": ((4,), torch.int32),
        "tokens": ((4,), torch.int64),
        "temperature": ((4, 1), torch.float32),
        "top_k": ((4, 1), torch.int64),
        "top_p": ((4, 1), torch.float32),
    }
    if mode != ds.GREEDY:
        expected["noise"] = ((4, 50), torch.float32)
    assert layout == expected
    buffers.assign([3, 0, 5], Sampling(do_sample=True, temperature=0.5, top_k=80, top_p=0.9), 50)
    assert buffers.slots.tolist() == [3, 0, 5, -1]
    assert buffers.top_k.flatten().tolist() == [50] * 4  # top_k above the vocabulary: all
    assert buffers.temperature.flatten().tolist() == [0.5] * 4
    assert torch.allclose(buffers.top_p, torch.full((4, 1), 0.9))


def _refusal(**changes):
    given = dict(cuda_graphs=True, capture=object(), kernels="auto", batch=3, step_refusal=None)
    return plan.graph_refusal(**{**given, **changes})


def test_which_path_a_generation_takes():
    assert _refusal() is None
    assert _refusal(batch=64) is None
    assert "cuda_graphs=False" in _refusal(cuda_graphs=False, capture=None)
    assert "CUDA graphs need a CUDA device" in _refusal(capture=None)
    assert "kernels='reference'" in _refusal(kernels="reference")
    assert _refusal(step_refusal="state x is read by y") == "state x is read by y"
    assert "batch of 65 rows is above the largest captured bucket, 64" in _refusal(batch=65)
    # the first reason wins, in the order the docstring gives
    assert "cuda_graphs=False" in _refusal(cuda_graphs=False, kernels="reference", batch=99)


@pytest.mark.parametrize(
    "settings",
    [
        dict(temperature=0.7),
        dict(top_k=5),
        dict(top_k=1),
        dict(top_p=0.6),
        dict(top_k=12, top_p=0.4, temperature=1.3),
        dict(top_k=100, top_p=1.0),
    ],
)
def test_the_device_filters_keep_what_the_eager_loop_keeps(settings):
    sampling = Sampling(do_sample=True, **settings)
    logits = torch.randn(6, 40, generator=torch.Generator().manual_seed(3)) * 3
    vocab = logits.shape[1]
    buffers = plan.StaticBuffers.allocate(6, vocab, "cpu", ds.FILTER)
    buffers.assign(list(range(6)), sampling, vocab)
    ordered, order = ds.filtered_scores(logits, buffers.temperature, buffers.top_k, buffers.top_p)
    device = torch.full_like(logits, float("-inf")).scatter(1, order, ordered)
    eager = filtered_scores(logits, sampling)
    assert torch.equal(torch.isfinite(device), torch.isfinite(eager))
    torch.testing.assert_close(device.softmax(-1), eager.softmax(-1), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("mode", [ds.SAMPLE, ds.FILTER])
def test_the_exponential_race_draws_from_the_softmax(mode):
    """4,000 rows of one distribution, one draw each: frequencies within 0.03 of softmax (a
    fixed seed, so the check is deterministic; filtered: the two dropped tokens never drawn)."""
    rows, probs = 4000, torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    logits = probs.log().expand(rows, -1).contiguous()
    sampling = Sampling(do_sample=True, top_k=3 if mode == ds.FILTER else None)
    buffers = plan.StaticBuffers.allocate(rows, 5, "cpu", mode)
    buffers.assign(list(range(rows)), sampling, 5)
    buffers.noise.exponential_(generator=torch.Generator().manual_seed(0))
    ds.choose_on_device(logits, mode, buffers)
    counts = torch.bincount(buffers.tokens, minlength=5).float() / rows
    expected = probs if mode == ds.SAMPLE else torch.tensor([0, 0.4, 0, 0.3, 0.15]) / 0.85
    assert (counts - expected).abs().max() < 0.03, counts


def test_greedy_on_the_device_is_argmax():
    logits = torch.randn(3, 17, generator=torch.Generator().manual_seed(1))
    buffers = plan.StaticBuffers.allocate(3, 17, "cpu", ds.GREEDY)
    ds.choose_on_device(logits, ds.GREEDY, buffers)
    assert torch.equal(buffers.tokens, logits.argmax(-1))


def test_the_sampling_mode_follows_the_settings():
    assert ds.sampling_mode(Sampling()) == ds.GREEDY
    assert ds.sampling_mode(Sampling(do_sample=True, temperature=0.5)) == ds.SAMPLE
    assert ds.sampling_mode(Sampling(do_sample=True, top_p=1.0)) == ds.SAMPLE
    assert ds.sampling_mode(Sampling(do_sample=True, top_p=0.9)) == ds.FILTER
    assert ds.sampling_mode(Sampling(do_sample=True, top_k=4)) == ds.FILTER


def test_the_command_line_turns_the_graphs_off():
    from ssmcc.cli import _target_options, build_parser

    args = build_parser().parse_args(["run", "out.d", "--no-cuda-graphs", "--prompt-ids", "1"])
    assert _target_options(args, "load") == {"cuda_graphs": False}
    args = build_parser().parse_args(["compile", "mamba-tiny", "--target", "triton", "--out", "o"])
    assert "cuda_graphs" not in _target_options(args, "compile")  # the option's default: on
