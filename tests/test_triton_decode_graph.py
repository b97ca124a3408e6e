"""The triton target's captured decode path (``lowering/triton/decode_graph.py``) run on the CPU:
the capture strategy is ``DirectCall`` (no CUDA graph; each replay runs the same function over
the same static buffers, pools and workspaces), the kernels run in Triton's interpreter.

``generate`` through it gives the eager triton path's tokens and the torch target's (greedy;
a padded bucket, ragged prompts, end-of-sequence ids), rows read and write only their own slots
of the pools, sampling on the device gives the same tokens for the same seed, slots come back
when a generation ends or is abandoned, a second generation meanwhile decodes eagerly, and the
paths that must decode eagerly say why (``cuda_graphs=False``, the CPU, reference kernels, a
state read by an op that takes no slot indices). Hybrids decode over fixed-capacity K/V pools:
the eager tokens (every family), ragged prompts in one batch, other slots untouched, the
capacity growing; the separate conv and scan steps (``pipeline="unfused"``, Jamba, Zamba) too.
"""

from __future__ import annotations

import functools
import operator

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import ssmcc
from ssmcc.presets import build_preset

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.lowering.triton.decode_graph import DirectCall  # noqa: E402
from ssmcc.lowering.triton.device_sampling import GREEDY  # noqa: E402

NEW = 3


def _ids(vocab: int, shape: tuple, seed: int) -> torch.Tensor:
    return torch.randint(0, vocab, shape, generator=torch.Generator().manual_seed(seed))


@functools.cache
def _compiled(name: str):
    model = build_preset(name).eval()
    triton = ssmcc.compile(model, target="triton", interpret=True)
    return model, triton, ssmcc.compile(model, target="torch")


@pytest.fixture(params=["mamba-tiny", "mamba2-tiny"])
def models(request):
    return _compiled(request.param)


@pytest.fixture(params=["mamba-tiny", pytest.param("mamba2-tiny", marks=pytest.mark.slow)])
def sampled(request):
    return _compiled(request.param)


def _generate(compiled, capture, *args, **kwargs):
    """``generate`` eagerly (``capture`` None) or through the static buffers (``DirectCall``)."""
    compiled.executable.use_capture(capture)
    return compiled.generate(*args, **kwargs)


def test_the_static_buffer_path_generates_the_eager_tokens(models):
    model, triton, reference = models
    ids = _ids(model.config.vocab_size, (3, 5), 0)  # bucket 4: one padding row
    assert triton.executable.decode_refusal(3) is not None  # the CPU decodes eagerly by default
    eager = _generate(triton, None, ids, NEW)
    static = _generate(triton, DirectCall(), ids, NEW)
    assert torch.equal(static, eager)
    assert torch.equal(static, reference.generate(ids, NEW))
    decoder = triton.executable._graph_decoder()[0]
    assert (4, GREEDY) in decoder.programs and decoder.slots.capacity == 4
    assert decoder.slots.in_use == 0


def test_sampling_on_the_device_repeats_for_a_seed(sampled):
    model, triton, _ = sampled
    ids = _ids(model.config.vocab_size, (2, 4), 1)
    triton.executable.use_capture(DirectCall())
    settings = dict(do_sample=True, seed=7, top_k=20, top_p=0.9, temperature=1.5)
    first = triton.generate(ids, NEW, **settings)
    assert torch.equal(triton.generate(ids, NEW, **settings), first)
    assert not torch.equal(triton.generate(ids, NEW, **{**settings, "seed": 8}), first)


def test_ragged_prompts_and_end_of_sequence_as_the_eager_loop():
    model, triton, _ = _compiled("mamba-tiny")
    prompts = [[5, 6, 7], list(range(20, 24)), [9]]
    eager = _generate(triton, None, prompts, NEW)
    static = _generate(triton, DirectCall(), prompts, NEW)
    assert all(torch.equal(a, b) for a, b in zip(static, eager, strict=True))
    ids = torch.tensor([[3, 1, 4, 1], [5, 9, 2, 6]])
    plain = _generate(triton, None, ids, NEW)
    eos = int(plain[0, 5])  # row 0 produces it at its second new token
    eager = _generate(triton, None, ids, NEW, eos_token_id=eos)
    assert torch.equal(_generate(triton, DirectCall(), ids, NEW, eos_token_id=eos), eager)


class Allocations(TorchDispatchMode):
    """The shapes of every tensor an ATen op returns."""

    def __init__(self):
        super().__init__()
        self.shapes: set[tuple] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for o in pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor):
                self.shapes.add(tuple(o.shape))
        return out


