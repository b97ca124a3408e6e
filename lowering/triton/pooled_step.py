"""The step program rewritten over state pools: what the captured decode (``decode_graph.py``)
replays.

The lowered step module is ``(input_ids (b, 1), *states) -> (logits (b, V), *new states)``: each
state goes into one fused mixer step (``mamba_mixer_step_fwd`` / ``ssd_mixer_step_fwd``, its
``conv_state`` or ``ssm_state``) and the new state comes out of it as a new tensor. The pooled
module is

    forward(input_ids (B, 1), state_indices (B,), *pools, *workspaces) -> logits (B, V)

the same graph with each fused step called with ``state_indices``, ``in_place=True`` (row i reads
and writes slot ``state_indices[i]`` of the pools; slot -1 skips the row) and a persistent
``workspace`` (its scratch, and Mamba-2's row counters, which the kernel leaves at zero): no
state is allocated or copied, so the module's memory traffic per step is the weights, the
states of the live rows and the activations. The states are no outputs any more (the pools are
updated in place); the export's input guard (``_guards_fn``, which checks the inputs as the
program took them) is dropped, the captured path sizing its own buffers.

Refused (the message says what; generation then runs eagerly): states that grow (K/V caches,
below), a state read by anything but a fused mixer step (``pipeline="unfused"``: the separate
conv and scan step ops take no slot indices), a new state that is not the fused step's own
output, a fused step whose weights are computed in the graph (its workspace is sized from them).

K/V caches: the step program's ``ssmcc.attention`` concatenates its cache with the new position
(``keys`` is a new (b, g, p + 1, d) tensor every token) and its kernel takes the past length p as
a launch argument, so no fixed graph replays it. What the graph path needs for hybrids: K/V pools
(slots, g, max_length, d) per attention layer, an attention step launcher that writes the new
key/value at each row's length and attends over that row's own length read on the device (slot
indices as the mixer steps take them), a per-slot length buffer the graph increments, and this
rewrite pointing the attention nodes at it; prompt + new tokens beyond ``max_length`` is then a
capacity error.
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable

import torch
from torch import fx

from ssmcc.kernels.triton.mixers import (
    mamba_mixer_step_fwd,
    mamba_mixer_step_workspace,
    ssd_mixer_step_fwd,
    ssd_mixer_step_workspace,
)


def _mamba_workspace(weight: Callable, device) -> Callable[[int], object]:
    weights = [weight(n) for n in ("conv_weight", "x_proj_weight", "dt_proj_weight", "A")]
    return lambda batch: mamba_mixer_step_workspace(batch, *weights, device)


def _ssd_workspace(weight: Callable, device) -> Callable[[int], object]:
    norm_weight = weight("norm_weight")
    return lambda batch: ssd_mixer_step_workspace(batch, norm_weight, device)


# fused step launcher -> its workspace factory, given the weights (name -> tensor) of the call
POOLED_STEPS = {mamba_mixer_step_fwd: _mamba_workspace, ssd_mixer_step_fwd: _ssd_workspace}
STATE_ARGS = ("conv_state", "ssm_state")  # output 1 and 2 of a fused step


class StepRefusal(Exception):
    """The step program cannot run over pools; the message says why."""


@dataclasses.dataclass
class PooledStep:
    module: fx.GraphModule  # forward(input_ids, state_indices, *pools, *workspaces) -> logits
    workspaces: list[Callable[[int], object]]  # per fused step: batch -> its workspace
    vocab: int  # the logits' last dim


def kv_refusal(specs) -> str | None:
    grows = [s.name for s in specs if s.grows]
    if not grows:
        return None
    shown = ", ".join(grows[:4]) + (", ..." if len(grows) > 4 else "")
    return (
        f"the step program's K/V caches ({shown}) grow by one position per token (ssmcc.attention "
        "concatenates them and takes the past length as a launch argument), which a CUDA graph "
        "cannot replay; decoding hybrids from a graph needs fixed-capacity K/V pools and an "
        "attention step kernel reading each row's length on the device (not built yet)"
    )


def _attribute(module: torch.nn.Module, node) -> torch.Tensor:
    if not (isinstance(node, fx.Node) and node.op == "get_attr"):
        raise StepRefusal(f"its input {node} is computed in the step program, not a weight")
    value = module
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def _weights(module: torch.nn.Module, args: dict) -> Callable[[str], torch.Tensor]:
    """name -> the weight tensor a fused step call takes as that argument."""
    return lambda name: _attribute(module, args[name])


def _is_guard(node: fx.Node) -> bool:
    """The export's check of the program's inputs (``_guards_fn``)."""
    return node.op == "call_module" and node.target == "_guards_fn"


def _is_new_state(node: fx.Node, fused) -> bool:
    source = node.args[0] if node.target is operator.getitem else None
    return isinstance(source, fx.Node) and source in fused and node.args[1] != 0


def _bound(node: fx.Node) -> dict:
    return dict(inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments)


def pool_step(module: fx.GraphModule, specs, device) -> PooledStep:
    """``module`` (a lowered step program) over state pools; ``StepRefusal`` when it cannot."""
    refusal = kv_refusal(specs)
    if refusal is not None:
        raise StepRefusal(refusal)
    graph = module.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    ids, states = inputs[0], inputs[1:]
    if len(states) != len(specs):
        raise StepRefusal(f"the step program takes {len(states)} states, its specs {len(specs)}")
    (output,) = [n for n in graph.nodes if n.op == "output"]
    logits, *new_states = output.args[0]
    owner: dict[fx.Node, tuple[fx.Node, int]] = {}  # state -> (fused step, 1 or 2)
    fused = [n for n in graph.nodes if n.op == "call_function" and n.target in POOLED_STEPS]
    for node in fused:
        args = _bound(node)
        for position, name in enumerate(STATE_ARGS, start=1):
            state = args.get(name)
            if state not in states or state in owner:
                raise StepRefusal(f"{node.name}'s {name} is not a state input of its own")
            owner[state] = (node, position)
    for i, state in enumerate(states):
        readers = [u for u in state.users if not _is_guard(u)]
        if state not in owner or readers != [owner[state][0]]:
            names = ", ".join(u.name for u in readers if u not in fused) or "nothing"
            raise StepRefusal(
                f"state {specs[i].name} is read by {names}, not by one fused mixer step "
                "(which takes slot indices)"
            )
        step, position = owner[state]
        new = new_states[i]
        if not (new.target is operator.getitem and new.args == (step, position)):
            raise StepRefusal(f"new state {specs[i].name} is not {step.name}'s own output")
    return _rewrite(module, ids, states, logits, fused, device)


def _rewrite(module, ids, states, logits, fused, device) -> PooledStep:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {ids: graph.placeholder("input_ids")}
    slots = graph.placeholder("state_indices")
    env.update({s: graph.placeholder(f"pool_{i}") for i, s in enumerate(states)})
    workspaces = {n: graph.placeholder(f"workspace_{j}") for j, n in enumerate(fused)}
    factories = []
    for node in module.graph.nodes:
        if node.op in ("placeholder", "output") or _is_guard(node):
            continue  # inputs made above; the input guard dropped
        if _is_new_state(node, workspaces):
            continue  # the pool, updated in place
        if node in workspaces:
            args = _bound(node)
            try:
                factories.append(POOLED_STEPS[node.target](_weights(module, args), device))
            except StepRefusal as refusal:
                raise StepRefusal(f"{node.name}: {refusal}") from None
            kwargs = {k: fx.map_arg(v, env.__getitem__) for k, v in args.items()}
            kwargs.update(state_indices=slots, in_place=True, workspace=workspaces[node])
            env[node] = graph.call_function(node.target, (), kwargs)
            continue
        env[node] = graph.node_copy(node, env.__getitem__)
    graph.output(env[logits])
    value = logits.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise StepRefusal(f"the step program's logits ({logits.name}) have no recorded shape")
    return PooledStep(fx.GraphModule(module, graph), factories, value.shape[-1])
