"""Built-in model presets: Hugging Face model classes built from configs with random weights.

Nothing can be downloaded here, so every preset is constructed locally (seeded, reproducible).
``load_model(spec)`` also accepts a local checkpoint directory (Hugging Face or mamba_ssm).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable

import torch
from torch import nn

from ssmcc.errors import InputError
from ssmcc.presets_hybrid import HYBRIDS


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


def _mamba2_config(**overrides):
    from transformers import Mamba2Config

    return Mamba2Config(**overrides)


def _hybrid_config(config_class: str, **keywords):
    import transformers

    return getattr(transformers, config_class)(**keywords)


# state-spaces/mamba2-130m: hidden 768, 24 layers, 24 heads of 64, 1 group, state 128, chunk 256.
_MAMBA2_130M = dict(
    vocab_size=50288,
    hidden_size=768,
    num_hidden_layers=24,
    state_size=128,
    head_dim=64,
    num_heads=24,
    n_groups=1,
    expand=2,
    conv_kernel=4,
    chunk_size=256,
)
_MAMBA2_TINY = dict(
    vocab_size=512,
    hidden_size=64,
    num_hidden_layers=2,
    state_size=16,
    head_dim=16,
    num_heads=8,
    n_groups=2,
    expand=2,
    conv_kernel=4,
    chunk_size=16,
)
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
        Preset(
            "mamba2-tiny",
            "Mamba-2, 2 layers, hidden 64, 8 heads of 16 in 2 groups, state 16, vocab 512",
            lambda: _mamba2_config(**_MAMBA2_TINY),
            "Mamba2ForCausalLM",
        ),
        Preset(
            "mamba2-130m",
            "Mamba-2 at the mamba2-130m shape: 24 layers, hidden 768, 24 heads of 64, "
            "state 128, vocab 50288 (random weights)",
            lambda: _mamba2_config(**_MAMBA2_130M),
            "Mamba2ForCausalLM",
        ),
    )
}
PRESETS.update(
    {
        name: Preset(
            name,
            description,
            lambda config_class=config_class, keywords=keywords: _hybrid_config(
                config_class, **keywords
            ),
            model_class,
        )
        for name, (config_class, model_class, keywords, description) in HYBRIDS.items()
    }
)

DEFAULT_PRESET = "mamba-tiny"
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def build_preset(name: str, seed: int = 0) -> nn.Module:
    """The preset's model in eval mode, weights from ``torch.manual_seed(seed)``."""
    import transformers

    preset = PRESETS[name]
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, preset.model_class)(preset.build_config())
    return model.eval()


def check_model_spec(spec: str) -> None:
    """``InputError`` unless ``spec`` is a local directory or a preset name; a name shaped like a
    Hugging Face Hub id (``org/name``) gets how to put that checkpoint on disk."""
    if os.path.isdir(spec) or spec in PRESETS:
        return
    if os.path.exists(spec):
        raise InputError(f"{spec} is a file; a model is a directory (config.json + weights)")
    if _HUB_ID.fullmatch(spec):
        folder = "./" + spec.rsplit("/", 1)[1]
        raise InputError(
            f"{spec!r} is not a local directory; if it is a Hugging Face Hub id, ssmcc downloads "
            f"nothing: on a machine with network run 'hf download {spec} --local-dir {folder}' "
            f"(huggingface_hub's CLI), then pass {folder}"
        )
    known = ", ".join(PRESETS)
    raise InputError(
        f"{spec!r} is neither a local model directory nor a preset; presets: {known}. "
        "(Nothing is downloaded: save a model with save_pretrained, or fetch a checkpoint with "
        "'hf download REPO --local-dir DIR', and pass its directory.)"
    )


def load_model(spec: str) -> nn.Module:
    """A local model directory (Hugging Face or mamba_ssm format: ``config.json`` + weights;
    ``ssmcc.frontend.checkpoints``) or a preset name."""
    check_model_spec(spec)
    if os.path.isdir(spec):
        from ssmcc.frontend.checkpoints import load_checkpoint

        return load_checkpoint(spec)
    return build_preset(spec)
