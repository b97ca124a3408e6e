"""Shape rules shared by the ssmcc op references and fake implementations.

Every check goes through ``torch._check`` so it works on concrete and symbolic sizes alike and
raises a message that names the op, the argument and the shapes involved.
"""

from __future__ import annotations

import torch
from torch import Tensor


def expect(condition, op: str, message: str) -> None:
    """Fail with ``ssmcc.<op>: <message>`` unless ``condition`` holds (concrete or symbolic)."""
    torch._check(condition, lambda: f"ssmcc.{op}: {message}")


def expect_real_float(op: str, name: str, tensor: Tensor) -> None:
    """A real floating-point tensor: an integer tensor has no meaning here and a complex one
    would lose its imaginary part in the float32 computation, so both are refused."""
    expect(
        tensor.dtype.is_floating_point,
        op,
        f"{name} must be a real floating-point tensor (float32, bfloat16, float16, float64), "
        f"got dtype {tensor.dtype}",
    )


def expect_rank(op: str, name: str, tensor: Tensor, ranks: tuple[int, ...], layout: str) -> None:
    expect_real_float(op, name, tensor)
    expect(
        tensor.dim() in ranks,
        op,
        f"{name} must have shape {layout}, got rank {tensor.dim()} {tuple(tensor.shape)}",
    )


def expect_vector(op: str, name: str, tensor: Tensor | None, dim, axis: str = "dim") -> None:
    """An optional vector of length ``dim``, one entry per channel (or per head: ``axis``)."""
    if tensor is None:
        return
    expect_rank(op, name, tensor, (1,), f"({axis},)")
    expect(
        tensor.shape[0] == dim, op, f"{name} has length {tensor.shape[0]}, expected {axis}={dim}"
    )


def expect_same_shape(op: str, name: str, tensor: Tensor | None, shape, layout: str) -> None:
    if tensor is None:
        return
    expect_real_float(op, name, tensor)
    expect(
        tensor.dim() == len(shape)
        and all(a == b for a, b in zip(tensor.shape, shape, strict=False)),
        op,
        f"{name} must have shape {layout} = {tuple(shape)}, got {tuple(tensor.shape)}",
    )


def expect_groups(op: str, name: str, tensor: Tensor, batch, dim, state, grouped_rank: int) -> None:
    """B or C: shared by all channels (rank ``grouped_rank - 1``: ``(batch, state, ...)``) or
    grouped (rank ``grouped_rank``: ``(batch, groups, state, ...)``, groups dividing ``dim``)."""
    expect_rank(
        op,
        name,
        tensor,
        (grouped_rank - 1, grouped_rank),
        "(batch, state, ...) or (batch, groups, state, ...)",
    )
    expect(tensor.shape[0] == batch, op, f"{name} has batch {tensor.shape[0]}, expected {batch}")
    state_axis = 1
    if tensor.dim() == grouped_rank:
        groups = tensor.shape[1]
        expect(
            dim % groups == 0, op, f"{name} has {groups} groups, which does not divide dim={dim}"
        )
        state_axis = 2
    expect(
        tensor.shape[state_axis] == state,
        op,
        f"{name} has state size {tensor.shape[state_axis]}, expected {state} (from A)",
    )


def expand_groups(tensor: Tensor, dim: int, grouped_rank: int) -> Tensor:
    """Broadcast B/C to one copy per channel.

    ``(b, n, ...)`` -> ``(b, 1, n, ...)`` (shared by every channel) and
    ``(b, g, n, ...)`` -> ``(b, dim, n, ...)`` (channel c uses group ``c // (dim // g)``).
    """
    if tensor.dim() == grouped_rank:
        return tensor.repeat_interleave(dim // tensor.shape[1], dim=1)
    return tensor.unsqueeze(1)
