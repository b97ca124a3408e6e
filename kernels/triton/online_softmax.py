"""Device function of the attention kernels (``attention.py``): the online-softmax update over a
span of keys, shared by flash attention (prefill) and the split-key decode. Kernels reach it
through the module (``online_softmax.attend_keys``), so it is no kernel of the calling module.

For query rows q_r, keys K_j and values V_j of one K/V head, with a running maximum ``m``,
normaliser ``n`` and weighted sum ``acc`` per row (float32)::

    s_rj = scale <q_r, K_j>                 (masked to -inf where row r cannot see key j)
    m'   = max(m, max_j s_rj)
    n'   = n e^(m - m') + sum_j e^(s_rj - m')
    acc' = acc e^(m - m') + sum_j e^(s_rj - m') V_j

so no score matrix is stored; a row that has seen nothing keeps m = -inf, n = 0.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_keys(
    q, m, norm, acc, k_base, v_base, start, end, last_key, rows_ok,
    head_dim, value_dim, s_kt, s_kd, s_vt, s_ve, scale,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, DOT16: tl.constexpr,
):
    """The online-softmax update of (m, n, acc) over keys ``start .. end-1`` of one K/V head
    (``k_base`` / ``v_base`` its first key), ``BLOCK_N`` at a time: row r of ``q`` sees key j when
    j <= ``last_key[r]`` and ``rows_ok[r]``. K^T and V tiles are read contiguous along the head dim;
    scores and sums are float32 (``DOT16``: 16-bit operands, the weights rounded to V's dtype)."""
    d = tl.arange(0, BLOCK_D)
    e = tl.arange(0, BLOCK_E)
    for j0 in range(start, end, BLOCK_N):
        j = j0 + tl.arange(0, BLOCK_N)
        kT = tl.load(k_base + j[None, :] * s_kt + d[:, None] * s_kd,
                     mask=(j[None, :] < end) & (d[:, None] < head_dim), other=0.0)
        if not DOT16:
            kT = kT.to(tl.float32)
        s = tl.dot(q, kT, input_precision="ieee") * scale
        seen = (j[None, :] <= last_key[:, None]) & (j[None, :] < end) & rows_ok[:, None]
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing seen yet
        p = tl.exp(s - m_safe[:, None])
        rescale = tl.exp(m - m_safe)
        norm = norm * rescale + tl.sum(p, axis=1)
        v = tl.load(v_base + j[:, None] * s_vt + e[None, :] * s_ve,
                    mask=(j[:, None] < end) & (e[None, :] < value_dim), other=0.0)
        if DOT16:
            pv = tl.dot(p.to(v.dtype), v)
        else:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        acc = acc * rescale[:, None] + pv
        m = m_new
    return m, norm, acc
