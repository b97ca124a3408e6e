"""Recurrent state as program inputs/outputs, and the one-token decode program — read from the
ops' state contracts (``ssmcc.ops.contracts``), never from op names.

Two passes over a prefill program ``input_ids (b, l) -> logits (b, l, v)``:

- ``expose_recurrent_state``: every call of a stateful op takes its states (one per slot of
  its contract) from new program inputs and reports the states after the call as new outputs:
  ``(input_ids, *states) -> (logits, *new_states)``. With zero states it computes exactly what
  it did before (a slot's ``arg`` of ``None`` means zeros).
- ``scan_to_recurrent_step``: the decode program ``(input_ids (b, 1), *states) ->
  (logits (b, v), *new_states)``: every stateful op is replaced by its contract's ``step``
  (``selective_scan`` -> ``selective_state_update``, ``causal_conv1d`` -> ``causal_conv1d_update``,
  ``ssd_mixer`` -> ``ssd_mixer_step`` for the ssmcc ops). No loop remains.

States, in graph order of the ops and slot order within one: ``layers.<i>.<kind>`` (``kind``
from the contract's slot, ``i`` from the owning module's ``layers.<i>`` path, else the op's
ordinal among ops of that kind; ``.<j>`` appended where one layer has several ops of a kind, e.g.
Zamba's scan per head; a model-wide slot such as the position counter is just ``<kind>``); shape
and dtype from the contract. A slot's growing axes (a K/V cache's positions) are one dynamic dim
``past`` shared by every state, traced at 3 positions. Both passes re-trace the
program through an FX interpreter that applies the contracts, then ``torch.export`` it with a
dynamic batch (and, for prefill, sequence) dim, so whatever else the graph computes carries over
unchanged. Whether that is valid (nothing else mixes positions) is checked before, by
``program_set.streaming_refusal``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from ssmcc.ops.contracts import StateContract, StateSpec, bind_arguments, state_contract
from ssmcc.passes.locations import layer_of
from ssmcc.passes.pass_base import PassContext, PassResult


def stateful_nodes(program: ExportedProgram) -> list[tuple[torch.fx.Node, StateContract]]:
    """The calls of ops with a state contract, each with its contract, in graph order."""
    found = []
    for node in program.graph.nodes:
        contract = state_contract(node.target) if node.op == "call_function" else None
        if contract is not None:
            found.append((node, contract))
    return found


def _meta(value):
    return value.meta.get("val") if isinstance(value, torch.fx.Node) else value


def op_name(target) -> str:
    return target.name().split("::")[-1]


def state_specs(program: ExportedProgram) -> list[StateSpec]:
    """The states of ``program``'s stateful ops, in graph order."""
    specs: list[StateSpec] = []
    ordinals: Counter[str] = Counter()
    for node, contract in stateful_nodes(program):
        args = {k: _meta(v) for k, v in bind_arguments(node.target, node.args, node.kwargs).items()}
        for slot in contract.slots:
            layer = layer_of(node) or f"layers.{ordinals[slot.kind]}"
            ordinals[slot.kind] += 1
            name = f"{layer}.{slot.kind}" if slot.per_layer else slot.kind
            shape = tuple(int(size) for size in slot.shape(args))
            dtype = str(slot.dtype(args)).removeprefix("torch.")
            specs.append(StateSpec(name, slot.kind, shape, dtype, slot.grows))
    repeated = Counter(s.name for s in specs)
    seen: Counter[str] = Counter()
    for i, spec in enumerate(specs):  # e.g. Zamba's scan per head: layers.<i>.<kind>.<j>
        if repeated[spec.name] > 1:
            specs[i] = dataclasses.replace(spec, name=f"{spec.name}.{seen[spec.name]}")
            seen[spec.name] += 1
    return specs


# Growing state axes (a K/V cache's positions) are traced at this size: 0 or 1 would be
# specialised by torch.export. Every cache holds the same positions: one dim, ``past``, for all.
PAST_EXAMPLE = 3


def past_dim() -> Dim:
    return Dim("past", min=0)


def example_state_shape(spec: StateSpec) -> tuple[int, ...]:
    """A state's shape for tracing, its growing axes at ``PAST_EXAMPLE``."""
    return tuple(PAST_EXAMPLE if a in spec.grows else size for a, size in enumerate(spec.shape))


class _StatefulInterpreter(torch.fx.Interpreter):
    """Runs the prefill graph with stateful ops fed by, and reporting, explicit states."""

    def __init__(self, module, states: list[torch.Tensor], step: bool):
        super().__init__(module)
        self.states_in = list(states)
        self.states_out: list[torch.Tensor] = []
        self.step = step

    def call_function(self, target, args, kwargs):
        contract = state_contract(target)
        if contract is None:
            return super().call_function(target, args, kwargs)
        first = len(self.states_out)
        states = self.states_in[first : first + len(contract.slots)]
        bound = bind_arguments(target, args, kwargs)
        if self.step:
            outputs = contract.step(tuple(states), **bound)
        else:
            given = {slot.arg: state for slot, state in zip(contract.slots, states, strict=True)}
            outputs = target(**{**bound, **given})
        self.states_out.extend(outputs[slot.output] for slot in contract.slots)
        return outputs


class _Stateful(nn.Module):
    def __init__(self, program: ExportedProgram, step: bool):
        super().__init__()
        self.inner = program.module()
        self.step = step

    def forward(self, input_ids, *states):
        interpreter = _StatefulInterpreter(self.inner, list(states), self.step)
        result = interpreter.run(input_ids)
        logits = result[0] if isinstance(result, (tuple, list)) else result
        if self.step:
            logits = logits[:, -1]
        return (logits, *interpreter.states_out)


def _export(program: ExportedProgram, step: bool, specs: list[StateSpec]) -> ExportedProgram:
    batch = Dim("batch", min=1)
    length = 1 if step else 8
    ids = torch.zeros(2, length, dtype=torch.long)
    states = [torch.zeros(2, *example_state_shape(spec), dtype=spec.torch_dtype) for spec in specs]
    ids_shape = {0: batch} if step else {0: batch, 1: Dim("seq", min=1)}
    past = past_dim()
    state_shapes = tuple({0: batch, **{1 + axis: past for axis in spec.grows}} for spec in specs)
    return torch.export.export(
        _Stateful(program, step),
        (ids, *states),
        dynamic_shapes=(ids_shape, state_shapes),
        strict=False,
    )


def expose_recurrent_state(program: ExportedProgram, ctx: PassContext) -> PassResult:
    specs = state_specs(program)
    if not specs:
        return PassResult(program, False, Counter())
    hits = Counter(state_input=len(specs))
    return PassResult(_export(program, step=False, specs=specs), True, hits)


def scan_to_recurrent_step(program: ExportedProgram, ctx: PassContext) -> PassResult:
    """The decode program of a prefill program (see the module docstring)."""
    hits = Counter(
        f"{op_name(node.target)}->{contract.step_op}" for node, contract in stateful_nodes(program)
    )
    if not hits:
        return PassResult(program, False, hits)
    return PassResult(_export(program, step=True, specs=state_specs(program)), True, hits)
