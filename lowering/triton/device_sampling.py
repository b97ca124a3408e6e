"""Choosing the next tokens on the device, inside the captured decode step, with per-row settings
read from static buffers (so one captured graph serves every temperature, top-k and top-p).

Modes (``sampling_mode``), the math of ``ssmcc.runtime.generation.choose``:

    greedy   token = argmax(logits)
    sample   s = logits / T;  token ~ softmax(s)
    filter   s = logits / T, sorted descending (o = the order); keep the first k (ties with the
             k-th kept); then keep the shortest prefix whose softmax mass reaches top_p (an entry
             is dropped when the mass before it is >= top_p; top_p = 1 drops nothing);
             token = o[i], i ~ softmax(kept s)

The draw is the exponential race: with E_i ~ Exp(1) independent, argmax_i p_i / E_i is
distributed as p (min_i E_i / p_i is exponential with rate p_i; the smallest wins), so a draw
is one division and one argmax over the vocabulary, with no host synchronisation, and
``torch.multinomial``'s cumulative search is not needed. The E_i ("noise", (rows, vocab)) are
drawn by a ``torch.Generator`` on the device before each step, outside the captured graph (an
ordinary launch on the same stream), so the graph holds no random-number state of its own.

Seeds: the same seed gives the same tokens on the same target with the same batch and settings,
not across targets (the torch and ONNX targets and the triton target's eager path draw with
``torch.multinomial`` on the CPU) and not across devices or torch versions (the generator's
stream is torch's).
"""

from __future__ import annotations

import torch

GREEDY, SAMPLE, FILTER = "greedy", "sample", "filter"
TINY = 1e-20  # an Exp(1) draw of exactly 0 would make its entry win whatever its probability


def sampling_mode(sampling) -> str:
    """Which captured sampler a generation's settings (``Sampling``) need."""
    if not sampling.do_sample:
        return GREEDY
    filters = sampling.top_k is not None or (sampling.top_p is not None and sampling.top_p < 1)
    return FILTER if filters else SAMPLE


def filtered_scores(logits, temperature, top_k, top_p) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores sorted descending with the dropped ones -inf, their order) for logits (b, V) and
    per-row temperature (b, 1) float32, top_k (b, 1) int64 in [1, V], top_p (b, 1) float32."""
    ordered, order = torch.sort(logits.float() / temperature, dim=-1, descending=True)
    kth = ordered.gather(1, top_k - 1)
    ordered = ordered.masked_fill(ordered < kth, float("-inf"))
    probs = ordered.softmax(-1)
    drop = (probs.cumsum(-1) - probs >= top_p) & (top_p < 1)
    return ordered.masked_fill(drop, float("-inf")), order


def choose_on_device(logits: torch.Tensor, mode: str, buffers) -> None:
    """The next token of each row of logits (B, V) into ``buffers.tokens`` (B,) int64, with
    ``buffers``' settings and noise (``decode_plan.StaticBuffers``)."""
    if mode == GREEDY:
        torch.argmax(logits, dim=-1, out=buffers.tokens)
        return
    noise = buffers.noise.clamp_min_(TINY)
    if mode == SAMPLE:
        probs = (logits.float() / buffers.temperature).softmax(-1)
        torch.argmax(probs / noise, dim=-1, out=buffers.tokens)
        return
    scores, order = filtered_scores(logits, buffers.temperature, buffers.top_k, buffers.top_p)
    position = torch.argmax(scores.softmax(-1) / noise, dim=-1, keepdim=True)
    buffers.tokens.copy_(order.gather(1, position)[:, 0])
