"""Options of ``compile`` and ``load``: defined once here, validated once here, one error type.

Common options (every target; ``stage`` says whether ``load`` takes them too):

    target      where the program runs: a registered target (``lowering/<name>/``)
    kernels     "auto": ssmcc's native kernels where they build here; "reference": the op
                library's PyTorch references / portable bodies                 (compile, load)
    chunk_size  prompt tokens per prefill chunk, >= 1 (default 256)           (compile, load)
    route       route known SSM layers (Hugging Face Mamba ...) to ssmcc ops at capture
    pipeline    pass pipeline run after capture ("default"; "none": the raw capture)
    dtype       the model's compute/activation dtype: None (as the model is), "float32",
                "bfloat16", "float16" (or the torch dtype); the model is captured from a copy in
                that dtype, the caller's model is left as it is
    quantize    how linear and embedding weights are stored (weight-only): "none" (as computed),
                "int8" (one scale per output channel), "int8-g32/64/128" (a scale per group of
                inputs), "bf16", "fp16"; compute stays in ``dtype``
    verify      run the IR verifier after every pass

A target adds options of its own (``Target.options``, e.g. the ONNX target's ``threads``) and says
which ``dtype`` / ``quantize`` values it implements; they are validated the same way. Every
refusal is an ``OptionError`` naming the option, the value and what is accepted.

This module imports nothing of ssmcc but ``errors`` (and torch, for dtypes): the API, the command
line (its choices and defaults), the runtime and the passes all read these definitions.
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ssmcc.errors import OptionError

DEFAULT_TARGET = "torch"
# Prompt tokens per prefill chunk. 256 measured fastest for last-token prefill of a 2048-token
# prompt on the ONNX target (mamba-130m: 1226 tok/s vs 1128 at 128, 1227 at 512; mamba2-130m:
# 974 vs 857 at 128, 966 at 512; Intel Xeon, 2 threads); it is also the prefix-cache granularity.
DEFAULT_CHUNK_SIZE = 256
KERNEL_CHOICES = ("auto", "reference")
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZE = ("none", "int8", "int8-g32", "int8-g64", "int8-g128", "bf16", "fp16")
COMPILE, LOAD = "compile", "load"


@dataclasses.dataclass(frozen=True)
class OptionSpec:
    """One option: its default, what it accepts, and when it applies.

    ``kind`` is the Python type of a value (bool is not an int here); ``choices`` a fixed set;
    ``minimum`` a lower bound for ints; ``nullable`` lets ``None`` through (meaning "not set").
    """

    name: str
    default: Any
    help: str
    kind: type = str
    choices: tuple | None = None
    minimum: int | None = None
    nullable: bool = False
    stages: tuple[str, ...] = (COMPILE,)
    metavar: str | None = None
    unit: str = ""

    def check(self, value, what: str = "") -> Any:
        """``value`` if acceptable, else ``OptionError`` naming the option and what it takes."""
        where = f" {what}" if what else ""
        if value is None and self.nullable:
            return None
        if self.kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            ok = ok and (self.minimum is None or value >= self.minimum)
            if not ok:
                kind = "a positive integer" if self.minimum == 1 else "an integer"
                if self.minimum not in (None, 1):
                    kind += f" >= {self.minimum}"
                unit = f" ({self.unit})" if self.unit else ""
                raise OptionError(f"{self.name}{where} must be {kind}{unit}, got {value!r}")
            return value
        if not isinstance(value, self.kind):
            raise OptionError(
                f"{self.name}{where} must be a {self.kind.__name__}, got {value!r} "
                f"({type(value).__name__})"
            )
        if self.choices is not None and value not in self.choices:
            accepted = ", ".join(repr(c) for c in self.choices)
            raise OptionError(f"{self.name}{where} must be one of {accepted}, got {value!r}")
        return value


COMMON_OPTIONS: dict[str, OptionSpec] = {
    spec.name: spec
    for spec in (
        OptionSpec(
            "kernels",
            "auto",
            "ssmcc's native kernels where they build here (auto), or the op library's PyTorch "
            "references / portable ONNX bodies (reference)",
            choices=KERNEL_CHOICES,
            stages=(COMPILE, LOAD),
        ),
        OptionSpec(
            "chunk_size",
            DEFAULT_CHUNK_SIZE,
            "prompt tokens per prefill chunk; activation memory is that of one chunk, and "
            "prefixes are cached at chunk boundaries",
            kind=int,
            minimum=1,
            stages=(COMPILE, LOAD),
            metavar="N",
            unit="tokens per chunk",
        ),
        OptionSpec(
            "route",
            True,
            "capture known SSM layers (Hugging Face Mamba, FalconMamba) as ssmcc ops; off: "
            "export the model's own code and let the passes find its scans",
            kind=bool,
        ),
        OptionSpec(
            "pipeline",
            "default",
            "pass pipeline: default (detect and fuse), unfused (detect, no fusion) or none (the "
            "raw capture)",
        ),
        OptionSpec(
            "dtype",
            None,
            "compute/activation dtype of the model (default: as the model is)",
            choices=DTYPES,
            nullable=True,
        ),
        OptionSpec(
            "quantize",
            "none",
            "how linear/embedding weights are stored (weight-only; compute stays in dtype)",
            choices=QUANTIZE,
        ),
        OptionSpec("verify", False, "run the IR verifier after every pass", kind=bool),
    )
}


def dtype_name(value):
    """``torch.bfloat16`` -> ``"bfloat16"``; any other value as it is (checked by its spec)."""
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


def check_chunk_size(chunk_size) -> int:
    """``chunk_size`` if it is a positive integer, else ``OptionError``."""
    return COMMON_OPTIONS["chunk_size"].check(chunk_size)


@dataclasses.dataclass(frozen=True)
class Options:
    """Validated options of one ``compile`` or ``load``; ``extra`` holds the target's own."""

    target: str
    kernels: str = "auto"
    chunk_size: int = DEFAULT_CHUNK_SIZE
    route: bool = True
    pipeline: str = "default"
    dtype: str | None = None
    quantize: str = "none"
    verify: bool = False
    extra: Mapping[str, Any] = dataclasses.field(default_factory=lambda: types.MappingProxyType({}))

    def __getitem__(self, name: str):
        """Any option by name, common or the target's own (its default when not given)."""
        if name in COMMON_OPTIONS:
            return getattr(self, name)
        return self.extra[name]


