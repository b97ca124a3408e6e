"""A real tokenizer for tests, trained offline, and small models saved beside it.

``bpe_tokenizer()`` trains a byte-level BPE (``tokenizers``, the library behind Hugging Face's
fast tokenizers) to ``VOCAB`` tokens on the text of ``trained_models.corpus()`` (the Zen of
Python and the ``textwrap`` source: no download) with one special token, ``<|endoftext|>``
(id 0, the end of sequence), and wraps it as a ``PreTrainedTokenizerFast``. Training takes well
under a second. Text outside the corpus' characters still encodes: byte-level BPE falls back to
one token per byte (so a non-ASCII character can span several tokens).

``model_folder(path, family)`` writes what a user's checkpoint folder holds: a Hugging Face
model (random weights, seeded) with ``save_pretrained`` and the tokenizer beside it.
"""

from __future__ import annotations

import functools

import torch
import transformers

from .trained_models import corpus

VOCAB = 1024
EOS = "<|endoftext|>"

# family -> the preset whose config (vocabulary replaced by the tokenizer's) the folder's model has
FAMILIES = {"mamba": "mamba-tiny", "mamba2": "mamba2-tiny"}


@functools.cache
def _trained():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    text = corpus().decode("utf-8")
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    return tokenizer.to_str()


def bpe_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A fresh ``PreTrainedTokenizerFast`` of the trained BPE (``VOCAB`` tokens, EOS id 0)."""
    from tokenizers import Tokenizer

    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(_trained()), eos_token=EOS
    )


def model_folder(path, family: str = "mamba", seed: int = 0) -> str:
    """A checkpoint folder at ``path``: the family's model (random weights from ``seed``, vocab
    = the tokenizer's) and the tokenizer, both with ``save_pretrained``; returns the path."""
    from ssmcc.presets import PRESETS

    preset = PRESETS[FAMILIES[family]]
    config = preset.build_config()
    config.vocab_size = VOCAB
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = getattr(transformers, preset.model_class)(config).eval()
    model.save_pretrained(path)
    bpe_tokenizer().save_pretrained(path)
    return str(path)
