"""The captured decode's attention over K/V pools (``kernels/triton/kv_pool.py``) in Triton's
interpreter, against ``ssmcc.attention``'s reference given each row's slot as its past.

Odd shapes (head dims 5 and 19, GQA 4:1 and 3:3, a value dim unlike the key's), lengths 0 to
capacity - 1 in one batch (a row at the last position a pool holds), a padding row (slot -1),
float32 and float16 (float32 pools beside float16 queries too); the pools change only at each live
row's slot and length, the lengths not at all; the per-slot counters read and advance only the
live rows' slots; bad arguments are one-line errors naming the op.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton", reason='Triton is an optional extra: pip install ".[triton]"')

from ssmcc.kernels.triton.kv_pool import (  # noqa: E402
    advance_counts,
    attention_pool_step_fwd,
    positions_pool_fwd,
)
from ssmcc.ops.attention import attention_ref  # noqa: E402

F32 = dict(rtol=6e-4, atol=2e-3)
F16 = dict(rtol=3e-3, atol=5e-3)

# (heads, kv_heads, head_dim, value_dim, capacity)
CASES = [(4, 1, 5, 5, 37), (3, 3, 19, 13, 20), (8, 2, 16, 16, 64)]


def _pools(case, dtype, pool_dtype, seed):
    heads, kv_heads, head_dim, value_dim, capacity = case
    g = torch.Generator().manual_seed(seed)
    slots = 6
    key_pool = torch.randn(slots, kv_heads, capacity, head_dim, generator=g).to(pool_dtype)
    value_pool = torch.randn(slots, kv_heads, capacity, value_dim, generator=g).to(pool_dtype)
    lengths = torch.tensor([3, 0, capacity - 1, 11, 7, 1], dtype=torch.int32)
    state_indices = torch.tensor([2, 5, -1, 1, 4], dtype=torch.int32)  # row 2: padding
    batch = state_indices.shape[0]
    query = torch.randn(batch, heads, 1, head_dim, generator=g).to(dtype)
    key = torch.randn(batch, kv_heads, 1, head_dim, generator=g).to(dtype)
    value = torch.randn(batch, kv_heads, 1, value_dim, generator=g).to(dtype)
    return query, key, value, key_pool, value_pool, lengths, state_indices


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize(
    "dtype,pool_dtype",
    [(torch.float32, torch.float32), (torch.float16, torch.float16),
     (torch.float16, torch.float32)],
)
def test_attention_over_pools_matches_the_reference_per_row(case, dtype, pool_dtype):
    query, key, value, key_pool, value_pool, lengths, slots = _pools(case, dtype, pool_dtype, 3)
    before = key_pool.clone(), value_pool.clone(), lengths.clone()
    scale = case[2] ** -0.5
    (out,) = attention_pool_step_fwd(query, key, value, scale, key_pool, value_pool, lengths,
                                     slots)
    assert out.shape == (5, case[0], 1, case[3]) and out.dtype == dtype
    assert torch.equal(lengths, before[2])
    tolerance = F32 if dtype == pool_dtype == torch.float32 else F16
    expected_keys, expected_values = before[0].clone(), before[1].clone()
    for row, slot in enumerate(slots.tolist()):
        if slot < 0:
            assert not out[row].any()
            continue
        t = int(lengths[slot])
        past_key = before[0][slot : slot + 1, :, :t].to(dtype)
        past_value = before[1][slot : slot + 1, :, :t].to(dtype)
        want, _, _ = attention_ref(query[row : row + 1], key[row : row + 1],
                                   value[row : row + 1], scale, past_key, past_value)
        torch.testing.assert_close(out[row : row + 1].float(), want.float(), **tolerance)
        expected_keys[slot, :, t] = key[row, :, 0].to(pool_dtype)
        expected_values[slot, :, t] = value[row, :, 0].to(pool_dtype)
    assert torch.equal(key_pool, expected_keys)  # only the live rows' (slot, length) written
    assert torch.equal(value_pool, expected_values)


def test_a_step_after_a_step_continues_the_sequence():
    """Two pooled steps with the lengths advanced between them equal one call of the reference
    with both new positions (the second seeing the first)."""
    case = CASES[2]
    query, key, value, key_pool, value_pool, lengths, slots = _pools(case, torch.float32,
                                                                     torch.float32, 5)
    lengths[2] -= 1  # its second position is the pool's last
    live = slots[slots >= 0]
    start = lengths.clone()
    scale = 0.25
    g = torch.Generator().manual_seed(9)
    second = [torch.randn(t.shape, generator=g) for t in (query, key, value)]
    original = key_pool.clone(), value_pool.clone()
    attention_pool_step_fwd(query, key, value, scale, key_pool, value_pool, lengths, slots)
    advance_counts(lengths, slots)
    assert torch.equal(lengths[live], start[live] + 1)
    (out,) = attention_pool_step_fwd(*second, scale, key_pool, value_pool, lengths, slots)
    for row, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        t = int(start[slot])
        want, _, _ = attention_ref(
            torch.cat([query[row : row + 1], second[0][row : row + 1]], 2),
            torch.cat([key[row : row + 1], second[1][row : row + 1]], 2),
            torch.cat([value[row : row + 1], second[2][row : row + 1]], 2),
            scale, original[0][slot : slot + 1, :, :t], original[1][slot : slot + 1, :, :t],
        )
        torch.testing.assert_close(out[row], want[0, :, 1:], **F32)


def test_counters_read_and_advance_only_live_slots():
    counts = torch.tensor([[4], [0], [9], [2]], dtype=torch.int64)
    slots = torch.tensor([2, -1, 0], dtype=torch.int32)
    (positions,) = positions_pool_fwd(torch.zeros(3, 1, dtype=torch.int64), counts, slots)
    assert positions.tolist() == [[9], [0], [4]]
    assert counts[:, 0].tolist() == [5, 0, 10, 2]
    lengths = torch.tensor([1, 2, 3], dtype=torch.int32)
    advance_counts(lengths, torch.tensor([-1, 1], dtype=torch.int64))
    assert lengths.tolist() == [1, 3, 3]


def test_bad_pool_arguments_are_one_line_errors():
    query, key, value, key_pool, value_pool, lengths, slots = _pools(CASES[0], torch.float32,
                                                                     torch.float32, 1)
    bad = [
        ((query.expand(5, 4, 2, 5), key, value, 1.0, key_pool, value_pool, lengths, slots),
         "one new position"),
        ((query, key, value, 1.0, key_pool, value_pool, lengths.long(), slots), "lengths"),
        ((query, key, value, 1.0, key_pool, value_pool, lengths, slots[:2]), "state_indices"),
        ((query, key, value, 1.0, key_pool[:, :, :, :4], value_pool, lengths, slots), "fit"),
    ]
    for args, words in bad:
        with pytest.raises(RuntimeError, match=words) as caught:
            attention_pool_step_fwd(*args)
        assert "\n" not in str(caught.value)
        assert str(caught.value).startswith("ssmcc.attention (K/V pools): ")


def test_pool_kernels_build_for_sm90_without_spills():
    """Every specialisation the pooled launchers make at granite-hybrid-200m's attention (12
    heads, 4 K/V heads of 64), batch 1 and 64, a 2,048-position pool, float32 and bfloat16
    (recorded with the GPU's meta-parameters, not run), compiled for sm_90: no spills."""
    from ssmcc.kernels.triton import aot

    from .test_triton_mixer_steps import _ptxas_report

    found = {}
    for batch in (1, 64):
        for dtype in (torch.float32, torch.bfloat16):
            slots = torch.arange(batch, dtype=torch.int32)
            key_pool = torch.zeros(batch, 4, 2048, 64, dtype=dtype)
            query = torch.zeros(batch, 12, 1, 64, dtype=dtype)
            new = torch.zeros(batch, 4, 1, 64, dtype=dtype)
            lengths = torch.zeros(batch, dtype=torch.int32)

            def run(q=query, n=new, pool=key_pool, lengths=lengths, slots=slots):
                attention_pool_step_fwd(q, n, n, 0.125, pool, pool, lengths, slots)
                advance_counts(lengths, slots)
                positions_pool_fwd(slots[:, None].long(), lengths[:, None].long(), slots)

            for launch in aot.record_launches(run):
                spec = aot.specialization(*launch)
                found.setdefault(spec.key, spec)
    kernels = aot._jit_functions()
    assert {s.kernel for s in found.values()} == {
        "_kv_pool_write_kernel", "_kv_pool_split_kernel", "_attention_combine_kernel",
        "_count_kernel",
    }
    for spec in found.values():
        registers, spills = _ptxas_report(aot._compile(spec, 90, kernels).asm["ptx"])
        assert spills == 0 and registers <= 255, (spec.kernel, registers, spills)
