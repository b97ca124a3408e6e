"""Text in, text out: the model's tokenizer kept with the compiled model, text decoded as it goes.

A tokenizer is what Hugging Face's ``save_pretrained`` writes (``tokenizer.json`` and/or
``tokenizer_config.json`` + vocabulary files); ssmcc keeps it in the artifact as those files and
opens it again with ``AutoTokenizer.from_pretrained`` (local files only: nothing is downloaded).
Text is encoded with the tokenizer's own special tokens (``tokenizer(text)``, as Hugging Face
users call it) and decoded without them.

``TextStream`` turns a stream of token ids into text pieces: after each token it decodes the whole
sequence and emits what was not emitted yet, holding back trailing replacement characters (what
an incomplete UTF-8 character decodes to: a byte-level BPE token can hold part of one) until a
later token completes the character or follows it, or the stream ends (``flush``).
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile

import torch

from ssmcc.errors import InputError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
REPLACEMENT = "\ufffd"  # what decoding yields for an incomplete UTF-8 sequence


def has_tokenizer(folder: str) -> bool:
    return any(os.path.isfile(os.path.join(folder, name)) for name in TOKENIZER_FILES)


def load_tokenizer(folder: str):
    """The tokenizer saved in ``folder`` (Hugging Face's files), or ``InputError`` saying why."""
    from transformers import AutoTokenizer

    if not has_tokenizer(folder):
        raise InputError(
            f"{folder} holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); save one "
            "beside the model with tokenizer.save_pretrained(folder)"
        )
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    except Exception as error:  # transformers' and tokenizers' own exception types
        raise InputError(
            f"{folder}: the tokenizer could not be read ({type(error).__name__}: {error})"
        ) from error


def load_saved_tokenizer(files, names: list[str]):
    """The tokenizer an artifact keeps, from its verified files (``ArtifactFiles``): written to a
    private scratch folder and read from there, never from the artifact's directory."""
    with tempfile.TemporaryDirectory(prefix="ssmcc-tokenizer-") as scratch:
        for name in names:
            files.copy_to(name, os.path.join(scratch, name))
        tokenizer = load_tokenizer(scratch)
    return tokenizer


def tokenizer_of(model, tokenizer):
    """The tokenizer ``compile`` keeps: ``tokenizer`` itself, one read from a folder path, or for
    ``"auto"`` the one saved beside the checkpoint ``model`` was loaded from (a local folder that
    ``model.name_or_path`` names), else None. ``None``/``False``: no tokenizer."""
    if tokenizer is None or tokenizer is False:
        return None
    if isinstance(tokenizer, (str, os.PathLike)) and tokenizer != "auto":
        return load_tokenizer(os.fspath(tokenizer))
    if tokenizer == "auto":
        folder = getattr(model, "name_or_path", "") or ""
        if isinstance(folder, str) and os.path.isdir(folder) and has_tokenizer(folder):
            return load_tokenizer(folder)
        return None
    for needed in ("save_pretrained", "decode", "__call__"):
        if not hasattr(tokenizer, needed):
            raise InputError(
                f"tokenizer must be a Hugging Face tokenizer (or its folder), got "
                f"{type(tokenizer).__name__} without {needed}"
            )
    return tokenizer


def check_tokenizer_fits(tokenizer, vocab_size: int | None) -> None:
    if tokenizer is None or vocab_size is None:
        return
    if len(tokenizer) > vocab_size:
        raise InputError(
            f"the tokenizer has {len(tokenizer)} tokens, the model's vocabulary {vocab_size}: "
            "they do not belong together (pass the tokenizer saved with this model)"
        )


def save_tokenizer(tokenizer, folder: str, taken: set[str]) -> dict:
    """Write the tokenizer's files into ``folder`` (beside a target's files, none of whose names
    they may take); returns the manifest entry."""
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer.save_pretrained(scratch)
        names = sorted(os.listdir(scratch))
        clash = [
            name
            for name in names
            if name in taken or not os.path.isfile(os.path.join(scratch, name))
        ]
        if clash:
            raise InputError(
                f"the tokenizer writes {', '.join(clash)}, which the artifact already has or "
                "which are not plain files"
            )
        for name in names:
            os.replace(os.path.join(scratch, name), os.path.join(folder, name))
    return {
        "files": names,
        "class": type(tokenizer).__name__,
        "eos_token_id": tokenizer.eos_token_id,
    }


def encode(tokenizer, text, index: int) -> torch.Tensor:
    """The ids of prompt ``index`` (a string), with the tokenizer's special tokens."""
    if not isinstance(text, str):
        raise InputError(
            f"prompt {index} is a {type(text).__name__}; a list of text prompts holds strings"
        )
    ids = tokenizer(text)["input_ids"]
    if not ids:
        raise InputError(
            f"prompt {index} ({text!r}) encodes to no tokens; give at least one character"
        )
    return torch.tensor(ids, dtype=torch.long)


def decode(tokenizer, ids) -> str:
    return tokenizer.decode([int(i) for i in ids], skip_special_tokens=True)


def before_eos(tokens: torch.Tensor, eos_token_id) -> torch.Tensor:
    """``tokens`` (1-D) before the first of the ``eos_token_id`` (one id or a list of them: the
    text ends there)."""
    if eos_token_id is None:
        return tokens
    ids = eos_token_id if isinstance(eos_token_id, (list, tuple)) else [eos_token_id]
    hits = torch.isin(tokens, torch.tensor(ids, dtype=tokens.dtype)).nonzero()
    return tokens if hits.numel() == 0 else tokens[: int(hits[0])]


class TextStream:
    """Text pieces of one row: ``add(token)`` returns what that token adds to the decoded text
    (possibly "" while a character is incomplete), ``flush()`` what is still held back."""

    def __init__(self, tokenizer, prompt_ids):
        self.tokenizer = tokenizer
        self.ids = [int(i) for i in prompt_ids]
        self.shown = decode(tokenizer, self.ids).rstrip(REPLACEMENT)

    def add(self, token: int) -> str:
        self.ids.append(int(token))
        return self._show(decode(self.tokenizer, self.ids).rstrip(REPLACEMENT))

    def flush(self) -> str:
        return self._show(decode(self.tokenizer, self.ids))

    def _show(self, text: str) -> str:
        shared = len(os.path.commonprefix([self.shown, text]))
        self.shown = text  # a change before the end (rare) cannot be taken back: it is resent
        return text[shared:]
