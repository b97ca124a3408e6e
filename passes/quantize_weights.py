"""``quantize_weights`` — store the weights of linear layers and embeddings small (weight-only).

Option (``ctx.options["quantize_weights"]``): ``scheme``, a key of
``ssmcc.ops.quantized_linear.SCHEMES`` ("int8" per output channel, "int8-g32/64/128" per group of
inputs, "bf16", "fp16").

Rules:
- ``linear``: ``aten.linear(x, W, b)`` with ``W`` a 2-D floating weight of the program ->
  ``ssmcc.quantized_linear(x, Wq, scale, b)``.
- ``embedding``: ``aten.embedding(W, ids)`` -> ``ssmcc.quantized_embedding(ids, Wq, scale)``
  (cast back to W's dtype when that is not float32).
- ``experts``: ``ssmcc.moe_experts``'s ``up`` / ``down`` (E, n, k) -> each expert's matrix
  quantised as a linear weight, the call given ``up_scale`` / ``down_scale`` (E, n, G).
- ``mixer``: a fused Mamba-1 mixer's ``x_proj_weight`` / ``dt_proj_weight`` (``ssmcc.mamba_mixer``
  and ``mamba_mixer_step``) -> the stored weight, the call given ``x_proj_scale`` /
  ``dt_proj_scale`` (14% of mamba-130m's int8 bytes were these two, read every token). A group
  scheme whose group does not divide such a weight's columns (dt_proj's rank R: 48 at 130m)
  stores it int8 per output channel instead (``ctx.diagnostics["quantize_weights_notes"]``).
- ``tied``: a weight read by both (an LM head tied to the embedding) is quantised once; its rows
  are the head's output channels, so the one (Wq, scale) pair serves both.

A weight is kept as it is (reason in ``ctx.diagnostics["quantize_weights"]``) when anything else
reads it, when the scheme's group does not divide its columns, or when it is a router's (its
output reaches a ``topk``: a mixture-of-experts' choices stay those of the float model, as
llama.cpp keeps them). Math: the ops' docstrings; ``W`` is replaced by ``Wq * scale`` per group,
nothing else changes.
"""

from __future__ import annotations

import copy
from collections import Counter

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import (
    ExportGraphSignature,
    InputKind,
    InputSpec,
    TensorArgument,
)
from torch.fx import Node

from ssmcc.file_pages import release_file_pages
from ssmcc.ops.quantized_linear import SCHEMES, quantize_weight, scheme_applies
from ssmcc.passes.locations import location
from ssmcc.passes.pass_base import PassContext, PassResult
from ssmcc.passes.program import output_nodes
from ssmcc.passes.rules import fake_mode_of

aten = torch.ops.aten
WEIGHT_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)
ROUTER_HOPS = 3  # a router: linear -> (softmax | sigmoid | cast ...) -> topk


def _weights(program: ExportedProgram) -> dict[str, tuple[InputSpec, torch.Tensor]]:
    """Placeholder name -> (spec, tensor) for every weight the program reads."""
    found = {}
    for spec in program.graph_signature.input_specs:
        if spec.kind not in WEIGHT_KINDS or not hasattr(spec.arg, "name"):
            continue
        tensor = program.state_dict.get(spec.target, program.constants.get(spec.target))
        if isinstance(tensor, torch.Tensor):
            found[spec.arg.name] = (spec, tensor)
    return found


def _feeds_topk(node: Node, hops: int = ROUTER_HOPS) -> bool:
    if hops == 0:
        return False
    for user in node.users:
        if user.op == "call_function" and user.target == aten.topk.default:
            return True
        if _feeds_topk(user, hops - 1):
            return True
    return False


MOE_EXPERTS = torch.ops.ssmcc.moe_experts.default
EXPERT_SCALES = {3: "up_scale", 4: "down_scale"}  # moe_experts' weight argument -> its scale
MIXERS = (torch.ops.ssmcc.mamba_mixer.default, torch.ops.ssmcc.mamba_mixer_step.default)
MIXER_SCALES = {3: "x_proj_scale", 4: "dt_proj_scale"}  # a mixer's weight argument -> its scale
SCALED = {MOE_EXPERTS: ("experts", EXPERT_SCALES)} | {m: ("mixer", MIXER_SCALES) for m in MIXERS}


