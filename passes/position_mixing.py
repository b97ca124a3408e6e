"""Which computations of a token program mix positions along the sequence (and so forbid a step).

The one-token step program derived from a prefill program is exact only if each position of the
prefill depends on earlier positions through state-carrying ops alone: ops with a state contract
(``ssmcc.ops.contracts``), whose state the step program carries. Anything else that combines
positions — attention (a matmul contracting the sequence, a softmax over it, scores pairing two
positions), a cumsum or a reduction over time, a convolution, pad, shift, flip or gather along
time, absolute positions (``arange`` over the length), the length used as a value — would make the
step silently wrong. ``position_mixing(program)`` lists every such node that an output depends on
(dead code changes nothing), with its module path.

Reading: the sequence symbol ``s`` is the size of dim 1 of the first user input (``input_ids``).
An axis of a tensor carries positions when its size expression contains ``s`` (so a flattened
``b*s`` axis does too). A node mixes positions when it reduces, contracts, normalises, reorders,
pads, selects or gathers along such an axis, pairs two of them, or is an op this module cannot
read (conservative: an unknown op on a tensor with positions is reported, never assumed safe).
"""

from __future__ import annotations

import dataclasses
import operator

import torch
from torch.export import ExportedProgram
from torch.fx import Node

from ssmcc.ops import is_ssmcc_op
from ssmcc.ops.contracts import bind_arguments, is_positionwise, state_contract
from ssmcc.passes.call_args import int_arg, list_arg, node_arg, nodes_arg, str_arg
from ssmcc.passes.dim_labels import is_full_slice
from ssmcc.passes.locations import module_path
from ssmcc.passes.rules import live_nodes

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True)
class MixingNode:
    node: str
    op: str
    module: str
    why: str

    def describe(self) -> str:
        where = f" in {self.module}" if self.module else ""
        return f"node {self.node} ({self.op}){where} {self.why}"


def _packets(*names: str) -> set:
    """The op packets of this torch build among ``names`` (a missing one is simply absent)."""
    return {getattr(aten, name) for name in names if hasattr(aten, name)}


# Joins of several tensors along one dim (``concatenate`` is ``cat``'s alias).
_JOINS = _packets("cat", "concatenate", "stack")

# Layout and dtype changes: each output element is one input element of the same position.
_LAYOUT = _packets(
    "view",
    "reshape",
    "_unsafe_view",
    "permute",
    "transpose",
    "t",
    "unsqueeze",
    "squeeze",
    "expand",
    "clone",
    "contiguous",
    "alias",
    "_to_copy",
    "to",
    "detach",
    "lift_fresh_copy",
    "view_as",
    "flatten",
    "unflatten",
    "movedim",
    "type_as",
    "masked_fill",
    "where",
    "embedding",
    "new_zeros",
    "new_ones",
    "new_empty",
    "zeros",
    "ones",
    "empty",
    "full",
    "new_full",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "scalar_tensor",
    "_assert_tensor_metadata",
    "_assert_scalar",
    "sym_size",
    "sym_numel",
    "sym_stride",
    "dropout",
    "native_dropout",
    "_native_batch_norm_legit_no_training",
)
_ALONG_DIM = _packets(  # its ``dim`` argument carries positions: mixes
    "_softmax",
    "_log_softmax",
    "softmax",
    "log_softmax",
    "cumsum",
    "cumprod",
    "cummax",
    "cummin",
    "logcumsumexp",
    "sort",
    "argsort",
    "topk",
    "select",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "scatter_reduce",
    "index_add",
    "index_copy",
    "narrow",
    "split",
    "split_with_sizes",
    "chunk",
    "unbind",
    "argmax",
    "argmin",
    "kthvalue",
    "median",
    "mode",
)
_REDUCTIONS = _packets(  # a reduced ``dim`` (None: every dim) carries positions: mixes
    "sum",
    "mean",
    "amax",
    "amin",
    "var",
    "std",
    "prod",
    "any",
    "all",
    "logsumexp",
    "max",
    "min",
    "norm",
    "linalg_vector_norm",
    "var_mean",
    "std_mean",
    "nansum",
)
_ATTENTION = _packets(
    "scaled_dot_product_attention",
    "_scaled_dot_product_attention_math",
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_cudnn_attention",
)
_CONTRACTIONS = _packets("mm", "bmm", "matmul", "linear", "addmm", "baddbmm", "mv", "dot")
_CONVOLUTIONS = _packets("convolution", "conv1d", "conv2d", "conv3d", "_convolution")
_LAST_DIMS_NORMS = _packets("native_layer_norm", "layer_norm", "rms_norm", "_fused_rms_norm")
_SYM_OPS = {
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv,
    operator.mod, operator.neg, operator.pow, operator.eq, operator.ne, operator.lt,
    operator.le, operator.gt, operator.ge, operator.getitem, torch.sym_float, torch.sym_int,
    torch.sym_max, torch.sym_min, torch.sym_not, torch.sym_ite,
}  # fmt: skip


