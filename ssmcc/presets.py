"""Built-in model presets: Hugging Face model classes built from configs with random weights.

Nothing can be downloaded here, so every preset is constructed locally (seeded, reproducible).
``load_model(spec)`` also accepts a local directory as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import torch
from torch import nn

from ssmcc.errors import InputError


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    description: str
    build_config: Callable[[], object]
    model_class: str


def _mamba_config(**overrides):
    from transformers import MambaConfig

    return MambaConfig(**overrides)


def _falcon_mamba_config(**overrides):
    from transformers import FalconMambaConfig

    return FalconMambaConfig(**overrides)


_MAMBA_130M = dict(
    vocab_size=50280, hidden_size=768, state_size=16, num_hidden_layers=24, expand=2, conv_kernel=4
)
_TINY = dict(
    vocab_size=512, hidden_size=64, state_size=16, num_hidden_layers=2, expand=2, conv_kernel=4
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        Preset(
            "mamba-tiny",
            "Mamba-1, 2 layers, hidden 64, state 16, vocab 512 (seconds)",
            lambda: _mamba_config(**_TINY),
            "MambaForCausalLM",
        ),
        Preset(
            "falcon-mamba-tiny",
            "FalconMamba, 2 layers, hidden 64, state 16, vocab 512",
            lambda: _falcon_mamba_config(**_TINY),
            "FalconMambaForCausalLM",
        ),
        Preset(
            "mamba-130m",
            "Mamba-1 at the mamba-130m shape: 24 layers, hidden 768, "
            "state 16, vocab 50280 (random weights)",
            lambda: _mamba_config(**_MAMBA_130M),
            "MambaForCausalLM",
        ),
        Preset(
            "falcon-mamba-130m",
            "FalconMamba at the mamba-130m shape (random weights)",
            lambda: _falcon_mamba_config(**_MAMBA_130M),
            "FalconMambaForCausalLM",
        ),
    )
}

DEFAULT_PRESET = "mamba-tiny"


def build_preset(name: str, seed: int = 0) -> nn.Module:
    """The preset's model in eval mode, weights from ``torch.manual_seed(seed)``."""
    import transformers

    preset = PRESETS[name]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, preset.model_class)(preset.build_config())
    return model.eval()


def load_model(spec: str) -> nn.Module:
    """A local Hugging Face model directory (``config.json`` + weights) or a preset name."""
    if os.path.isdir(spec):
        if not os.path.isfile(os.path.join(spec, "config.json")):
            raise InputError(
                f"{spec} is a directory but has no config.json: pass a directory written by "
                "save_pretrained, or a preset name"
            )
        from transformers import AutoModelForCausalLM

        try:
            return AutoModelForCausalLM.from_pretrained(spec).eval()
        except Exception as error:
            raise InputError(f"could not load the model in {spec}: {error}") from error
    if spec in PRESETS:
        return build_preset(spec)
    known = ", ".join(PRESETS)
    raise InputError(
        f"{spec!r} is neither a local model directory nor a preset; presets: {known}. "
        "(Nothing is downloaded: save a model with save_pretrained and pass its directory.)"
    )
