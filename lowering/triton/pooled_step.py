"""The step program rewritten over state pools: what the captured decode (``decode_graph.py``)
replays.

The lowered step module is ``(input_ids (b, 1), *states) -> (logits (b, V), *new states)``: each
state is read by one stateful call, which returns its new state as a new tensor. The pooled
module is

    forward(input_ids (B, 1), state_indices (B,), lengths (S,), *pools, *workspaces) -> logits

the same graph with each stateful call replaced by its pooled form, row i reading and writing
slot ``state_indices[i]`` of the pools (slot -1: a padding row, skipped):

    mamba_mixer_step_fwd / ssd_mixer_step_fwd   conv_state, ssm_state   the same launcher with
        ``state_indices``, ``in_place=True`` and a persistent ``workspace`` (its scratch, and
        Mamba-2's row counters, which the kernel leaves at zero)
    causal_conv1d_update_fwd, selective_state_update_fwd, ssd_state_update_fwd   conv_state /
        state   the same launcher with ``state_indices`` (the separate step ops: Jamba's and
        Zamba's Mamba-1 layers, ``pipeline="unfused"``)
    attention_fwd            past_key, past_value   ``kv_pool.attention_pool_step_fwd`` over
        (S, g, C, d) pools of fixed capacity C: the new key/value written at the slot's length,
        attention over the positions up to it
    positions_fwd            past_count         ``kv_pool.positions_pool_fwd``: the slot's
        count is the position, then grows by one

and, after the last attention call, ``kv_pool.advance_counts(lengths, state_indices)``: every
live row's slot holds one more position (``lengths``: cached positions per slot, read by every
attention layer of the step). The batch size the graph reads off a state (``sym_size(state,
0)``: the export takes it from whichever input it saw first) is read off ``input_ids``. No state
is allocated or copied, so the memory traffic of a step is the weights, the states of the live
rows and the activations. The states are no outputs any more (the pools are updated in place);
the export's input guard (``_guards_fn``, which checks the inputs as the program took them) is
dropped, the captured path sizing its own buffers.

Refused (the message says what; generation then runs eagerly): a state read by anything else,
a new state that is not its call's own output, a fused step whose weights are computed in the
graph (its workspace is sized from them).
"""

from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable

import torch
from torch import fx

from ssmcc.kernels.triton.attention import attention_fwd
from ssmcc.kernels.triton.causal_conv1d import causal_conv1d_update_fwd
from ssmcc.kernels.triton.kv_pool import advance_counts, attention_pool_step_fwd, positions_pool_fwd
from ssmcc.kernels.triton.mixers import (
    mamba_mixer_step_fwd,
    mamba_mixer_step_workspace,
    ssd_mixer_step_fwd,
    ssd_mixer_step_workspace,
)
from ssmcc.kernels.triton.positions import positions_fwd
from ssmcc.kernels.triton.state_update import selective_state_update_fwd, ssd_state_update_fwd


def _mamba_workspace(weight: Callable, device) -> Callable[[int], object]:
    weights = [weight(n) for n in ("conv_weight", "x_proj_weight", "dt_proj_weight", "A")]
    return lambda batch: mamba_mixer_step_workspace(batch, *weights, device)


def _ssd_workspace(weight: Callable, device) -> Callable[[int], object]:
    norm_weight = weight("norm_weight")
    return lambda batch: ssd_mixer_step_workspace(batch, norm_weight, device)


# fused step launcher -> its workspace factory, given the weights (name -> tensor) of the call
FUSED_STEPS = {mamba_mixer_step_fwd: _mamba_workspace, ssd_mixer_step_fwd: _ssd_workspace}
# stateful launcher -> its state arguments, in the order of its outputs 1, 2, ...
STATE_ARGS = {
    mamba_mixer_step_fwd: ("conv_state", "ssm_state"),
    ssd_mixer_step_fwd: ("conv_state", "ssm_state"),
    causal_conv1d_update_fwd: ("conv_state",),
    selective_state_update_fwd: ("state",),
    ssd_state_update_fwd: ("state",),
    attention_fwd: ("past_key", "past_value"),
    positions_fwd: ("past_count",),
}
# the separate step ops: the same launcher, given slot indices, updates its pool in place
SEPARATE_STEPS = (causal_conv1d_update_fwd, selective_state_update_fwd, ssd_state_update_fwd)


class StepRefusal(Exception):
    """The step program cannot run over pools; the message says why."""


@dataclasses.dataclass
class PooledStep:
    module: fx.GraphModule  # forward(input_ids, state_indices, lengths, *pools, *workspaces)
    workspaces: list[Callable[[int], object]]  # per fused step: batch -> its workspace
    vocab: int  # the logits' last dim


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


