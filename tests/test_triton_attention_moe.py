"""Attention's split-key decode and prefill (``kernels/triton/attention.py``) against the op's
reference, in Triton's interpreter.

Attention: caches of 0, 1, 37 and 130 positions, GQA ratios 1, 2 and 4, head dims 8 and 19, one
query position and a few, so that the interpreter's small key blocks give several splits and a
partial last block (checked on the recorded grid); the prefill path with a cache and GQA 4.
Tolerances: fuzzing.py's (mamba_ssm's scan tolerances) by output dtype. The GPU tiles the
launcher picks by dtype and head dim are checked on recorded launches (their register use at
sm_90 is ``test_triton_aot.py``'s slow spill test).
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton import aot, attention, configs, runtime  # noqa: E402
from ssmcc.ops import SSMCC_REFERENCES  # noqa: E402

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
