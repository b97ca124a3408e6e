"""Hand-written Mamba-2 (SSD) block stacks (not the Hugging Face classes) whose scan is spelled
out in a form ``detect_selective_scan`` reads, plus look-alikes that are not SSD scans.

``SsdStack(scan=...)``: embedding -> ``layers`` x (RMSNorm -> mixer, residual) -> norm -> head.
The mixer: in_proj to x, B, C, dt; softplus(dt + bias); the scan; D skip; out_proj. Scans:

- ``"loop"``: a per-step loop in head layout, ``h = exp(dt A) h + dt x ⊗ B``, ``y = h · C``
  (B and C shared by all heads: one group);
- ``"chunked"``: mamba_ssm's ``ssd_minimal`` block decomposition written with einsums (segment
  sums, intra-chunk outputs, chunk states, inter-chunk pass), chunk 8, at a length that is a
  multiple of the chunk;
- look-alikes: ``"loop_sigmoid"`` (decay ``sigmoid(dt A)``), ``"chunked_squared"`` (exponent
  ``dt² A``), ``"chunked_no_carry"`` (the chunked form without the inter-chunk pass: each chunk
  starts from zero, so its boundary looks right and only the identity check tells).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

FORMS = ("loop", "chunked")
NOT_SCANS = ("loop_sigmoid", "chunked_squared", "chunked_no_carry")
CHUNK = 8


def ssd_loop(x, dt, A, B, C, decay=torch.exp):
    """x (b, l, h, p), dt (b, l, h), A (h,), B, C (b, l, n) -> y (b, l, h, p)."""
    b, length, heads, p = x.shape
    h = x.new_zeros(b, heads, p, B.shape[-1])
    ys = []
    for t in range(length):
        a = decay(dt[:, t] * A)  # (b, h)
        h = a[:, :, None, None] * h + (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, None, None]
        ys.append((h * C[:, t, None, None]).sum(-1))
    return torch.stack(ys, dim=1)


def _segsum(a):
    """a (..., k) -> (..., k, k): sum of a over (j, i] below the diagonal, -inf above."""
    k = a.shape[-1]
    a = a[..., None].expand(*a.shape, k)
    a = a.masked_fill(~torch.tril(torch.ones(k, k, dtype=torch.bool), -1), 0)
    s = torch.cumsum(a, dim=-2)
    return s.masked_fill(~torch.tril(torch.ones(k, k, dtype=torch.bool), 0), -torch.inf)


def ssd_chunked(x, dt, A, B, C, squared=False, carry=True):
    """The same recurrence by blocks of ``CHUNK`` (length a multiple of it)."""
    b, length, heads, p = x.shape
    c = length // CHUNK
    X = (x * dt[..., None]).reshape(b, c, CHUNK, heads, p)
    step = dt * dt if squared else dt
    Adt = (A * step).reshape(b, c, CHUNK, heads).permute(0, 3, 1, 2)  # (b, h, c, k)
    Bc = B[:, :, None].expand(b, length, heads, B.shape[-1]).reshape(b, c, CHUNK, heads, -1)
    Cc = C[:, :, None].expand(b, length, heads, C.shape[-1]).reshape(b, c, CHUNK, heads, -1)
    A_cumsum = torch.cumsum(Adt, dim=-1)
    L = torch.exp(_segsum(Adt))
    Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Cc, Bc, L, X)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, decay_states, X)
    states = torch.cat([torch.zeros_like(states[:, :1]), states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)[:, :-1]
    Y_off = torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, states, torch.exp(A_cumsum))
    if not carry:
        Y_off = Y_off * 0.0
    return (Y_diag + Y_off).reshape(b, length, heads, p)


class SsdMixer(nn.Module):
    def __init__(self, d_model: int, heads: int, head_dim: int, state: int, scan: str):
        super().__init__()
        self.heads, self.head_dim, self.state, self.scan = heads, head_dim, state, scan
        self.in_proj = nn.Linear(d_model, heads * head_dim + 2 * state + heads, bias=False)
        self.dt_bias = nn.Parameter(torch.rand(heads) - 0.5)
        self.A_log = nn.Parameter(torch.rand(heads))
        self.D = nn.Parameter(torch.randn(heads))
        self.out_proj = nn.Linear(heads * head_dim, d_model, bias=False)

    def forward(self, u):
        b, length, _ = u.shape
        x, B, C, dt = self.in_proj(u).split(
            [self.heads * self.head_dim, self.state, self.state, self.heads], dim=-1
        )
        x = x.reshape(b, length, self.heads, self.head_dim)
        dt = F.softplus(dt + self.dt_bias)
        A = -torch.exp(self.A_log)
        if self.scan.startswith("loop"):
            decay = torch.sigmoid if self.scan == "loop_sigmoid" else torch.exp
            y = ssd_loop(x, dt, A, B, C, decay)
        else:
            squared, carry = self.scan == "chunked_squared", self.scan != "chunked_no_carry"
            y = ssd_chunked(x, dt, A, B, C, squared=squared, carry=carry)
        y = y + self.D[:, None] * x
        return self.out_proj(y.reshape(b, length, -1))


class SsdStack(nn.Module):
    def __init__(self, scan: str, layers: int = 2, vocab: int = 64, d_model: int = 16):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(layers))
        self.mixers = nn.ModuleList(SsdMixer(d_model, 4, 6, 5, scan) for _ in range(layers))
        self.norm_f = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, input_ids):
        hidden = self.embedding(input_ids)
        for norm, mixer in zip(self.norms, self.mixers, strict=True):
            hidden = hidden + mixer(norm(hidden))
        return self.head(self.norm_f(hidden))


def build(scan: str, layers: int = 2, seed: int = 0) -> SsdStack:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return SsdStack(scan, layers).eval()
