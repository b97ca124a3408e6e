"""Text in, text out, offline: a checkpoint folder with a tokenizer -> an ONNX artifact -> text.

A real checkpoint folder (``hf download state-spaces/mamba-130m-hf --local-dir DIR`` on a machine
with network) holds a model and its tokenizer, both as ``save_pretrained`` writes them. Nothing
can be downloaded here, so this script makes such a folder: it trains a small byte-level BPE
tokenizer on the Zen of Python (the ``tokenizers`` library) and saves it beside a small Mamba
with random weights -- the text it generates is therefore gibberish, but every step is the one a
real checkpoint takes. Then:

- ``ssmcc.compile`` keeps the tokenizer found beside the checkpoint, and ``save`` writes it into
  the artifact (``ssmcc run ARTIFACT --prompt "..."`` uses it from the command line);
- ``generate`` takes a string (or a list of them, of any lengths) and returns text, stopping at
  the tokenizer's end-of-sequence token; ``stream_text`` yields text as it is generated.
"""

import codecs
import os
import tempfile

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    MambaConfig,
    MambaForCausalLM,
    PreTrainedTokenizerFast,
)

import ssmcc


def zen_of_python() -> str:
    import contextlib
    import importlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        this = importlib.import_module("this")
    return codecs.decode(this.s, "rot13")


def train_tokenizer(text: str, vocab_size: int = 400) -> PreTrainedTokenizerFast:
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(text.splitlines(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>")


def main() -> None:
    work = tempfile.mkdtemp(prefix="ssmcc-text-")
    checkpoint = os.path.join(work, "my-mamba")
    tokenizer = train_tokenizer(zen_of_python())
    torch.manual_seed(0)
    config = MambaConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2)
    MambaForCausalLM(config).save_pretrained(checkpoint)
    tokenizer.save_pretrained(checkpoint)

    model = AutoModelForCausalLM.from_pretrained(checkpoint)
    compiled = ssmcc.compile(model, target="onnx")  # keeps the tokenizer saved beside it
    print("text:", repr(compiled.generate("Beautiful is better than", 12)))
    print("streamed:", end=" ")
    for piece in compiled.stream_text("Errors should never", 12):
        print(repr(piece), end=" ", flush=True)
    print()
    batch = compiled.generate(["Simple", "Flat is better than nested.", "Now"], 8)
    print("a batch of three prompts of different lengths:", batch)

    artifact = os.path.join(work, "my-mamba.onnx.d")
    compiled.save(artifact)
    print("artifact:", sorted(os.listdir(artifact)))
    print("loaded:", repr(ssmcc.load(artifact).generate("Beautiful is better than", 12)))
    print(f"command line: ssmcc run {artifact} --prompt 'Beautiful is' --max-new-tokens 12")


if __name__ == "__main__":
    main()
