"""Hand-written Mamba-1 block stacks (not the Hugging Face classes) whose selective scan is spelled
out in one of the forms ``detect_selective_scan`` reads, plus look-alikes that are not scans.

``MambaStack(scan=...)``: embedding -> ``layers`` x (RMSNorm -> mixer, residual) -> norm -> head.
The mixer is Mamba-1 (in_proj, causal depthwise conv, x_proj, dt_proj, softplus, scan, D skip,
silu gate, out_proj); only the scan differs:

- ``"loop"``: per-step decay computed inside the loop, h updated as ``h * a + b``, readout as a sum
  (the style of a reference implementation);
- ``"loop_einsum"``: mamba_ssm's ``selective_scan_ref`` style (precomputed einsums, einsum readout);
- ``"scan_op"``: torch's ``scan`` higher-order op over time-major inputs;
- ``"pscan"``: mamba.py's parallel ``pscan`` on (B, L, D, N) tensors, readout by matmul.

``"tanh"``, ``"mixing"`` and ``"alternating"`` are recurrences that are not selective scans.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

FORMS = ("loop", "loop_einsum", "scan_op", "pscan")
NOT_SCANS = ("tanh", "mixing", "alternating")


def scan_loop(u, dt, A, B, C):
    """u, dt (b, d, l); A (d, n); B, C (b, n, l) -> y (b, d, l)."""
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        a = torch.exp(dt[:, :, t].unsqueeze(-1) * A)
        h = h * a + (dt[:, :, t] * u[:, :, t]).unsqueeze(-1) * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return torch.stack(ys, dim=-1)


def scan_loop_einsum(u, dt, A, B, C):
    delta_a = torch.exp(torch.einsum("bdl,dn->bdln", dt, A))
    delta_b_u = torch.einsum("bdl,bnl,bdl->bdln", dt, B, u)
    x = A.new_zeros((u.shape[0], u.shape[1], A.shape[1]))
    ys = []
    for i in range(u.shape[2]):
        x = delta_a[:, :, i] * x + delta_b_u[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", x, C[:, :, i]))
    return torch.stack(ys, dim=2)


def scan_op(u, dt, A, B, C):
    from torch._higher_order_ops.scan import scan

    def step(h, xs):
        u_t, dt_t, B_t, C_t = xs
        h = torch.exp(dt_t[..., None] * A) * h + (dt_t * u_t)[..., None] * B_t[:, None, :]
        return h, torch.matmul(h, C_t[..., None])[..., 0]

    h0 = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    time_major = [x.permute(2, 0, 1) for x in (u, dt, B, C)]
    _, ys = scan(step, h0, time_major)
    return ys.permute(1, 2, 0)


def scan_pscan(u, dt, A, B, C):
    from mambapy.pscan import pscan

    x, delta = u.transpose(1, 2), dt.transpose(1, 2)  # (b, l, d)
    delta_a = torch.exp(delta.unsqueeze(-1) * A)  # (b, l, d, n)
    bx = delta.unsqueeze(-1) * B.transpose(1, 2).unsqueeze(2) * x.unsqueeze(-1)
    hs = pscan(delta_a, bx)
    return (hs @ C.transpose(1, 2).unsqueeze(-1)).squeeze(3).transpose(1, 2)


def not_scan_tanh(u, dt, A, B, C):
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        a = torch.exp(dt[:, :, t].unsqueeze(-1) * A)
        h = torch.tanh(a * h + (dt[:, :, t] * u[:, :, t]).unsqueeze(-1) * B[:, None, :, t])
        ys.append((h * C[:, None, :, t]).sum(-1))
    return torch.stack(ys, dim=-1)


def not_scan_mixing(u, dt, A, B, C, W=None):
    n = A.shape[1]
    W = torch.eye(n, dtype=u.dtype) * 0.9 if W is None else W
    h = u.new_zeros(u.shape[0], u.shape[1], n)
    ys = []
    for t in range(u.shape[2]):
        h = h @ W + (dt[:, :, t] * u[:, :, t]).unsqueeze(-1) * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return torch.stack(ys, dim=-1)


def not_scan_alternating(u, dt, A, B, C):
    h = u.new_zeros(u.shape[0], u.shape[1], A.shape[1])
    ys = []
    for t in range(u.shape[2]):
        rate = dt[:, :, t].unsqueeze(-1) * A
        a = torch.exp(rate) if t % 2 == 0 else torch.sigmoid(rate)
        h = a * h + (dt[:, :, t] * u[:, :, t]).unsqueeze(-1) * B[:, None, :, t]
        ys.append((h * C[:, None, :, t]).sum(-1))
    return torch.stack(ys, dim=-1)


SCANS = {
    "loop": scan_loop,
    "loop_einsum": scan_loop_einsum,
    "scan_op": scan_op,
    "pscan": scan_pscan,
    "tanh": not_scan_tanh,
    "mixing": not_scan_mixing,
    "alternating": not_scan_alternating,
}


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-5):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Mixer(nn.Module):
    def __init__(self, d_model: int, d_state: int, d_conv: int, expand: int, scan: str):
        super().__init__()
        d_inner = expand * d_model
        self.dt_rank, self.d_state, self.scan = math.ceil(d_model / 16), d_state, scan
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.conv1d = nn.Conv1d(d_inner, d_inner, d_conv, groups=d_inner, padding=d_conv - 1)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        A = torch.arange(1, d_state + 1, dtype=torch.float32).repeat(d_inner, 1)
        self.A_log = nn.Parameter(torch.log(A))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)
        with torch.no_grad():
            self.dt_proj.bias.copy_(torch.empty(d_inner).uniform_(-4.0, -2.0))

    def forward(self, hidden):  # (b, l, d_model)
        length = hidden.shape[1]
        x, z = self.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)  # (b, d, l) each
        x = F.silu(self.conv1d(x)[..., :length])
        dt, B, C = torch.split(
            self.x_proj(x.transpose(1, 2)), [self.dt_rank, self.d_state, self.d_state], dim=-1
        )
        dt = F.softplus(self.dt_proj(dt)).transpose(1, 2)  # (b, d, l)
        A = -torch.exp(self.A_log)
        y = SCANS[self.scan](x, dt, A, B.transpose(1, 2), C.transpose(1, 2))
        y = y + x * self.D[:, None]
        y = y * F.silu(z)
        return self.out_proj(y.transpose(1, 2))


class MambaStack(nn.Module):
    """A small Mamba-1 language model; ``scan`` picks how each mixer spells its scan."""

    def __init__(
        self,
        scan: str = "loop",
        vocab: int = 64,
        d_model: int = 32,
        layers: int = 2,
        d_state: int = 8,
        d_conv: int = 4,
        expand: int = 2,
    ):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(
            nn.ModuleDict(
                {"norm": RMSNorm(d_model), "mixer": Mixer(d_model, d_state, d_conv, expand, scan)}
            )
            for _ in range(layers)
        )
        self.norm_f = RMSNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, input_ids):
        hidden = self.embedding(input_ids)
        for layer in self.layers:
            hidden = hidden + layer["mixer"](layer["norm"](hidden))
        return self.lm_head(self.norm_f(hidden))


def build(scan: str, seed: int = 0, **sizes) -> MambaStack:
    torch.manual_seed(seed)
    return MambaStack(scan, **sizes).eval()
