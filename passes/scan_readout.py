"""The output side of a found recurrence: its readout ``y_t = contract(h_t, C_t)`` over the state
dim, the value that collects y over time, and the values equal to the final state.

Shared by the Mamba-1 and SSD factorings (``detect_selective_scan.py``, ``ssd_loop.py``): a loop
either collects each step's readout (``stack(y_t)``) or the states themselves (``stack(h_t)``,
read out afterwards); either way the collected value is followed through single-user data
movement to where the scan's output is used.
"""

from __future__ import annotations

import torch
from torch.fx import Node

from ssmcc.passes.call_args import int_arg, node_arg
from ssmcc.passes.dim_labels import (
    Labelled,
    Labels,
    carried_labels,
    dim_sources,
    output_labels,
    shape,
)
from ssmcc.passes.recurrence import Recurrence
from ssmcc.passes.scan_factoring import TIME, Readout, StepContext, read_contraction, require

aten = torch.ops.aten


def _follow_layout(node: Node, labels: Labels) -> tuple[Node, Labels]:
    """Extend ``node`` through single-user data-movement ops."""
    while len(node.users) == 1:
        user = next(iter(node.users))
        following = output_labels(user, labels) if user.args and user.args[0] is node else None
        if following is None:
            break
        node, labels = user, following
    return node, labels


def _read_states(states: Labelled, state: str, ctx: StepContext):
    """The readout and final-state uses of a whole state sequence (``hs = stack(h_t)``)."""
    readouts, last = [], []
    frontier = [(states.node, states.labels)]
    while frontier:
        node, labels = frontier.pop()
        for user in list(node.users):
            following = output_labels(user, labels) if user.args[0] is node else None
            if following is not None:
                frontier.append((user, following))
                continue
            time_axis = labels.index(TIME)
            if user.target == aten.select.int and int_arg(user, 1) % len(labels) == time_axis:
                require(
                    user.args[2] in (-1, shape(node)[time_axis] - 1),
                    f"{user.name} reads the state at step {user.args[2]}, not the last",
                )
                last.append(Labelled(user, labels[:time_axis] + labels[time_axis + 1 :]))
                continue
            reader = user
            if user.target == aten.mul.Tensor and len(user.users) == 1:
                reader = next(iter(user.users))
            readouts.append(read_contraction(reader, node, labels, state, ctx))
    require(len(readouts) == 1, f"the state sequence is read out {len(readouts)} times; expected 1")
    return readouts[0], last


def read_output(recurrence: Recurrence, state: str) -> tuple[Readout, tuple, list[Labelled]]:
    """(readout, (output node, its labels), final-state uses) for the state dim ``state``."""
    last = list(recurrence.last_state)
    if recurrence.states is not None:
        readout, last_uses = _read_states(recurrence.states, state, recurrence.ctx)
        output = Labelled(readout.node, readout.labels)
        last += last_uses
    else:
        if recurrence.step_output is None or recurrence.collected is None:
            raise ValueError(f"{recurrence.rule}: a recurrence without outputs (see with_outputs)")
        step_out, h = recurrence.step_output
        reader, chain = step_out, []
        while reader is not h:
            sources = dim_sources(reader)
            if sources is None:
                break
            chain.append(sources)
            reader = node_arg(reader)
        readout = read_contraction(reader, h, recurrence.state_labels, state, recurrence.ctx)
        labels = readout.labels
        for sources in reversed(chain):
            labels = carried_labels(labels, sources)
        collected, axis = recurrence.collected
        output = Labelled(collected, labels[:axis] + (TIME,) + labels[axis:])
    return readout, _follow_layout(output.node, output.labels), last
