"""Text in, text out: a trained BPE tokenizer saved beside a model, kept in the artifact, used by
``generate``/``stream_text`` and ``ssmcc run --prompt``; checked token for token against Hugging
Face ``generate`` with the same tokenizer."""

from __future__ import annotations

import json
import os

import pytest
import torch
import transformers

import ssmcc
from ssmcc.cli import main
from ssmcc.errors import ArtifactError, InputError
from ssmcc.runtime.text import TextStream, before_eos, decode

from .text_models import EOS, VOCAB, bpe_tokenizer, model_folder

PROMPT = "Beautiful is better than"


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return model_folder(tmp_path_factory.mktemp("checkpoint") / "mamba", "mamba")


def hf_text(folder: str, prompt: str, new: int) -> tuple[str, list[int]]:
    """Hugging Face's greedy text and new token ids (up to EOS) for ``prompt``."""
    model = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(prompt, return_tensors="pt")
    out = model.generate(
        **encoded, max_new_tokens=new, do_sample=False, eos_token_id=tokenizer.eos_token_id
    )
    prompt_length = encoded["input_ids"].shape[1]
    new_ids = before_eos(out[0, prompt_length:], tokenizer.eos_token_id).tolist()
    return tokenizer.decode(out[0], skip_special_tokens=True), new_ids


def test_the_tokenizer_is_trained_and_round_trips():
    tokenizer = bpe_tokenizer()
    assert len(tokenizer) == VOCAB and tokenizer.eos_token == EOS and tokenizer.eos_token_id == 0
    ids = tokenizer(PROMPT)["input_ids"]
    assert len(ids) < len(PROMPT) / 2  # merges learnt from the corpus, not one token per byte
    assert tokenizer.decode(ids) == PROMPT


@pytest.mark.parametrize("target", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
def test_generate_text_matches_hugging_face(folder, target, tmp_path):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    compiled = ssmcc.compile(model, target)  # tokenizer="auto": the one beside the checkpoint
    assert compiled.tokenizer is not None
    expected_text, expected_ids = hf_text(folder, PROMPT, 12)
    assert compiled.generate(PROMPT, 12) == expected_text
    assert "".join(compiled.stream_text(PROMPT, 12)) == expected_text[len(PROMPT) :]
    # a list of prompts of different token lengths: each row as it is alone
    other = "Errors should never pass"
    assert compiled.generate([PROMPT, other], 12) == [expected_text, hf_text(folder, other, 12)[0]]
    ids = torch.tensor([compiled.tokenizer(PROMPT)["input_ids"]])
    new = compiled.generate(ids, 12, eos_token_id=0)[0, ids.shape[1] :]
    assert before_eos(new, 0).tolist() == expected_ids

    compiled.save(str(tmp_path / "artifact"))
    manifest = json.loads((tmp_path / "artifact" / "manifest.json").read_text())
    assert manifest["tokenizer"]["eos_token_id"] == 0
    assert set(manifest["tokenizer"]["files"]) <= set(manifest["files"])
    loaded = ssmcc.load(str(tmp_path / "artifact"))
    assert loaded.generate(PROMPT, 12) == expected_text


def test_a_changed_tokenizer_file_fails_the_artifact_check(folder, tmp_path):
    compiled = ssmcc.compile(transformers.AutoModelForCausalLM.from_pretrained(folder), "torch")
    out = tmp_path / "artifact"
    compiled.save(str(out))
    with open(out / "tokenizer.json", "a") as f:
        f.write(" ")
    with pytest.raises(ArtifactError, match="tokenizer.json"):
        ssmcc.load(str(out))


def test_eos_stops_text_generation(folder):
    """EOS set to the third token the model generates: the text ends before its first
    occurrence, in generate and stream_text alike."""
    compiled = ssmcc.compile(transformers.AutoModelForCausalLM.from_pretrained(folder), "torch")
    tokenizer = compiled.tokenizer
    prompt_ids = tokenizer(PROMPT)["input_ids"]
    free = compiled.generate(torch.tensor([prompt_ids]), 8)[0, len(prompt_ids) :]
    eos = int(free[2])
    expected = decode(tokenizer, prompt_ids + before_eos(free, eos).tolist())
    assert compiled.generate(PROMPT, 8, eos_token_id=eos) == expected
    assert PROMPT + "".join(compiled.stream_text(PROMPT, 8, eos_token_id=eos)) == expected


def test_text_stream_holds_back_incomplete_characters():
    """Byte-level BPE splits a non-ASCII character into byte tokens: no piece ends inside one,
    and the pieces add up to the decoded text."""
    tokenizer = bpe_tokenizer()
    text = "naïve café ☃ — 🐍 done"
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > len(text.split())  # the accented characters and symbols take byte tokens
    stream = TextStream(tokenizer, ids[:1])
    pieces = [stream.add(token) for token in ids[1:]]
    assert "" in pieces  # at least one token ended inside a character
    assert all("\ufffd" not in piece for piece in pieces)
    assert tokenizer.decode(ids[:1]) + "".join(pieces) == text


def test_a_tokenizer_must_fit_the_vocabulary():
    from ssmcc.presets import build_preset

    small = transformers.MambaForCausalLM(
        transformers.MambaConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1)
    )
    with pytest.raises(InputError, match=f"the tokenizer has {VOCAB} tokens"):
        ssmcc.compile(small, "torch", tokenizer=bpe_tokenizer())
    compiled = ssmcc.compile(build_preset("mamba-tiny"), "torch")
    assert compiled.tokenizer is None
    with pytest.raises(InputError, match="has no tokenizer"):
        compiled.generate("hello", 4)
    with pytest.raises(InputError, match="not a Hugging Face tokenizer|without"):
        ssmcc.compile(build_preset("mamba-tiny"), "torch", tokenizer=object())


