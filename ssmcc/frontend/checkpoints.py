"""Model directories on disk -> Hugging Face models, with nothing left randomly initialised.

Two formats are read:

- Hugging Face (``config.json`` with a ``model_type``, weights as ``save_pretrained`` writes
  them): ``from_pretrained``, then every missing, unexpected or mis-shaped tensor is an error
  naming it (HF only warns and initialises such weights at random).
- mamba_ssm (``config.json`` with ``d_model``, ``n_layer``, ``ssm_cfg``, ``vocab_size``,
  ``pad_vocab_size_multiple``, ...; weights in ``pytorch_model.bin`` or ``model.safetensors``
  under mamba_ssm's names ``backbone.embedding.weight``, ``backbone.layers.N.mixer.*``,
  ``backbone.layers.N.norm.weight``, ``backbone.norm_f.weight``, ``lm_head.weight``), the format
  of the ``state-spaces/mamba-*`` and ``mamba2-*`` checkpoints: the config is mapped to
  ``MambaConfig`` (``ssm_cfg.layer`` "Mamba1" or absent) or ``Mamba2Config`` ("Mamba2"), the
  vocabulary padded up to its multiple, and every tensor must be present with the shape the HF
  model expects (an error names the tensor and both shapes).

``pytorch_model.bin`` is read with ``torch.load(weights_only=True)``: tensors only, no code.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import InputError

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
# mamba_ssm config keys that a Hugging Face Mamba/Mamba2 model cannot represent, with the value
# it requires.
_UNSUPPORTED = {
    "attn_layer_idx": [],
    "d_intermediate": 0,
    "rms_norm": True,
}
_MAMBA2_UNSUPPORTED = {"D_has_hdim": False, "rmsnorm": True, "norm_before_gate": False}


def is_mamba_ssm_config(config: dict) -> bool:
    return "model_type" not in config and "d_model" in config and "n_layer" in config


def _padded_vocab(config: dict) -> int:
    vocab, multiple = config["vocab_size"], config.get("pad_vocab_size_multiple", 1)
    return vocab + (-vocab) % multiple


def _check_supported(folder: str, entries: dict, required: dict, where: str) -> None:
    for key, value in required.items():
        if key in entries and entries[key] != value:
            raise InputError(
                f"{folder}/config.json: {where}{key} = {entries[key]!r} has no Hugging Face "
                f"equivalent (ssmcc reads mamba_ssm checkpoints with {key} = {value!r})"
            )


def hf_config_of_mamba_ssm(folder: str, config: dict):
    """The Hugging Face config of a mamba_ssm ``config.json``."""
    import transformers

    _check_supported(folder, config, _UNSUPPORTED, "")
    ssm = dict(config.get("ssm_cfg") or {})
    layer = ssm.pop("layer", "Mamba1")
    common = dict(
        hidden_size=config["d_model"],
        num_hidden_layers=config["n_layer"],
        vocab_size=_padded_vocab(config),
        residual_in_fp32=config.get("residual_in_fp32", True),
        tie_word_embeddings=config.get("tie_embeddings", True),
        layer_norm_epsilon=config.get("norm_epsilon", 1e-5),
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    if layer == "Mamba2":
        _check_supported(folder, ssm, _MAMBA2_UNSUPPORTED, "ssm_cfg.")
        expand, head_dim = ssm.get("expand", 2), ssm.get("headdim", 64)
        limit = ssm.get("dt_limit", (0.0, float("inf")))
        return transformers.Mamba2Config(
            **common,
            state_size=ssm.get("d_state", 128),
            conv_kernel=ssm.get("d_conv", 4),
            expand=expand,
            head_dim=head_dim,
            num_heads=expand * config["d_model"] // head_dim,
            n_groups=ssm.get("ngroups", 1),
            chunk_size=ssm.get("chunk_size", 256),
            use_bias=ssm.get("bias", False),
            use_conv_bias=ssm.get("conv_bias", True),
            time_step_limit=tuple(limit),
        )
    if layer == "Mamba1":
        return transformers.MambaConfig(
            **common,
            state_size=ssm.get("d_state", 16),
            conv_kernel=ssm.get("d_conv", 4),
            expand=ssm.get("expand", 2),
            time_step_rank=ssm.get("dt_rank", "auto"),
            use_bias=ssm.get("bias", False),
            use_conv_bias=ssm.get("conv_bias", True),
        )
    raise InputError(f"{folder}/config.json: ssm_cfg.layer = {layer!r}; ssmcc reads Mamba1, Mamba2")


def _read_weights(folder: str) -> dict[str, torch.Tensor]:
    for name in WEIGHT_FILES:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        if name.endswith(".safetensors"):
            from safetensors.torch import load_file

            return load_file(path)
        return torch.load(path, map_location="cpu", weights_only=True)
    raise InputError(f"{folder} holds no weights: expected one of {', '.join(WEIGHT_FILES)}")


def _hf_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """mamba_ssm names -> Hugging Face names (only the embedding is named differently)."""
    renamed = {}
    for key, tensor in weights.items():
        key = key.removeprefix("model.")
        renamed[key.replace("backbone.embedding.", "backbone.embeddings.")] = tensor
    return renamed


def load_mamba_ssm(folder: str, config: dict) -> nn.Module:
    """The HF model of a mamba_ssm checkpoint directory, every tensor checked."""
    import transformers

    hf_config = hf_config_of_mamba_ssm(folder, config)
    model_class = (
        transformers.Mamba2ForCausalLM
        if isinstance(hf_config, transformers.Mamba2Config)
        else transformers.MambaForCausalLM
    )
    with torch.device("meta"):
        model = model_class(hf_config)
    weights = _hf_names(_read_weights(folder))
    expected = model.state_dict()
    if hf_config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
        expected.pop("lm_head.weight", None)
    missing = [k for k in expected if k not in weights]
    unexpected = [k for k in weights if k not in expected]
    if missing or unexpected:
        raise InputError(
            f"{folder}: the weights do not fit {model_class.__name__} "
            f"({config['n_layer']} layers, d_model {config['d_model']}): missing "
            f"{missing[:5] or 'none'}, unexpected {unexpected[:5] or 'none'}"
        )
    for key, tensor in expected.items():
        if tuple(weights[key].shape) != tuple(tensor.shape):
            raise InputError(
                f"{folder}: tensor {key} has shape {tuple(weights[key].shape)}, the model built "
                f"from config.json expects {tuple(tensor.shape)}"
            )
    model.load_state_dict(weights, strict=False, assign=True)
    if hf_config.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def load_hf(folder: str) -> nn.Module:
    """``from_pretrained`` with every loading anomaly an error instead of a warning."""
    from transformers import AutoModelForCausalLM

    try:
        model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    except Exception as error:
        raise InputError(f"could not load the model in {folder}: {error}") from error
    problems = {
        "missing (would be initialised at random)": sorted(info.get("missing_keys") or ()),
        "unexpected": sorted(info.get("unexpected_keys") or ()),
        "of another shape": sorted(str(m) for m in info.get("mismatched_keys") or ()),
    }
    listed = "; ".join(f"{what}: {names[:5]}" for what, names in problems.items() if names)
    if listed:
        raise InputError(f"{folder}: the weights do not fit the config: {listed}")
    return model.eval()


def load_checkpoint(folder: str) -> nn.Module:
    """The model in a Hugging Face or mamba_ssm checkpoint directory (see the module doc)."""
    path = os.path.join(folder, "config.json")
    if not os.path.isfile(path):
        raise InputError(
            f"{folder} is a directory but has no config.json: pass a directory written by "
            "save_pretrained or a mamba_ssm checkpoint directory"
        )
    with open(path, "rb") as f:
        config = loads_bounded(f.read(), path, error=InputError)
    if not isinstance(config, dict):
        raise InputError(f"{path} is not a JSON object: it is not a model's config")
    if is_mamba_ssm_config(config):
        return load_mamba_ssm(folder, config)
    return load_hf(folder)
