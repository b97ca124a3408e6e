"""Recurrent state as program inputs/outputs, and the one-token decode program.

Two passes over a prefill program ``input_ids (b, l) -> logits (b, l, v)`` whose SSM layers are
ssmcc ops:

- ``expose_recurrent_state``: the prefill program takes every layer's state as an input and
  returns the final states: ``(input_ids, *states) -> (logits, *new_states)``. Each
  ``causal_conv1d`` gets ``initial_state = conv state`` and each ``selective_scan`` gets
  ``initial_state = ssm state``; with zero states it computes exactly what it did before.
- ``scan_to_recurrent_step``: the decode program ``(input_ids (b, 1), *states) ->
  (logits (b, v), *new_states)``, where every ``causal_conv1d(x)`` becomes
  ``causal_conv1d_update(x[..., 0], conv_state)`` and every ``selective_scan(u, delta, .., B, C)``
  becomes ``selective_state_update(ssm_state, u[..., 0], delta[..., 0], .., B[..., 0], C[..., 0])``,
  their outputs unsqueezed back to length 1. No loop remains.

States, in graph order of the ops: ``layers.<i>.conv_state`` (b, d, k-1) and
``layers.<i>.ssm_state`` (b, d, n), float32, ``i`` taken from the owning module's ``layers.<i>``
path when there is one (else the op's ordinal). Both passes re-trace the program through an FX
interpreter that swaps the ops, then ``torch.export`` it with a dynamic batch (and, for prefill,
sequence) dim, so whatever else the graph computes carries over unchanged.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import torch
from torch import nn
from torch.export import Dim, ExportedProgram

from ssmcc.ops import SSMCC_OPS
from ssmcc.passes.pass_base import PassContext, PassResult

SCAN, CONV = SSMCC_OPS["selective_scan"], SSMCC_OPS["causal_conv1d"]


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One recurrent state tensor: ``shape`` excludes the batch dim."""

    name: str
    kind: str  # "conv_state" | "ssm_state"
    shape: tuple[int, ...]
    dtype: str = "float32"


def _layer_of(node, ordinal: int) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    for path, _ in reversed(list(stack.values())):
        match = re.search(r"layers\.(\d+)", path)
        if match:
            return f"layers.{match.group(1)}"
    return f"layers.{ordinal}"


def state_specs(program: ExportedProgram) -> list[StateSpec]:
    """The states of ``program``'s ssmcc ops, in graph order."""
    specs, ordinals = [], Counter()
    for node in program.graph.nodes:
        if node.op != "call_function" or node.target not in (SCAN, CONV):
            continue
        kind = "conv_state" if node.target == CONV else "ssm_state"
        layer = _layer_of(node, ordinals[kind])
        ordinals[kind] += 1
        if node.target == CONV:
            dim, width = node.args[1].meta["val"].shape
            shape = (int(dim), int(width) - 1)
        else:
            dim, n = node.args[2].meta["val"].shape
            shape = (int(dim), int(n))
        specs.append(StateSpec(f"{layer}.{kind}", kind, shape))
    names = [s.name for s in specs]
    if len(set(names)) != len(names):  # e.g. two scans in one layer: fall back to ordinals
        specs = [dataclasses.replace(s, name=f"ssm_op.{i}.{s.kind}") for i, s in enumerate(specs)]
    return specs


class _StatefulInterpreter(torch.fx.Interpreter):
    """Runs the prefill graph with ssmcc ops fed by, and reporting, explicit states."""

    def __init__(self, module, states: list[torch.Tensor], step: bool):
        super().__init__(module)
        self.states_in = list(states)
        self.states_out: list[torch.Tensor] = []
        self.step = step

    def call_function(self, target, args, kwargs):
        if target not in (SCAN, CONV):
            return super().call_function(target, args, kwargs)
        state = self.states_in[len(self.states_out)]
        if target == CONV:
            x, weight, bias, _, activation = _conv_args(*args, **kwargs)
            if self.step:
                out, new = torch.ops.ssmcc.causal_conv1d_update(
                    x[:, :, 0], state, weight, bias, activation
                )
                out = out.unsqueeze(-1)
            else:
                out, new = torch.ops.ssmcc.causal_conv1d(x, weight, bias, state, activation)
        else:
            u, delta, A, B, C, D, z, delta_bias, softplus, _ = _scan_args(*args, **kwargs)
            if self.step:
                at0 = lambda t: None if t is None else t[..., 0]  # noqa: E731
                out, new = torch.ops.ssmcc.selective_state_update(
                    state, at0(u), at0(delta), A, at0(B), at0(C), D, at0(z), delta_bias, softplus
                )
                out = out.unsqueeze(-1)
            else:
                out, new = torch.ops.ssmcc.selective_scan(
                    u, delta, A, B, C, D, z, delta_bias, softplus, state
                )
        self.states_out.append(new)
        return out, new


def _conv_args(x, weight, bias=None, initial_state=None, activation=None):
    return x, weight, bias, initial_state, activation


def _scan_args(
    u, delta, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False, initial_state=None
):
    return u, delta, A, B, C, D, z, delta_bias, delta_softplus, initial_state


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
    states = [torch.zeros(2, *spec.shape) for spec in specs]
    ids_shape = {0: batch} if step else {0: batch, 1: Dim("seq", min=1)}
    shapes = (ids_shape, tuple({0: batch} for _ in specs))  # forward(input_ids, *states)
    return torch.export.export(
        _Stateful(program, step), (ids, *states), dynamic_shapes=shapes, strict=False
    )


def expose_recurrent_state(program: ExportedProgram, ctx: PassContext) -> PassResult:
    specs = state_specs(program)
    if not specs:
        return PassResult(program, False, Counter())
    hits = Counter(state_input=len(specs))
    return PassResult(_export(program, step=False, specs=specs), True, hits)


def scan_to_recurrent_step(program: ExportedProgram, ctx: PassContext) -> PassResult:
    """The decode program of a prefill program (see the module docstring)."""
    specs = state_specs(program)
    hits = Counter()
    for spec in specs:
        rule = (
            "causal_conv1d->causal_conv1d_update"
            if spec.kind == "conv_state"
            else "selective_scan->selective_state_update"
        )
        hits[rule] += 1
    if not specs:
        return PassResult(program, False, hits)
    return PassResult(_export(program, step=True, specs=specs), True, hits)
