"""Scoped routing of known model implementations to the ssmcc ops.

A ``Route`` names a Python module (e.g. ``transformers.models.mamba.modeling_mamba``), the mixer
classes in it, and replacements for module-level functions those mixers call at run time (a
dotted name, ``Class.method``, replaces a method of a class defined in that module). Inside
``routed(model)`` the replacements are installed in every module that one of the model's submodule
classes comes from, and they are always restored on exit, also when capture fails: the user's model
object and the library are never changed permanently.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import sys
from collections.abc import Iterator

from torch import nn

from ssmcc.errors import CaptureError
from ssmcc.frontend import hf_attention, hf_mamba1, hf_mamba2, hf_moe
from ssmcc.frontend.route import ACTIVE_ROUTINGS, Route, RoutingRecord
from ssmcc.ops.activations import is_supported, supported_list


def known_routes() -> tuple[Route, ...]:
    return hf_mamba1.ROUTES + hf_mamba2.ROUTES + hf_attention.ROUTES + hf_moe.ROUTES


def routes_for(model: nn.Module) -> list[Route]:
    """The routes whose module defines a class used by one of the model's submodules."""
    modules_in_model = {type(m).__module__ for m in model.modules()}
    return [route for route in known_routes() if route.module in modules_in_model]


def ssm_layers(model: nn.Module, routes: list[Route]) -> list[tuple[str, str]]:
    """(qualified name, class name) of every submodule that is a routed mixer."""
    return [
        (name, type(module).__name__)
        for name, module in model.named_modules()
        for route in routes
        if type(module).__module__ == route.module and type(module).__name__ in route.mixer_classes
    ]


def attention_layers(model: nn.Module, routes: list[Route]) -> list[tuple[str, str]]:
    """(qualified name, class name) of every submodule that is a routed attention layer."""
    return [
        (name, type(module).__name__)
        for name, module in model.named_modules()
        for route in routes
        if type(module).__module__ == route.module
        and type(module).__name__ in route.attention_classes
    ]


def check_mixer_activations(model: nn.Module, routes: list[Route]) -> None:
    """Every routed mixer's ``activation`` (its config's ``hidden_act``, ``mamba_hidden_act`` or
    ``hidden_mamba_act``, which Hugging Face applies to the conv) must have a form in
    ``ssmcc.ops.activations``; else a ``CaptureError`` naming the layer, the activation and the
    supported names."""
    layers = {name for name, _ in ssm_layers(model, routes)}
    for name, module in model.named_modules():
        if name in layers and not is_supported(activation := getattr(module, "activation", None)):
            raise CaptureError(
                f"{name} ({type(module).__name__}): activation {activation!r} (the config's "
                f"hidden_act) has no form in ssmcc's ops; supported: {supported_list()}"
            )


@contextlib.contextmanager
def routed(model: nn.Module) -> Iterator[RoutingRecord]:
    """Install the model's routes for the duration of the block; always restore the originals.
    A mixer whose activation ssmcc's ops do not compute is refused first
    (``check_mixer_activations``)."""
    routes = routes_for(model)
    check_mixer_activations(model, routes)
    record = RoutingRecord(
        routes=[r.name for r in routes],
        layers=ssm_layers(model, routes),
        attention_layers=attention_layers(model, routes),
    )
    saved: list[tuple[object, str, object]] = []
    ACTIVE_ROUTINGS.append(record)
    try:
        for route in routes:
            module = sys.modules.get(route.module) or importlib.import_module(route.module)
            for path, replacement in route.replacements.items():
                owner, _, attribute = path.rpartition(".")
                target = functools.reduce(getattr, owner.split("."), module) if owner else module
                saved.append((target, attribute, getattr(target, attribute)))
                setattr(target, attribute, replacement)
        yield record
    finally:
        for module, attribute, original in reversed(saved):
            setattr(module, attribute, original)
        ACTIVE_ROUTINGS.remove(record)