def _is_batch_size(node: fx.Node) -> bool:
    """``sym_size(state, 0)``: the batch, wherever the export read it."""
    return node.target is torch.ops.aten.sym_size.int and node.args[1:] == (0,)


def _is_new_state(node: fx.Node, stateful) -> bool:
    source = node.args[0] if node.target is operator.getitem else None
    return isinstance(source, fx.Node) and source in stateful and node.args[1] != 0


def _bound(node: fx.Node) -> dict:
    return dict(inspect.signature(node.target).bind(*node.args, **node.kwargs).arguments)


def pool_step(module: fx.GraphModule, specs, device) -> PooledStep:
    """``module`` (a lowered step program) over state pools; ``StepRefusal`` when it cannot."""
    graph = module.graph
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    ids, states = inputs[0], inputs[1:]
    if len(states) != len(specs):
        raise StepRefusal(f"the step program takes {len(states)} states, its specs {len(specs)}")
    (output,) = [n for n in graph.nodes if n.op == "output"]
    logits, *new_states = output.args[0]
    owner: dict[fx.Node, tuple[fx.Node, int]] = {}  # state -> (its call, output position)
    stateful = [n for n in graph.nodes if n.op == "call_function" and n.target in STATE_ARGS]
    for node in stateful:
        args = _bound(node)
        for position, name in enumerate(STATE_ARGS[node.target], start=1):
            state = args.get(name)
            if state not in states or state in owner:
                raise StepRefusal(f"{node.name}'s {name} is not a state input of its own")
            owner[state] = (node, position)
    for i, state in enumerate(states):
        readers = [u for u in state.users if not (_is_guard(u) or _is_batch_size(u))]
        if state not in owner or readers != [owner[state][0]]:
            names = ", ".join(u.name for u in readers if u not in stateful) or "nothing"
            raise StepRefusal(
                f"state {specs[i].name} is read by {names}, not by one call that takes slot "
                "indices (a mixer, conv or scan step, attention, positions)"
            )
        call, position = owner[state]
        new = new_states[i]
        if not (new.target is operator.getitem and new.args == (call, position)):
            raise StepRefusal(f"new state {specs[i].name} is not {call.name}'s own output")
    return _rewrite(module, ids, states, logits, stateful, device)


def _rewrite(module, ids, states, logits, stateful, device) -> PooledStep:
    graph = fx.Graph()
    env: dict[fx.Node, fx.Node] = {ids: graph.placeholder("input_ids")}
    slots = graph.placeholder("state_indices")
    lengths = graph.placeholder("lengths")
    env.update({s: graph.placeholder(f"pool_{i}") for i, s in enumerate(states)})
    fused = [n for n in stateful if n.target in FUSED_STEPS]
    workspaces = {n: graph.placeholder(f"workspace_{j}") for j, n in enumerate(fused)}
    batch = graph.call_function(torch.ops.aten.sym_size.int, (env[ids], 0))
    factories = []
    attends = False
    for node in module.graph.nodes:
        if node.op in ("placeholder", "output") or _is_guard(node):
            continue  # inputs made above; the input guard dropped
        if _is_new_state(node, stateful):
            continue  # the pool, updated in place
        if _is_batch_size(node) and node.args[0] in states:
            env[node] = batch
            continue
        if node not in stateful:
            env[node] = graph.node_copy(node, env.__getitem__)
            continue
        args = {k: fx.map_arg(v, env.__getitem__) for k, v in _bound(node).items()}
        if node in workspaces:
            try:
                factories.append(FUSED_STEPS[node.target](_weights(module, _bound(node)), device))
            except StepRefusal as refusal:
                raise StepRefusal(f"{node.name}: {refusal}") from None
            args.update(state_indices=slots, in_place=True, workspace=workspaces[node])
            env[node] = graph.call_function(node.target, (), args)
        elif node.target in SEPARATE_STEPS:
            env[node] = graph.call_function(node.target, (), {**args, "state_indices": slots})
        elif node.target is attention_fwd:
            attends = True
            call = (args["query"], args["key"], args["value"], args["scale"], args["past_key"],
                    args["past_value"], lengths, slots)
            env[node] = graph.call_function(attention_pool_step_fwd, call)
        else:  # positions_fwd
            call = (args["input_ids"], args["past_count"], slots)
            env[node] = graph.call_function(positions_pool_fwd, call)
    if attends:  # after every attention layer of the step has read the lengths
        graph.call_function(advance_counts, (lengths, slots))
    graph.output(env[logits])
    value = logits.meta.get("val")
    if not isinstance(value, torch.Tensor):
        raise StepRefusal(f"the step program's logits ({logits.name}) have no recorded shape")
    return PooledStep(fx.GraphModule(module, graph), factories, value.shape[-1])
