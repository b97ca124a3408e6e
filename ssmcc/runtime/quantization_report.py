"""How far a weight-quantised program is from the float program it came from.

``reference_logits(float_program, prompts)`` runs the float program before it is quantized and
``quantization_accuracy(expected, quantized, prompts)`` the quantized one (both their PyTorch
references: exactly the math of the IR) on the same prompts; the logits are compared at every
position: the cosine similarity of each position's logit vector (min and mean over positions)
and the top-1 agreement (the fraction of positions whose arg-max token is the same). The compile
report carries them (``CompileReport.quantization``); ``ssmcc inspect`` prints them.

``fixed_prompts(vocab_size)``: the prompts used when the caller gives none — ``PROMPTS`` sequences
of ``PROMPT_LENGTH`` token ids drawn from a generator with a fixed seed, the same on every run.
"""

from __future__ import annotations

import torch
from torch.export import ExportedProgram

from ssmcc.file_pages import run_releasing_weights

PROMPTS = 4
PROMPT_LENGTH = 32
SEED = 20261202


def fixed_prompts(vocab_size: int, count: int = PROMPTS, length: int = PROMPT_LENGTH):
    generator = torch.Generator().manual_seed(SEED)
    return torch.randint(0, vocab_size, (count, length), generator=generator)


def reference_logits(program: ExportedProgram, inputs: tuple) -> torch.Tensor:
    """The program's logits (positions, vocab) on ``inputs``, as float32. The program runs node
    by node, each memory-mapped weight given back to the file after its last reader
    (``ssmcc.file_pages``), so measuring a float model costs about one layer of its weights."""
    with torch.no_grad():
        out = run_releasing_weights(program.module(), *inputs)
    out = out[0] if isinstance(out, tuple | list) else out
    return out.float().reshape(-1, out.shape[-1])


def quantization_accuracy(
    expected: torch.Tensor, quantized: ExportedProgram, inputs: tuple
) -> dict:
    """Logit cosine (min, mean over positions) and top-1 agreement of ``quantized`` on
    ``inputs`` (a language model's: one (batch, length) tensor of token ids; any other
    program's: its example inputs, the last axis of the first output compared) against
    ``expected``, the float program's ``reference_logits`` on the same inputs."""
    got = reference_logits(quantized, inputs)
    cosine = torch.nn.functional.cosine_similarity(expected, got, dim=-1)
    agree = (expected.argmax(-1) == got.argmax(-1)).float()
    return {
        "prompts": int(inputs[0].shape[0]),
        "positions": int(expected.shape[0]),
        "logit_cosine_min": round(float(cosine.min()), 6),
        "logit_cosine_mean": round(float(cosine.mean()), 6),
        "top1_agreement": round(float(agree.mean()), 4),
    }