def test_mamba2_from_a_folder_with_an_explicit_tokenizer(tmp_path):
    folder = model_folder(tmp_path / "mamba2", "mamba2")
    model = transformers.AutoModelForCausalLM.from_pretrained(folder)
    compiled = ssmcc.compile(model, "onnx", tokenizer=folder)  # a folder path works too
    assert compiled.generate(PROMPT, 10) == hf_text(folder, PROMPT, 10)[0]


def test_cli_compile_and_run_text(folder, tmp_path, capsys):
    out = str(tmp_path / "A")
    assert main(["compile", folder, "--target", "onnx", "--out", out]) == 0
    err = capsys.readouterr().err
    assert "keeping the tokenizer" in err
    # quiet: ssmcc's own lines only (transformers' progress bars and warnings need -v)
    assert all(line.startswith("[ssmcc] ") for line in err.splitlines()), err
    assert sorted(set(os.listdir(out)) & {"tokenizer.json", "tokenizer_config.json"})
    assert main(["run", out, "--prompt", PROMPT, "--max-new-tokens", "8"]) == 0
    captured = capsys.readouterr()
    text, new_ids = hf_text(folder, PROMPT, 8)
    assert captured.out == text + "\n"
    produced = min(8, len(new_ids) + 1)  # the tokens before EOS, and EOS when it came
    assert f"] {produced} token(s); time to first token" in captured.err  # tokens, not pieces
    assert all(line.startswith("[ssmcc] ") for line in captured.err.splitlines()), captured.err
    # a model folder is compiled (torch target) and keeps its tokenizer too
    assert main(["run", folder, "--prompt", PROMPT, "--max-new-tokens", "8"]) == 0
    assert capsys.readouterr().out == captured.out


def test_cli_prompt_needs_a_tokenizer(tmp_path, capsys):
    out = str(tmp_path / "B")
    assert main(["compile", "mamba-tiny", "--out", out]) == 0
    capsys.readouterr()
    assert main(["run", out, "--prompt", "hello"]) == 1
    err = capsys.readouterr().err
    assert "has no tokenizer" in err and "--prompt-ids" in err