def _use_kind(user: Node, weight: Node) -> str | None:
    """``"linear"`` / ``"embedding"`` / ``"experts"`` / ``"mixer"`` when ``user`` reads
    ``weight`` as that op's weight, else None."""
    if user.op != "call_function":
        return None
    if user.target in SCALED:
        kind, scales = SCALED[user.target]
        slots = [i for i in scales if len(user.args) > i and user.args[i] is weight]
        kwarg = scales[slots[0]] if len(slots) == 1 else None
        skipped = slots[0] if slots else None
        others = [a for i, a in enumerate(user.args) if i != skipped]
        if kwarg and user.kwargs.get(kwarg) is None and weight not in others:
            return kind
        return None
    if user.target == aten.linear.default and len(user.args) >= 2 and user.args[1] is weight:
        if weight not in user.args[:1] + tuple(user.args[2:]) and not user.kwargs:
            return "linear"
    if user.target == aten.embedding.default and user.args[0] is weight:
        if len(user.args) < 3 or user.args[2] == -1:  # padding_idx matters only for gradients
            return "embedding"
    return None


def _why_kept(node: Node, tensor: torch.Tensor, scheme: str) -> str | None:
    """Why ``node`` (a float weight read by a linear, an embedding or experts) stays as it is."""
    if tensor.numel() == 0:
        return "it has no elements (a projection of width 0): nothing to store"
    kinds = {user: _use_kind(user, node) for user in node.users}
    others = [user for user, kind in kinds.items() if kind is None]
    if others:
        return f"also read by {others[0].target} at {location(others[0])}"
    if not scheme_applies(scheme, tensor.shape[-1]):
        group = SCHEMES[scheme][1]
        return f"its {tensor.shape[-1]} columns are not a multiple of the group size {group}"
    routers = [u for u, kind in kinds.items() if kind == "linear" and _feeds_topk(u)]
    if routers:
        return f"a router (its output chooses experts at {location(routers[0])}): kept exact"
    return None


def quantize_weights(program: ExportedProgram, ctx: PassContext) -> PassResult:
    scheme = ctx.options.get("quantize_weights", {}).get("scheme", "int8")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown quantization scheme {scheme!r}; known: {', '.join(SCHEMES)}")
    graph_module = program.graph_module
    graph = graph_module.graph
    weights = _weights(program)
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    fake_mode = fake_mode_of(graph)
    first_input = next(n for n in placeholders if n.name not in weights)
    hits: Counter = Counter()
    reasons = ctx.diagnostics.setdefault("quantize_weights", [])  # weights kept, and why
    notes = ctx.diagnostics.setdefault("quantize_weights_notes", [])  # stored otherwise, and why
    new_specs: dict[str, InputSpec] = {}
    state_dict = dict(program.state_dict)
    others: Counter = Counter()  # weights no linear or embedding reads: by op, bytes
    for node in placeholders:
        if node.name not in weights:
            continue
        spec, tensor = weights[node.name]
        if not tensor.dtype.is_floating_point:
            continue
        kinds = [_use_kind(user, node) for user in node.users]
        rank = 3 if "experts" in kinds else 2
        if tensor.dim() != rank or not any(kinds):
            reader = next(iter(node.users), None)
            if reader is not None:
                others[_op_label(reader)] += tensor.nbytes
            continue
        applied = _mixer_scheme(kinds, tensor, scheme)
        if applied != scheme:
            notes.append(
                f"{spec.target} {tuple(tensor.shape)} stored {applied}: its {tensor.shape[-1]} "
                f"columns are not a multiple of {scheme}'s group"
            )
        why = _why_kept(node, tensor, applied)
        if why is not None:
            reasons.append(f"{spec.target} {tuple(tensor.shape)} kept {tensor.dtype}: {why}")
            continue
        stored, scale = _quantized(tensor, applied)
        release_file_pages([tensor])  # a memory-mapped checkpoint's pages: read once, given back
        pair = []
        for suffix, value in (("quantized", stored), ("scale", scale)):
            target = f"{spec.target}.{suffix}"
            with graph.inserting_before(first_input):
                new = graph.placeholder(f"{node.name}_{suffix}")
            new.meta["val"] = fake_mode.from_tensor(value, static_shapes=True)
            argument = TensorArgument(new.name)
            new_specs[new.name] = InputSpec(InputKind.BUFFER, argument, target, True)
            state_dict[target] = value
            pair.append(new)
        _rewrite_users(graph, node, pair[0], pair[1], fake_mode, tensor.dtype, hits)
        if len(set(kinds)) > 1:
            hits["tied"] += 1
        graph.erase_node(node)
    for label, size in sorted(others.items(), key=lambda item: -item[1]):
        reasons.append(f"weights read by {label} stay as they are ({size / (1 << 20):.2f} MiB)")
    if not hits:
        return PassResult(program, False, hits)
    return PassResult(_rebuilt(program, graph_module, new_specs, state_dict), True, hits)


