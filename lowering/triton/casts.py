"""16-bit programs without detours: the dtype casts a bfloat16/float16 program carries around its
float32 computations, folded into the Triton kernels that read and write 16-bit directly.

A program captured in 16-bit keeps the model's float32 islands as casts between kernels: Hugging
Face's Mamba blocks norm in float32 (``to(x, f32)`` in, ``to(y, bf16)`` out), keep the residual
stream in float32 (``residual_in_fp32``: ``to(embedding, f32)``) and round the residual to the
norm's dtype before widening it again (``to(to(residual, bf16), f32)``). Each widening cast is an
activation-sized float32 copy written by one kernel and read by the next. The kernels here load
any float dtype and convert in registers, and can store any dtype, so (bf16 standing for either
16-bit dtype; each rule gives the same bits as the casts, as widening is exact and the kernel
rounds the same float32 value once, on its store, as the cast did)::

    merge_casts         two casts of one tensor to one dtype          -> one
    embedding_widened   to(embedding(W bf16, ids), f32)              -> quantized_embedding_fwd
                                                                        (rows widened on load)
    norm_reads_16bit    rmsnorm_gated(to(x bf16, f32), to(z bf16, f32)) -> rmsnorm_gated(x, z,
                                                                        out_dtype=f32)
    norm_writes_16bit   to(rmsnorm_gated(...), bf16), its only reader  -> rmsnorm_gated(...,
                                                                        out_dtype=bf16)

and casts left without readers go. What stays: narrowing casts (``to(residual, bf16)``: half the
bytes, a rounding the model asks for), float32 results a kernel computes (the float32 residual
stream, the mixers' float32 intermediates and states, which their contracts keep float32) and the
program's outputs (logits widened to float32 as the model returns them). ``widening_casts`` lists
what is left between kernels (the tests assert it is empty).

Runs on the lowered module (node targets are the Triton launchers), before it moves to the device.
"""

from __future__ import annotations

import torch
from torch import fx

aten = torch.ops.aten
F32 = torch.float32
HALF = (torch.bfloat16, torch.float16)


def _cast(node: fx.Node) -> tuple[fx.Node, torch.dtype] | None:
    """(input, dtype) when ``node`` is a plain dtype cast (``to.dtype`` / ``_to_copy`` with a
    dtype and nothing else changed), else None."""
    if node.op != "call_function":
        return None
    if node.target is aten.to.dtype and len(node.args) >= 2:
        extra = list(node.args[2:]) + list(node.kwargs.values())
        if all(v in (None, False) for v in extra):
            return node.args[0], node.args[1]
    if node.target is aten._to_copy.default and len(node.args) == 1:
        kwargs = dict(node.kwargs)
        dtype = kwargs.pop("dtype", None)
        if dtype is not None and all(v is None for v in kwargs.values()):
            return node.args[0], dtype
    return None


def _dtype(node) -> torch.dtype | None:
    value = node.meta.get("val") if isinstance(node, fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def _is_norm(node: fx.Node) -> bool:
    from ssmcc.kernels.triton.rmsnorm_gated import rmsnorm_gated_fwd

    return node.op == "call_function" and node.target is rmsnorm_gated_fwd


def _set_dtype(node: fx.Node, dtype: torch.dtype) -> None:
    value = node.meta.get("val")
    if isinstance(value, torch.Tensor):
        node.meta["val"] = value.to(dtype)


def _merge_casts(graph: fx.Graph) -> int:
    hits, seen = 0, {}
    for node in list(graph.nodes):
        cast = _cast(node)
        if cast is None:
            continue
        key = (cast[0], cast[1])
        if key in seen:
            node.replace_all_uses_with(seen[key])
            graph.erase_node(node)
            hits += 1
        else:
            seen[key] = node
    return hits


def _embedding_widened(graph: fx.Graph) -> int:
    from ssmcc.kernels.triton.linear import quantized_embedding_fwd

    hits = 0
    for node in list(graph.nodes):
        cast = _cast(node)
        if cast is None or cast[1] != F32:
            continue
        source = cast[0]
        if not (
            isinstance(source, fx.Node)
            and source.target is aten.embedding.default
            and _dtype(source.args[0]) in HALF
        ):
            continue
        with graph.inserting_before(node):
            lookup = graph.call_function(quantized_embedding_fwd, (source.args[1], source.args[0]))
        lookup.meta = dict(node.meta)
        node.replace_all_uses_with(lookup)
        graph.erase_node(node)
        if not source.users:
            graph.erase_node(source)
        hits += 1
    return hits


def _widened(value):
    """The 16-bit tensor ``value`` widens, when it is a widening cast."""
    cast = _cast(value) if isinstance(value, fx.Node) else None
    if cast is not None and cast[1] == F32 and _dtype(cast[0]) in HALF:
        return cast[0]
    return None


def _norm_reads_16bit(graph: fx.Graph) -> int:
    hits = 0
    for node in list(graph.nodes):
        if not _is_norm(node):
            continue
        args = list(node.args)
        changed = False
        for i in (0, 1):  # x, z
            narrow = _widened(args[i]) if i < len(args) else None
            if narrow is not None:
                args[i], changed = narrow, True
        if changed:
            kwargs = dict(node.kwargs)
            kwargs.setdefault("out_dtype", _dtype(node) or F32)
            node.args, node.kwargs = tuple(args), kwargs
            hits += 1
    return hits


def _norm_writes_16bit(graph: fx.Graph) -> int:
    hits = 0
    for node in list(graph.nodes):
        cast = _cast(node)
        if cast is None or not isinstance(cast[0], fx.Node) or not _is_norm(cast[0]):
            continue
        norm, dtype = cast
        if len(norm.users) != 1 or not dtype.is_floating_point:
            continue
        norm.kwargs = {**norm.kwargs, "out_dtype": dtype}
        _set_dtype(norm, dtype)
        node.replace_all_uses_with(norm)
        graph.erase_node(node)
        hits += 1
    return hits


RULES = (
    ("merge_casts", _merge_casts),
    ("embedding_widened", _embedding_widened),
    ("norm_reads_16bit", _norm_reads_16bit),
    ("norm_writes_16bit", _norm_writes_16bit),
)


def fold_casts(module: fx.GraphModule) -> dict[str, int]:
    """Apply ``RULES`` to ``module`` in place (recompiled); returns the hits by rule name."""
    graph = module.graph
    hits = {name: rule(graph) for name, rule in RULES}
    for node in reversed(list(graph.nodes)):
        if _cast(node) is not None and not node.users:
            graph.erase_node(node)
    if any(hits.values()):
        graph.lint()
        module.recompile()
    return {name: count for name, count in hits.items() if count}


def widening_casts(module: fx.GraphModule) -> list[str]:
    """The nodes that widen a 16-bit tensor to a float32 copy read by another node (the
    program's outputs excluded): what ``fold_casts`` could not remove."""
    found = []
    for node in module.graph.nodes:
        if _widened(node) is None:
            continue
        if any(u.op != "output" and not _only_reaches_output(u) for u in node.users):
            found.append(node.name)
    return found


def _only_reaches_output(node: fx.Node) -> bool:
    """True when ``node`` is a view on the way to the program's output (the logits' select)."""
    views = (aten.select.int, aten.slice.Tensor, aten.view.default, aten.squeeze.dim)
    if node.target not in views:
        return False
    return all(u.op == "output" or _only_reaches_output(u) for u in node.users)