def _has_symbol(value, symbol) -> bool:
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return symbol in value.node.expr.free_symbols
    return False


def _position_axes(node, symbol) -> set[int]:
    value = node.meta.get("val") if isinstance(node, Node) else None
    if not isinstance(value, torch.Tensor):
        return set()
    return {axis for axis, size in enumerate(value.shape) if _has_symbol(size, symbol)}


def _dims(spec, rank: int) -> set[int] | None:
    """``dim``/``dims`` argument as a set of non-negative axes; None for "every axis"."""
    if spec is None or spec == []:
        return None
    spec = [spec] if isinstance(spec, int) else list(spec)
    return {d % rank if rank else 0 for d in spec}


def _rank(node) -> int:
    return node.meta["val"].dim()


def _reason(node: Node, symbol) -> str | None:
    """Why ``node`` mixes positions, or None when it does not."""
    target = node.target
    tensors = [a for a in node.all_input_nodes if _position_axes(a, symbol)]
    scalars = [
        a for a in node.args if isinstance(a, Node) and _has_symbol(a.meta.get("val"), symbol)
    ]
    if target in _SYM_OPS or not tensors and not scalars:
        return None
    packet = getattr(target, "overloadpacket", None)
    if packet is not None and packet.__name__.endswith(
        "_"
    ):  # in place: read as its functional form
        packet = getattr(aten, packet.__name__.rstrip("_"), packet)
    packet_name = "" if packet is None else packet.__name__
    paired_inputs = any(len(_position_axes(t, symbol)) > 1 for t in tensors)
    if len(_position_axes(node, symbol)) > 1 and not paired_inputs:
        return "pairs positions with positions (its result has two sequence axes)"
    if is_ssmcc_op(target):
        if state_contract(target) is not None or is_positionwise(target):
            return None
        return "is an ssmcc op with neither a state contract nor a position-wise declaration"
    if packet == aten.arange:
        return "makes absolute positions (arange over the sequence length)"
    if not tensors:
        if torch.Tag.pointwise in getattr(target, "tags", ()):
            return "uses the sequence length as a value"
        return None
    first = node.args[0] if node.args else None
    axes = _position_axes(first, symbol) if isinstance(first, Node) else set()
    if torch.Tag.pointwise in getattr(target, "tags", ()):
        return "uses the sequence length as a value" if scalars else None
    if packet in _LAYOUT:
        return None
    if packet in _ATTENTION:
        key = node.args[1] if len(node.args) > 1 else None
        return "attends over the sequence" if _position_axes(key, symbol) else None
    if packet in (aten.triu, aten.tril):
        last_two = {_rank(first) - 2, _rank(first) - 1}
        return "masks positions against positions" if last_two <= axes else None
    if packet == aten.slice:
        dim = int_arg(node, 1) % _rank(first) if len(node.args) > 1 else 0
        if dim in axes and not is_full_slice(node):
            return "slices the sequence (some positions read others' values)"
        return None
    if packet in _ALONG_DIM or packet in _REDUCTIONS:
        dims = _dims(bind_arguments(target, node.args, node.kwargs).get("dim"), _rank(first))
        if axes and (dims is None or dims & axes):
            verb = "reduces over" if packet in _REDUCTIONS else "works along"
            return f"{verb} the sequence axis ({packet_name} over dim {sorted(dims or axes)})"
        return None
    if packet in _CONTRACTIONS:
        left = node_arg(node, 1 if packet in (aten.addmm, aten.baddbmm) else 0)
        size = left.meta["val"].shape[-1]
        if _has_symbol(size, symbol):
            return f"contracts over the sequence ({packet_name})"
        return None
    if packet == aten.einsum:
        return _einsum_reason(node, symbol)
    if packet in _CONVOLUTIONS:
        weight = node_arg(node, 1).meta["val"]
        spatial = {a for a in axes if a >= 2}
        if spatial and any(int(k) > 1 for k in weight.shape[2:]):
            return "convolves along the sequence"
        return None
    if packet in _LAST_DIMS_NORMS:
        count = len(list_arg(node, 1))
        if any(a >= _rank(first) - count for a in axes):
            return "normalises over the sequence"
        return None
    if packet in _JOINS:
        axis = int_arg(node, 1) if len(node.args) > 1 else node.kwargs.get("dim", 0)
        rank = _rank(node) - 1 if packet == aten.stack else _rank(node)
        seqs = set().union(*(_position_axes(t, symbol) for t in nodes_arg(node, 0)))
        if isinstance(axis, int) and axis % max(rank, 1) in seqs:
            return f"joins along the sequence axis ({packet_name})"
        return None
    if packet == aten.constant_pad_nd:
        pads = list_arg(node, 1)
        padded = {_rank(first) - 1 - i // 2 for i, p in enumerate(pads) if p != 0}
        return "pads along the sequence" if padded & axes else None
    if packet in (aten.flip, aten.roll):
        dims = _dims(node.args[-1], _rank(first))
        return "reorders positions" if dims is None or dims & axes else None
    if packet == aten.index:
        indexed = {i for i, index in enumerate(list_arg(node, 1)) if index is not None}
        return "indexes positions by value" if indexed & axes else None
    name = getattr(target, "__name__", str(target))
    return (
        f"is {name}, which ssmcc cannot tell position-wise or not (reported rather than "
        "assumed safe)"
    )


def _einsum_reason(node: Node, symbol) -> str | None:
    equation, operands = str_arg(node, 0), nodes_arg(node, 1)
    inputs, output = equation.replace(" ", "").split("->")
    kept = set(output)
    for letters, operand in zip(inputs.split(","), operands, strict=False):
        for letter, size in zip(letters, operand.meta["val"].shape, strict=False):
            if letter not in kept and _has_symbol(size, symbol):
                return "contracts over the sequence (einsum)"
    return None


def sequence_symbol(program: ExportedProgram):
    """The symbol of the token program's length (dim 1 of its first user input), or None."""
    first = program.graph_signature.user_inputs[0] if program.graph_signature.user_inputs else None
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name == first:
            value = node.meta.get("val")
            if isinstance(value, torch.Tensor) and value.dim() >= 2:
                size = value.shape[1]
                if isinstance(size, torch.SymInt):
                    free = size.node.expr.free_symbols
                    return next(iter(free)) if len(free) == 1 else None
    return None


def position_mixing(program: ExportedProgram) -> list[MixingNode]:
    """Every node that mixes positions outside a state-carrying op and that an output depends
    on, in graph order."""
    symbol = sequence_symbol(program)
    if symbol is None:
        return []
    live = live_nodes(program.graph)
    found = []
    for node in program.graph.nodes:
        if node.op != "call_function" or node not in live:
            continue
        why = _reason(node, symbol)
        if why is not None:
            op = getattr(node.target, "__name__", str(node.target))
            if hasattr(node.target, "name") and callable(node.target.name):
                op = node.target.name()
            found.append(MixingNode(node.name, op, module_path(node), why))
    return found
