"""What a route is: a Python module, the mixer classes in it, and replacements for module-level
functions those mixers call at run time; and the record of what routing did during one capture.

Replacement functions call ``record_routed_call`` so the capture report can count routed calls.
Which routes exist and how they are installed is ``routes.py``.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Mapping

import torch


@dataclasses.dataclass(frozen=True)
class Route:
    name: str
    module: str
    mixer_classes: tuple[str, ...]
    replacements: Mapping[str, Callable]  # module attribute (or Class.method) -> replacement
    attention_classes: tuple[str, ...] = ()  # routed attention: positions come from ssmcc


@dataclasses.dataclass
class RoutingRecord:
    """What routing found and did: the routes used, the SSM and attention layers, routed calls by
    op name."""

    routes: list[str] = dataclasses.field(default_factory=list)
    layers: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    calls: Counter = dataclasses.field(default_factory=Counter)
    attention_layers: list[tuple[str, str]] = dataclasses.field(default_factory=list)

    @property
    def feeds_positions(self) -> bool:
        """Routed attention layers read positions from ``ssmcc.positions``."""
        return bool(self.attention_layers)


ACTIVE_ROUTINGS: list[RoutingRecord] = []


def record_routed_call(op_name: str) -> None:
    """Called by replacement functions; counts the call in the innermost active routing. Not
    while Dynamo traces: it would guard on the count and recompile on every call."""
    if ACTIVE_ROUTINGS and not torch.compiler.is_compiling():
        ACTIVE_ROUTINGS[-1].calls[op_name] += 1
