"""Your own Mamba block: its scan found by structure, compiled to ONNX with ssmcc's kernels.

    python examples/own_mamba_block.py

The block below writes its selective scan as a plain Python loop over time, the way a reference
implementation does. ``torch.export`` unrolls the loop at the example's length; the pass
``detect_selective_scan`` re-rolls it into one ``ssmcc.selective_scan`` (the softplus, the D skip
and the silu gate folded in), so the ONNX graph holds one ssmcc node instead of a node per token
and step. A recurrence that only looks like a scan is left alone, and the report says why.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

import ssmcc


class MyMixer(nn.Module):
    def __init__(self, dim=64, state=16, recurrence="scan"):
        super().__init__()
        inner, self.rank, self.state, self.recurrence = (
            2 * dim,
            math.ceil(dim / 16),
            state,
            recurrence,
        )
        self.in_proj = nn.Linear(dim, 2 * inner, bias=False)
        self.x_proj = nn.Linear(inner, self.rank + 2 * state, bias=False)
        self.dt_proj = nn.Linear(self.rank, inner)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, state + 1.0).repeat(inner, 1)))
        self.D = nn.Parameter(torch.ones(inner))
        self.out_proj = nn.Linear(inner, dim, bias=False)

    def forward(self, x):  # (batch, length, dim)
        u, z = self.in_proj(x).chunk(2, dim=-1)  # (b, l, inner)
        dt, B, C = self.x_proj(u).split([self.rank, self.state, self.state], dim=-1)
        dt = F.softplus(self.dt_proj(dt))
        A = -torch.exp(self.A_log)
        h = x.new_zeros(x.shape[0], u.shape[-1], self.state)
        ys = []
        for t in range(x.shape[1]):
            update = (
                torch.exp(dt[:, t, :, None] * A) * h
                + (dt[:, t] * u[:, t])[..., None] * B[:, t, None, :]
            )
            h = torch.tanh(update) if self.recurrence == "tanh" else update
            ys.append((h * C[:, t, None, :]).sum(-1))
        y = torch.stack(ys, dim=1) + u * self.D
        return self.out_proj(y * F.silu(z))


def main() -> None:
    torch.manual_seed(0)
    block = MyMixer().eval()
    x = torch.randn(1, 64, 64)
    compiled = ssmcc.compile(block, target="onnx", example_inputs=(x,))
    report = compiled.report
    print(f"graph nodes: {report.capture.node_count} exported -> {report.node_count} compiled")
    print(f"ssmcc ops:   {report.op_counts}")
    print(f"rule hits:   {report.rule_hits}")
    with torch.no_grad():
        print(f"max |onnx - eager| = {(compiled(x) - block(x)).abs().max():.2e}")

    look_alike = MyMixer(recurrence="tanh").eval()
    compiled = ssmcc.compile(look_alike, target="torch", example_inputs=(x[:, :8],))
    print("not rewritten:", *compiled.report.findings, sep="\n  ")


if __name__ == "__main__":
    main()
