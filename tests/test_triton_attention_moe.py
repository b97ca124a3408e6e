"""Attention's split-key decode and the MoE experts' grouped GEMM (``kernels/triton/attention.py``,
``moe_experts.py``) against the ops' references, in Triton's interpreter.

Attention: caches of 0, 1, 37 and 130 positions, GQA ratios 1, 2 and 4, head dims 8 and 19, one
query position and a few, so that the interpreter's small key blocks give several splits and a
partial last block (checked on the recorded grid); the prefill path with a cache and GQA 4.
MoE: 1, 7 and 37 tokens, 4-8 experts, top-1 and top-2, every activation, gated and not, float32 /
float16 / bfloat16 hidden states with weights in the model's dtype and stored small (int8 per row
and per group of 32, bf16, fp16, and int8 with groups of 8, which no step of a product fits in);
each case through both designs (grouped GEMM and per-pair matrix-vector) whichever the launcher
would pick. Tolerances: fuzzing.py's (mamba_ssm's scan tolerances) by output dtype. The GPU tiles
the launchers pick by dtype and head dim are checked on recorded launches (their register use at
sm_90 is ``test_triton_aot.py``'s slow spill test).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import aot, attention, configs, moe_experts, runtime  # noqa: E402
from ssmcc.ops import SSMCC_REFERENCES  # noqa: E402
from ssmcc.ops.activations import FORMS  # noqa: E402
from ssmcc.ops.moe_experts import ACTIVATIONS  # noqa: E402
from ssmcc.ops.quantized_linear import quantize_weight  # noqa: E402

from .fuzzing import TOLERANCES  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _close(got, expected):
    assert got.shape == expected.shape and got.dtype == expected.dtype
    rtol, atol = TOLERANCES["scan", expected.dtype]
    torch.testing.assert_close(got.float(), expected.float(), rtol=rtol, atol=atol)


def _attention_inputs(dtype, heads, kv_heads, length, past, head_dim, value_dim, seed):
    g = torch.Generator().manual_seed(seed)

    def draw(*shape):
        return torch.randn(*shape, generator=g).to(dtype)

    q, k, v = (draw(2, heads, length, head_dim), draw(2, kv_heads, length, head_dim),
               draw(2, kv_heads, length, value_dim))
    pk = draw(2, kv_heads, past, head_dim) if past else None
    pv = draw(2, kv_heads, past, value_dim) if past else None
    return q, k, v, head_dim**-0.5, pk, pv


# (past, heads, kv_heads, length, head_dim, value_dim): every cache length with every GQA ratio
DECODE = [
    (0, 2, 2, 1, 8, 8),
    (0, 4, 2, 3, 19, 19),
    (0, 4, 1, 1, 19, 5),
    (1, 2, 2, 3, 19, 19),
    (1, 4, 2, 1, 8, 8),
    (1, 4, 1, 3, 8, 13),
    (37, 2, 2, 1, 19, 19),
    (37, 4, 2, 1, 8, 8),
    (37, 4, 1, 16, 8, 8),
    (130, 2, 2, 3, 8, 8),
    (130, 4, 2, 1, 19, 19),
    (130, 4, 1, 1, 8, 19),
]


def _decode_cases():
    """Every case in float16 (16-bit products); float32 and bfloat16 on every third case by
    default, on all when slow."""
    for index, case in enumerate(DECODE):
        yield pytest.param(torch.float16, *case)
        for dtype in (torch.float32, torch.bfloat16):
            marks = () if index % 3 == 0 else pytest.mark.slow
            yield pytest.param(dtype, *case, marks=marks)


@pytest.mark.parametrize(
    "dtype,past,heads,kv_heads,length,head_dim,value_dim", list(_decode_cases())
)
def test_attention_decode(dtype, past, heads, kv_heads, length, head_dim, value_dim):
    args = _attention_inputs(dtype, heads, kv_heads, length, past, head_dim, value_dim, past)
    got = attention.attention_fwd(*args)
    for a, b in zip(got, SSMCC_REFERENCES["attention"](*args), strict=True):
        _close(a, b)


def _launches(run, monkeypatch) -> dict:
    """The launches ``run()`` makes with the interpreter's meta-parameters (recorded, not run),
    by kernel name."""
    monkeypatch.setattr(runtime, "RECORDED", [])
    run()
    return {r[0].fn.__name__: r for r in runtime.RECORDED}


@pytest.mark.parametrize("past,heads,kv_heads,length,head_dim,value_dim", DECODE)
def test_attention_decode_splits_the_keys(
    past, heads, kv_heads, length, head_dim, value_dim, monkeypatch
):
    """The launch ``test_attention_decode`` ran: (rows of a K/V head's group, key splits), the
    splits whole key blocks covering the cache, several of them (the last partial) from 37
    cached positions on."""
    args = _attention_inputs(torch.float32, heads, kv_heads, length, past, head_dim, value_dim, 0)
    launches = _launches(lambda: attention.attention_fwd(*args), monkeypatch)
    assert "_attention_kernel" not in launches  # a decode never runs the prefill kernel
    _, grid, split_args, meta = launches["_attention_split_kernel"]
    total, rows = past + length, heads // kv_heads * length
    assert grid[0] == 2 * kv_heads * -(-rows // meta["BLOCK_M"])
    split_len, splits = split_args[12], split_args[13]
    assert split_len % meta["BLOCK_N"] == 0 and grid[1] == splits == -(-total // split_len)
    if past >= 37:
        assert splits >= 2 and total % meta["BLOCK_N"] != 0
    assert launches["_attention_combine_kernel"][1] == (2 * heads, length)


def test_split_keys_fill_the_gpu():
    """GPU meta-parameters: batch 1 with a long cache is split until about ``programs``
    programs run, never below ``split`` keys; a large batch keeps whole caches."""
    tiles = configs.ATTENTION_DECODE_GPU
    sizes = tiles["block_n"], tiles["split"], tiles["programs"]
    for lanes, total in ((4, 4096), (4, 32768), (8, 100000), (1, 130)):
        split_len = attention.split_keys(total, lanes, *sizes)
        splits = -(-total // split_len)
        assert split_len % tiles["block_n"] == 0 and split_len >= tiles["split"]
        wanted = -(-tiles["programs"] // lanes)
        assert splits <= wanted  # no more splits than it takes
        assert 2 * splits >= min(wanted, total // tiles["split"])  # whole blocks: about all
    assert attention.split_keys(4096, 64 * 8, *sizes) >= 4096  # batch 64: one split


@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_gpu_tiles_by_dtype_and_head_dim(dtype, head_dim):
    """The GPU meta-parameters (recorded, not run) of a prefill and a decode: 16-bit heads over
    64 wide and float32 take 32 keys a step, float32 8 warps; the cache copy's tiles hold
    ``APPEND_CACHE_GPU`` elements (the tiles that do not spill at sm_90)."""
    args = _attention_inputs(dtype, 4, 2, 20, 5, head_dim, head_dim, 0)
    step = _attention_inputs(dtype, 4, 2, 1, 24, head_dim, head_dim, 0)
    launches = {}
    for r in aot.record_launches(lambda: (attention.attention_fwd(*args),
                                          attention.attention_fwd(*step))):
        launches.setdefault(r[0].fn.__name__, r)
    wide = dtype == torch.float32 or head_dim > 64
    warps = 8 if dtype == torch.float32 else 4
    prefill, decode = launches["_attention_kernel"][3], launches["_attention_split_kernel"][3]
    assert (prefill["BLOCK_N"], prefill["num_warps"]) == (32 if wide else 64, warps)
    assert (decode["BLOCK_N"], decode["num_warps"]) == (32, warps)
    copy = launches["_append_cache_kernel"][3]
    elements = configs.APPEND_CACHE_GPU["elements"]
    assert copy["BLOCK_T"] * copy["BLOCK_D"] == elements and copy["BLOCK_D"] == head_dim


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,length,past,head_dim",
    [
        (torch.float16, 4, 1, 23, 37, 19),
        (torch.float32, 4, 1, 23, 37, 19),
        (torch.bfloat16, 4, 2, 17, 0, 8),
        pytest.param(torch.float16, 4, 2, 17, 0, 8, marks=pytest.mark.slow),
    ],
)
def test_attention_prefill_with_gqa(dtype, heads, kv_heads, length, past, head_dim):
    args = _attention_inputs(dtype, heads, kv_heads, length, past, head_dim, head_dim, length)
    assert length > attention.DECODE_QUERIES
    for a, b in zip(attention.attention_fwd(*args), SSMCC_REFERENCES["attention"](*args),
                    strict=True):
        _close(a, b)


def _stored(weights, form):
    """(weights, scale) in ``form``: a quantize scheme, or "int8-g8" (groups of 8 inputs, which
    no product step fits in: dequantised first)."""
    if form == "int8-g8":
        g = torch.Generator().manual_seed(8)
        stored = torch.randint(-127, 128, weights.shape, generator=g, dtype=torch.int8)
        groups = weights.shape[2] // 8
        return stored, torch.rand(*weights.shape[:2], groups, generator=g) / 256
    pairs = [quantize_weight(w, form) for w in weights]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _moe_case(dtype, form, tokens, experts, top_k, gated, seed):
    g = torch.Generator().manual_seed(seed)
    dim, width = 64, 48
    hidden = torch.randn(tokens, dim, generator=g).to(dtype)
    index = torch.stack([torch.randperm(experts, generator=g)[:top_k] for _ in range(tokens)])
    index[0, 0] = experts  # an index outside the experts (and below: -1) adds nothing
    if tokens > 2:
        index[2, -1] = -1
    weights = torch.rand(tokens, top_k, generator=g).to(dtype)
    up = torch.randn(experts, 2 * width if gated else width, dim, generator=g) / 8
    down = torch.randn(experts, dim, width, generator=g) / 8
    if form is None:
        return (hidden, index, weights, up.to(dtype), down.to(dtype)), {}
    (up, up_scale), (down, down_scale) = _stored(up, form), _stored(down, form)
    return (hidden, index, weights, up, down), dict(up_scale=up_scale, down_scale=down_scale)


DESIGNS = {"grouped": moe_experts._grouped, "per_pair": moe_experts._per_slot}


def _run(design, args, activation, gated, scales):
    """One case through one design (``DESIGNS``), whichever the launcher would pick."""
    hidden, index, weights, up, down = args
    out = torch.empty_like(hidden)
    DESIGNS[design](hidden, index, weights, up, down, out, FORMS.index(activation), gated,
                    scales.get("up_scale"), scales.get("down_scale"))
    return out


def _activation_cases():
    """Every activation, gated and not, through the grouped GEMM; through the per-pair kernels
    for silu and relu2 by default, every activation when slow."""
    for activation in ACTIVATIONS:
        for gated in (True, False):
            yield pytest.param(activation, gated, "grouped")
            marks = () if activation in ("silu", "relu2") else pytest.mark.slow
            yield pytest.param(activation, gated, "per_pair", marks=marks)


@pytest.mark.parametrize("activation,gated,design", list(_activation_cases()))
def test_moe_every_activation(activation, gated, design):
    args, scales = _moe_case(torch.float32, None, 7, 4, 2, gated, len(activation))
    expected = SSMCC_REFERENCES["moe_experts"](*args, activation, gated)
    _close(_run(design, args, activation, gated, scales), expected)


WEIGHT_FORMS = [None, "int8", "int8-g32", "bf16", "fp16", "int8-g8"]


def _shape_of(dtype, form):
    """(tokens, experts, top_k, activation, gated) of a (dtype, weight form) case: every
    combination of 1 / 7 / 37 tokens, 4-8 experts, top-1 / top-2 and the activations is met."""
    case = WEIGHT_FORMS.index(form) + 3 * DTYPES.index(dtype)
    return ((1, 7, 37)[case % 3], 4 + case % 5, 1 + case % 2,
            ACTIVATIONS[case % len(ACTIVATIONS)], case % 4 != 1)


def _form_cases():
    """Both designs on every case; the per-pair kernels on 37 tokens (74 programs in the
    interpreter) only when slow."""
    for dtype in DTYPES:
        for form in WEIGHT_FORMS:
            yield pytest.param(dtype, form, "grouped")
            slow = _shape_of(dtype, form)[0] == 37
            yield pytest.param(dtype, form, "per_pair", marks=pytest.mark.slow if slow else ())


@pytest.mark.parametrize("dtype,form,design", list(_form_cases()))
def test_moe_dtypes_and_stored_weights(dtype, form, design):
    tokens, experts, top_k, activation, gated = _shape_of(dtype, form)
    args, scales = _moe_case(dtype, form, tokens, experts, top_k, gated, tokens + experts)
    expected = SSMCC_REFERENCES["moe_experts"](*args, activation, gated, **scales)
    _close(_run(design, args, activation, gated, scales), expected)


@pytest.mark.parametrize("tokens,top_k,experts", [(1, 2, 4), (2, 2, 4), (3, 2, 4), (37, 1, 8)])
def test_moe_launcher_picks_the_design(tokens, top_k, experts):
    """The grouped GEMM once there are more (token, expert) pairs than experts, else the
    per-pair kernels."""
    args, _ = _moe_case(torch.float32, None, tokens, experts, top_k, True, 0)
    chosen = {r[0].fn.__name__ for r in aot.record_launches(
        lambda: moe_experts.moe_experts_fwd(*args)
    )}
    grouped = tokens * top_k > experts
    assert ("_moe_up_grouped_kernel" in chosen) == grouped
    assert ("_moe_up_kernel" in chosen) == (not grouped)


@pytest.mark.parametrize(
    "dtype,form,block_k,block_w,dot16",
    [(torch.bfloat16, None, 64, 64, True), (torch.bfloat16, "int8-g32", 32, 64, True),
     (torch.float32, "int8", 16, 64, False), (torch.float32, "int8-g8", 16, 32, False)],
)
def test_moe_gpu_tiles(dtype, form, block_k, block_w, dot16):
    """The grouped GEMM's GPU meta-parameters (recorded, not run): 16-bit operands on tensor
    cores with steps inside a scale group, float32 16 inputs a step at 8 warps, and narrower
    up tiles where the weights are dequantised first (the tiles that do not spill at sm_90)."""
    args, scales = _moe_case(dtype, form, 37, 4, 2, True, 0)
    launches = {r[0].fn.__name__: r[3] for r in aot.record_launches(
        lambda: moe_experts.moe_experts_fwd(*args, **scales)
    )}
    up, down = launches["_moe_up_grouped_kernel"], launches["_moe_down_grouped_kernel"]
    assert (up["BLOCK_K"], up["BLOCK_W"], up["DOT16"], up["num_warps"]) == (
        block_k, block_w, dot16, 8
    )
    assert (down["DOT16"], down["num_warps"]) == (dot16, 8)


def test_moe_routing_groups_pairs_by_expert():
    """The routing pass alone: every valid pair once, sorted by expert, stable, and each
    expert's tiles where ``tile_ends`` says."""
    g = torch.Generator().manual_seed(3)
    tokens, top_k, experts, block_m = 37, 2, 5, 16
    index = torch.randint(-1, experts + 1, (tokens, top_k), generator=g)
    i32 = dict(dtype=torch.int32)
    order, starts = torch.full((tokens * top_k,), -1, **i32), torch.empty(experts, **i32)
    counts, tile_ends = torch.empty(experts, **i32), torch.empty(experts, **i32)
    moe_experts.launch(moe_experts._moe_route_kernel, (1,))(
        index, order, starts, counts, tile_ends, tokens * top_k, experts, top_k, *index.stride(),
        BLOCK=16, BLOCK_E=8, BLOCK_M=block_m, num_warps=1,
    )
    flat = index.reshape(-1)
    valid = (flat >= 0) & (flat < experts)
    expected_counts = torch.bincount(flat[valid], minlength=experts)
    assert counts.tolist() == expected_counts.tolist()
    assert starts.tolist() == (torch.cumsum(expected_counts, 0) - expected_counts).tolist()
    assert tile_ends.tolist() == torch.cumsum(-(-expected_counts // block_m), 0).tolist()
    placed = order[: int(valid.sum())]
    assert placed.tolist() == torch.argsort(flat.masked_fill(~valid, experts),
                                            stable=True)[: int(valid.sum())].tolist()