def _mixer_scheme(kinds: list, tensor: torch.Tensor, scheme: str) -> str:
    """The scheme for a weight only fused mixers read: ``scheme``, or int8 per output channel
    where ``scheme``'s group does not divide its columns (any scale layout serves a mixer)."""
    if set(kinds) != {"mixer"} or scheme_applies(scheme, tensor.shape[-1]):
        return scheme
    return "int8"


def _quantized(tensor: torch.Tensor, scheme: str) -> tuple[torch.Tensor, torch.Tensor]:
    """``quantize_weight`` of a (n, k) weight, or of each expert's matrix of a (E, n, k) one."""
    if tensor.dim() == 2:
        return quantize_weight(tensor, scheme)
    experts, rows, cols = tensor.shape
    stored, scale = quantize_weight(tensor.reshape(experts * rows, cols), scheme)
    return stored.reshape(experts, rows, cols), scale.reshape(experts, rows, -1)


def _op_label(node: Node) -> str:
    target = node.target
    return getattr(target, "__name__", None) or str(target)


def _rewrite_users(graph, node, stored, scale, fake_mode, dtype, hits: Counter) -> None:
    for user in list(node.users):
        kind = _use_kind(user, node)
        if kind in ("experts", "mixer"):  # the same call, reading the stored weight and its scale
            scales = SCALED[user.target][1]
            index = next(i for i in scales if user.args[i] is node)
            user.update_arg(index, stored)
            user.update_kwarg(scales[index], scale)
            hits[kind] += 1
            continue
        with graph.inserting_before(user):
            if kind == "linear":
                x, bias = user.args[0], (user.args[2] if len(user.args) > 2 else None)
                new = graph.call_function(
                    torch.ops.ssmcc.quantized_linear.default, (x, stored, scale, bias)
                )
            else:
                new = graph.call_function(
                    torch.ops.ssmcc.quantized_embedding.default, (user.args[1], stored, scale)
                )
            new.meta = dict(user.meta)
            with fake_mode:
                new.meta["val"] = new.target(
                    *[a.meta["val"] if isinstance(a, Node) else a for a in new.args]
                )
            result = new
            if kind == "embedding" and dtype != torch.float32:
                result = graph.call_function(aten._to_copy.default, (new,), {"dtype": dtype})
                result.meta = dict(user.meta)
        user.replace_all_uses_with(result)
        graph.erase_node(user)
        hits[kind] += 1


def _rebuilt(program, graph_module, new_specs: dict[str, InputSpec], state_dict) -> ExportedProgram:
    """The program around the edited graph: input specs in placeholder order (old ones kept, the
    quantised weights' buffers added, the replaced weights dropped), output specs renamed to the
    nodes that now produce them."""
    graph_module.recompile()
    old = {
        spec.arg.name: spec
        for spec in program.graph_signature.input_specs
        if hasattr(spec.arg, "name")
    }
    specs = [
        new_specs.get(n.name) or old[n.name]
        for n in graph_module.graph.nodes
        if n.op == "placeholder"
    ]
    kept = {spec.target for spec in specs}
    every = kept | {spec.target for spec in old.values()}
    outputs = []
    specs_out = program.graph_signature.output_specs
    for spec, value in zip(specs_out, output_nodes(graph_module), strict=True):
        spec = copy.copy(spec)
        if isinstance(value, Node):
            spec.arg = TensorArgument(name=value.name)
        outputs.append(spec)
    signature = ExportGraphSignature(input_specs=specs, output_specs=outputs)
    return program._update(
        graph_module,
        signature,
        state_dict={k: v for k, v in state_dict.items() if k in kept},
        constants={k: v for k, v in program.constants.items() if k in kept or k not in every},
    )
