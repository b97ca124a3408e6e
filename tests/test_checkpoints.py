"""Checkpoint directories: mamba_ssm's format (config.json with d_model / n_layer / ssm_cfg, the
state-spaces names) and Hugging Face's, loaded with every tensor accounted for."""

from __future__ import annotations

import json

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError
from ssmcc.frontend.checkpoints import load_checkpoint

from .conftest import make_hf_model


def _mamba_ssm_dir(folder, model, layer: str, weights_file: str = "pytorch_model.bin") -> None:
    """Write ``model``'s weights in mamba_ssm's format: its config keys and tensor names."""
    c = model.config
    ssm_cfg = {"layer": layer, "d_state": c.state_size, "d_conv": c.conv_kernel, "expand": c.expand}
    if layer == "Mamba2":
        ssm_cfg.update(headdim=c.head_dim, ngroups=c.n_groups, chunk_size=c.chunk_size)
    else:
        ssm_cfg.update(dt_rank=c.time_step_rank)
    config = {
        "d_model": c.hidden_size,
        "d_intermediate": 0,
        "n_layer": c.num_hidden_layers,
        "vocab_size": c.vocab_size - 3,  # padded back up by pad_vocab_size_multiple
        "ssm_cfg": ssm_cfg,
        "attn_layer_idx": [],
        "attn_cfg": {},
        "rms_norm": True,
        "residual_in_fp32": True,
        "fused_add_norm": True,
        "pad_vocab_size_multiple": 8,
        "tie_embeddings": bool(c.tie_word_embeddings),
    }
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    state = {
        k.replace("backbone.embeddings.", "backbone.embedding."): v.clone()
        for k, v in model.state_dict().items()
    }
    if weights_file.endswith(".safetensors"):
        from safetensors.torch import save_file

        if c.tie_word_embeddings:
            state.pop("lm_head.weight")  # tied: stored once
        save_file(state, str(folder / weights_file))
    else:
        torch.save(state, folder / weights_file)


@pytest.mark.parametrize(
    "family,layer,weights_file",
    [
        ("mamba2", "Mamba2", "pytorch_model.bin"),
        ("mamba2", "Mamba2", "model.safetensors"),
        ("mamba", "Mamba1", "pytorch_model.bin"),
    ],
)
@pytest.mark.parametrize("tied", [True, False])
def test_mamba_ssm_checkpoint_compiles_to_the_same_logits(
    tmp_path, family, layer, weights_file, tied
):
    # 101 padded to a multiple of 8
    model = make_hf_model(family, vocab_size=104, tie_word_embeddings=tied)
    folder = tmp_path / "ckpt"
    _mamba_ssm_dir(folder, model, layer, weights_file)
    loaded = load_checkpoint(str(folder))
    assert type(loaded) is type(model)
    assert loaded.config.vocab_size == 104
    compiled = ssmcc.compile(loaded, target="torch")
    ids = torch.randint(0, 104, (2, 23))
    with torch.no_grad():
        expected = model(ids, use_cache=False).logits
    assert (compiled(ids) - expected).abs().max() <= 1e-4


def test_a_tensor_of_the_wrong_shape_is_named(tmp_path):
    model = make_hf_model("mamba2", vocab_size=104)
    folder = tmp_path / "bad"
    _mamba_ssm_dir(folder, model, "Mamba2")
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["backbone.layers.1.mixer.dt_bias"] = torch.zeros(5)
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(
        InputError,
        match=r"tensor backbone\.layers\.1\.mixer\.dt_bias has shape \(5,\), .* expects \(6,\)",
    ):
        load_checkpoint(str(folder))


def test_a_missing_tensor_is_named(tmp_path):
    model = make_hf_model("mamba2", vocab_size=104)
    folder = tmp_path / "short"
    _mamba_ssm_dir(folder, model, "Mamba2")
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    del state["backbone.layers.2.mixer.A_log"]
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(InputError, match=r"missing \['backbone\.layers\.2\.mixer\.A_log'\]"):
        load_checkpoint(str(folder))


def test_an_unsupported_mamba_ssm_option_is_named(tmp_path):
    model = make_hf_model("mamba2", vocab_size=104)
    folder = tmp_path / "hybrid"
    _mamba_ssm_dir(folder, model, "Mamba2")
    config = json.loads((folder / "config.json").read_text())
    config["attn_layer_idx"] = [1]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=r"attn_layer_idx = \[1\] has no Hugging Face equivalent"):
        load_checkpoint(str(folder))


def test_hugging_face_directory_with_a_missing_tensor_is_an_error(tmp_path):
    """from_pretrained would initialise it at random and only warn."""
    model = make_hf_model("mamba2")
    model.save_pretrained(tmp_path / "hf")
    from safetensors.torch import load_file, save_file

    path = tmp_path / "hf" / "model.safetensors"
    state = load_file(str(path))
    del state["backbone.layers.0.mixer.D"]
    save_file(state, str(path), metadata={"format": "pt"})
    with pytest.raises(InputError, match=r"missing \(would be initialised at random\).*mixer\.D"):
        load_checkpoint(str(tmp_path / "hf"))
    model.save_pretrained(tmp_path / "good")
    again = load_checkpoint(str(tmp_path / "good"))
    ids = torch.randint(0, 101, (1, 9))
    with torch.no_grad():
        assert torch.equal(again(ids).logits, model(ids).logits)