def test_rows_read_and_write_only_their_slots():
    """Slots 0, 2 and 4 hold other sequences: the batch's rows take 1, 3 and 5, the tokens are
    those of the eager path, the other slots are bitwise untouched, and no state-sized tensor
    is made during a step (the kernels update the pools in place)."""
    model, triton, _ = _compiled("mamba-tiny")
    ids = _ids(model.config.vocab_size, (3, 5), 2)
    eager = _generate(triton, None, ids, NEW)
    triton.executable.use_capture(DirectCall())
    decoder = triton.executable._graph_decoder()[0]
    decoder.reserve(8)
    taken = decoder.slots.acquire(5)
    decoder.slots.release([1, 3])
    others = [0, 2, 4]
    for pool in decoder.pools:
        pool[others] = torch.randn(pool[others].shape, generator=torch.Generator().manual_seed(4))
    before = [pool[others].clone() for pool in decoder.pools]
    with Allocations() as made:
        static = triton.generate(ids, NEW)
    assert torch.equal(static, eager)
    assert decoder.programs[(4, GREEDY)].buffers.slots.tolist() == [1, 3, 5, -1]
    assert all(torch.equal(p[others], b) for p, b in zip(decoder.pools, before, strict=True))
    step_sized = {(4, *spec.shape) for spec in triton.state_specs}
    assert not step_sized & made.shapes
    decoder.slots.release([s for s in taken if s not in (1, 3)])
    assert decoder.slots.in_use == 0


def test_an_abandoned_stream_gives_its_slots_back_and_a_second_one_decodes_eagerly():
    model, triton, _ = _compiled("mamba-tiny")
    ids = _ids(model.config.vocab_size, (2, 3), 5)
    expected = _generate(triton, None, ids, NEW)
    triton.executable.use_capture(DirectCall())
    assert "a batch of 65 rows is above" in triton.executable.decode_refusal(65)
    decoder = triton.executable._graph_decoder()[0]
    first = triton.stream(ids, NEW)
    assert torch.equal(next(first), expected[:, 3])
    assert decoder.slots.in_use == 2  # the first generation holds the graphs
    assert torch.equal(triton.generate(ids, NEW), expected)  # so this one ran eagerly
    assert (2, GREEDY) in decoder.programs and decoder.slots.in_use == 2
    first.close()
    assert decoder.slots.in_use == 0
    assert torch.equal(triton.generate(ids, NEW), expected)  # the graphs again


def test_which_programs_decode_eagerly_and_why():
    model = build_preset("mamba-tiny").eval()
    off = ssmcc.compile(model, target="triton", interpret=True, cuda_graphs=False)
    off.executable.use_capture(DirectCall())
    assert "cuda_graphs=False" in off.executable.decode_refusal(1)
    reference = ssmcc.compile(model, target="triton", interpret=True, kernels="reference")
    reference.executable.use_capture(DirectCall())
    assert "kernels='reference'" in reference.executable.decode_refusal(1)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    # the separate conv and scan step ops take slot indices too
    unfused = ssmcc.compile(model, target="triton", interpret=True, pipeline="unfused")
    unfused.executable.use_capture(DirectCall())
    assert unfused.executable.decode_refusal(2) is None
    assert torch.equal(unfused.generate(ids, 3), off.generate(ids, 3))


def _program(also_read: bool):
    """A step program (ids, state) -> (logits, new state) as the lowering leaves it (shapes
    recorded); ``also_read``: an ATen op reads the state too."""
    from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_update_fwd

    graph = torch.fx.Graph()
    ids, state = graph.placeholder("input_ids"), graph.placeholder("states_0")
    weight = graph.get_attr("weight")
    x = graph.call_function(torch.ops.aten.mul.Tensor, (ids, 1.0))
    if also_read:
        graph.call_function(torch.ops.aten.mul.Tensor, (state, 2.0))
    call = graph.call_function(causal_conv1d_update_fwd, (x, state, weight))
    out = graph.call_function(operator.getitem, (call, 0))
    new = graph.call_function(operator.getitem, (call, 1))
    out.meta["val"] = torch.empty(1, 4)
    graph.output((out, new))
    root = torch.nn.Module()
    root.weight = torch.nn.Parameter(torch.ones(4, 3))
    return torch.fx.GraphModule(root, graph)


def test_a_state_read_by_anything_else_is_refused_naming_it():
    from ssmcc.lowering.triton.pooled_step import StepRefusal, pool_step
    from ssmcc.ops.contracts import StateSpec

    specs = [StateSpec("layers.0.conv_state", "conv_state", (4, 2))]
    pooled = pool_step(_program(also_read=False), specs, "cpu")
    assert [n.name for n in pooled.module.graph.nodes if n.op == "placeholder"] == [
        "input_ids", "state_indices", "lengths", "pool_0"
    ]

    with pytest.raises(StepRefusal, match=r"conv_state is read by mul_tensor_1, not by one call"):
        pool_step(_program(also_read=True), specs, "cpu")