def resolve_options(
    target,
    stage: str,
    values: Mapping[str, Any],
    *,
    known_targets: Callable[[], list] = lambda: [],
    choices: Mapping[str, tuple] | None = None,
) -> Options:
    """Validate ``values`` for ``target`` (a registered ``Target``) at ``stage``.

    ``choices`` supplies choices known only at run time (e.g. the pipeline names);
    ``known_targets`` lists every target, so an option of another target is named as such.
    """
    choices = dict(choices or {})
    own = {spec.name: spec for spec in target.options}
    accepted = {
        name: spec for name, spec in {**COMMON_OPTIONS, **own}.items() if stage in spec.stages
    }
    resolved: dict[str, Any] = {}
    for name, value in values.items():
        spec = accepted.get(name)
        if spec is None:
            owners = [t.name for t in known_targets() if any(s.name == name for s in t.options)]
            if owners and target.name not in owners:
                raise OptionError(
                    f"option {name!r} belongs to target {', '.join(owners)}, not {target.name!r}"
                )
            if name in COMMON_OPTIONS or name in own:
                raise OptionError(f"option {name!r} applies to compile, not {stage}")
            listed = ", ".join(sorted(accepted))
            raise OptionError(
                f"unknown option {name!r} for {stage} (target {target.name!r}); options: {listed}"
            )
        if name in choices:
            spec = dataclasses.replace(spec, choices=tuple(choices[name]))
        if name == "dtype":
            value = dtype_name(value)
        resolved[name] = spec.check(value)
    for name, supported in (("dtype", target.dtypes), ("quantize", target.quantize)):
        value = resolved.get(name)
        if value is not None and value not in supported:
            raise OptionError(
                f"{name} {value!r} is not implemented by target {target.name!r} yet; "
                f"it implements: {', '.join(repr(s) for s in supported)}"
            )
    common = {k: v for k, v in resolved.items() if k in COMMON_OPTIONS}
    extra = {spec.name: spec.default for spec in own.values() if stage in spec.stages}
    extra.update({k: v for k, v in resolved.items() if k in own})
    return Options(target=target.name, **common, extra=types.MappingProxyType(extra))
