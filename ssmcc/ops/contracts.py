"""State contracts: what a stateful op carries from one call to the next, declared with the op.

A sequence op such as ``selective_scan`` is a fold over positions: given the state after position
``t-1`` it computes position ``t`` and the state after it. Its contract says, in terms of the op's
own arguments, for each state it carries (a ``StateSlot``; a fused mixer carries two, its conv
state and its SSM state):

- ``kind``: the state's name in a program (``layers.<i>.<kind>``);
- ``arg``: the argument that takes the state in (``None`` = zeros), and ``output``: which
  output is the state after the last position;
- ``shape(args)``: the state's shape without the batch dim, from the op's inputs (their metadata
  when tracing), and ``dtype(args)``: its dtype;
- ``grows``: the state axes (batch excluded) that grow with the sequence (a K/V cache grows by one
  position per token; an SSM or conv state never grows: ``()``); a growing axis has size 0 in
  ``shape`` (a new sequence has no cached position);
- ``per_layer``: False for a state of the whole model (the position counter), named ``<kind>``
  rather than ``layers.<i>.<kind>``;

and for the op as a whole:

- ``step(states, **args)``: the one-position counterpart — the op's outputs for a sequence of
  length 1 continuing from ``states`` (one per slot, in slot order), each slot's output being its
  new state; ``step_op`` names the op it calls (for rule names and reports).

The passes that expose states as program inputs/outputs, derive the one-token step program and
chunk long prompts, the runtime's ``State`` and the artifact manifest all read contracts; none of
them names an op. ``StateSpec`` is one state tensor of one program, as those consumers see it.

Ops register contracts with ``register_state_contract`` (``single_state`` builds the contract of
an op with one state); an op whose outputs at each position depend only on the inputs at that
position registers ``register_positionwise`` instead.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

_CONTRACTS: dict[object, StateContract] = {}
_POSITIONWISE: set = set()


@dataclasses.dataclass(frozen=True)
class StateSlot:
    kind: str  # the state's name in a program: layers.<i>.<kind>
    arg: str
    output: int
    shape: Callable[[dict], tuple]
    dtype: Callable[[dict], torch.dtype]
    grows: tuple[int, ...] = ()
    per_layer: bool = True


@dataclasses.dataclass(frozen=True)
class StateContract:
    slots: tuple[StateSlot, ...]
    step: Callable[..., tuple]  # step(states: tuple, **args)
    step_op: str


def single_state(
    *,
    kind: str,
    state_arg: str,
    state_output: int,
    shape: Callable[[dict], tuple],
    dtype: Callable[[dict], torch.dtype],
    step: Callable[..., tuple],
    step_op: str,
    grows: tuple[int, ...] = (),
    per_layer: bool = True,
) -> StateContract:
    """The contract of an op carrying one state; its ``step(state, **args)`` takes it alone."""
    slot = StateSlot(kind, state_arg, state_output, shape, dtype, grows, per_layer)
    return StateContract((slot,), lambda states, **args: step(states[0], **args), step_op)


@dataclasses.dataclass(frozen=True)
class StateSpec:
    """One state tensor of a program: ``shape`` excludes the batch dim; ``grows`` lists the axes
    of ``shape`` that grow with the sequence (their size in ``shape`` is that of the example)."""

    name: str
    kind: str
    shape: tuple[int, ...]
    dtype: str = "float32"
    grows: tuple[int, ...] = ()

    def to_dict(self) -> dict:
        """The manifest's form: ``shape`` with a leading ``"batch"``."""
        return {
            "name": self.name,
            "kind": self.kind,
            "shape": ["batch", *self.shape],
            "dtype": self.dtype,
            "grows": list(self.grows),
        }

    @classmethod
    def from_dict(cls, entry: dict) -> StateSpec:
        return cls(
            entry["name"],
            entry["kind"],
            tuple(int(s) for s in entry["shape"][1:]),
            entry.get("dtype", "float32"),
            tuple(entry.get("grows", ())),
        )

    @property
    def torch_dtype(self) -> torch.dtype:
        return getattr(torch, self.dtype)

    @property
    def nbytes_per_row(self) -> int:
        """Bytes of one batch row (at the recorded size of growing axes)."""
        count = 1
        for size in self.shape:
            count *= size
        return count * torch.empty((), dtype=self.torch_dtype).element_size()


def _overload(op):
    """The ``OpOverload`` of a custom op, its packet or the function ``custom_op`` returned."""
    overload = getattr(op, "_opoverload", op)
    return getattr(overload, "default", overload)


def register_state_contract(op, contract: StateContract) -> None:
    _CONTRACTS[_overload(op)] = contract


def register_positionwise(op) -> None:
    """Declare that ``op`` computes each position from that position's inputs only."""
    _POSITIONWISE.add(_overload(op))


def state_contract(target) -> StateContract | None:
    """The contract of a graph node's target, or None when the op carries no state."""
    return _CONTRACTS.get(target)


def is_positionwise(target) -> bool:
    return target in _POSITIONWISE


def bind_arguments(target, args: tuple, kwargs: dict) -> dict:
    """The call's arguments by schema name, defaults filled in."""
    bound = {}
    arguments = target._schema.arguments
    for i, argument in enumerate(arguments):
        if i < len(args):
            bound[argument.name] = args[i]
        elif argument.name in kwargs:
            bound[argument.name] = kwargs[argument.name]
        else:
            bound[argument.name] = argument.default_value if argument.has_default_value() else None
    return bound