def test_hybrids_decode_over_kv_pools_as_the_eager_loop():
    """Bamba (Mamba-2, attention with RoPE: positions, K/V caches, fused SSD steps) through the
    pools: the eager tokens for a padded bucket and for ragged prompts (one batch here, row by
    row eagerly); each slot's length is its prompt plus the steps it took; slots of other
    sequences (K/V pools, counts, lengths) are bitwise untouched; a longer generation grows the
    capacity and drops the graphs over the old pools."""
    model = build_preset("bamba-tiny").eval()
    triton = ssmcc.compile(model, target="triton", interpret=True)
    ids = _ids(model.config.vocab_size, (3, 5), 8)
    eager = _generate(triton, None, ids, NEW)
    triton.executable.use_capture(DirectCall())
    assert triton.executable.decode_refusal(3) is None
    decoder = triton.executable._graph_decoder()[0]
    decoder.reserve(8)
    taken = decoder.slots.acquire(5)
    decoder.slots.release([1, 3])
    others = [0, 2, 4]
    seeded = torch.Generator().manual_seed(4)
    for pool in decoder.pools:
        pool[others] = torch.randint(0, 9, pool[others].shape, generator=seeded).to(pool.dtype)
    decoder.lengths[others] = torch.tensor([7, 9, 11], dtype=torch.int32)
    before = [pool[others].clone() for pool in decoder.pools]
    assert torch.equal(triton.generate(ids, NEW), eager)
    assert all(torch.equal(p[others], b) for p, b in zip(decoder.pools, before, strict=True))
    assert decoder.lengths.tolist() == [7, 5 + NEW - 1, 9, 5 + NEW - 1, 11, 5 + NEW - 1, 0, 0]
    decoder.slots.release([s for s in taken if s not in (1, 3)])
    prompts = [[5, 6, 7], list(range(20, 24)), [9]]
    eager = _generate(triton, None, prompts, NEW)
    static = _generate(triton, DirectCall(), prompts, NEW)
    assert all(torch.equal(a, b) for a, b in zip(static, eager, strict=True))
    decoder = triton.executable._graph_decoder()[0]  # a new capture: a new decoder
    assert decoder.lengths[:3].tolist() == [3 + NEW - 1, 4 + NEW - 1, 1 + NEW - 1]
    assert decoder.capacity == 256 and decoder.programs
    decoder.reserve(4, 300)
    assert decoder.capacity == 512 and not decoder.programs
    grown = zip(decoder.pools, decoder.specs, strict=True)
    assert {pool.shape[2] for pool, spec in grown if spec.grows} == {512}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["granite-hybrid-tiny", "falcon-h1-tiny", "jamba-tiny", "zamba-tiny"]
)
def test_every_hybrid_decodes_over_the_pools(name):
    """The hybrids' distinct paths: MoE and RoPE (GraniteMoeHybrid), attention and Mamba-2 in one
    layer (FalconH1), the Mamba-1 layers of Jamba and Zamba with separate conv and scan steps (and
    Zamba's shared attention block). Nemotron-H and Zamba2 take the same paths (checked once,
    2026-12-05); bamba-tiny runs in the default suite above."""
    from .test_hybrids import hybrid

    compiled = ssmcc.compile(hybrid(name), target="triton", interpret=True)
    ids = _ids(compiled.vocab_size, (2, 4), 3)
    eager = _generate(compiled, None, ids, NEW)
    compiled.executable.use_capture(DirectCall())
    assert compiled.executable.decode_refusal(2) is None
    assert torch.equal(compiled.generate(ids, NEW), eager)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["mamba-tiny", "mamba2-tiny", "bamba-tiny"])
def test_on_a_gpu_the_graphs_give_the_eager_tokens_and_replay_without_syncing(name):
    """The real capture: greedy tokens equal the eager path's (batch 3: a padded bucket), a
    seed repeats, and a replay makes no synchronising CUDA call (torch's sync debug mode)."""
    model = build_preset(name).eval()
    graphs = ssmcc.compile(model, target="triton")
    eager = ssmcc.compile(model, target="triton", cuda_graphs=False)
    ids = _ids(model.config.vocab_size, (3, 7), 6)
    assert graphs.executable.decode_refusal(3) is None
    assert torch.equal(graphs.generate(ids, 16), eager.generate(ids, 16))
    settings = dict(do_sample=True, seed=3, top_k=40, top_p=0.9)
    assert torch.equal(graphs.generate(ids, 16, **settings), graphs.generate(ids, 16, **settings))
    decoder = graphs.executable._graph_decoder()[0]
    for key in ((4, GREEDY), (4, "filter")):
        torch.cuda.set_sync_debug_mode("error")
        try:
            decoder.programs[key].replay()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
