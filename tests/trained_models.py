"""A small byte-level Mamba language model with trained (not random) weights, for tests.

Random weights make a poor stand-in for a real checkpoint when a test measures numerical error:
their per-channel ranges are uniform and free of outliers, so int8 per-channel weight
quantisation looks better (or worse) on them than it is on a model that has learnt something.
``trained_mamba()`` trains a tiny ``transformers.MambaForCausalLM`` (hidden 64, 2 layers, state
16; about 80 K parameters) for 200 AdamW steps on batches of 12 random 128-byte windows of a
small text, so that such tests see weights shaped by training: the training loss falls from
5.5 to about 0.8 nats/byte, about 2.2 on held-out bytes. Training runs on one thread (the other
core runs the other test worker; two threads on a shared core spend their time in each other's
way: 20 steps took 10.6 s on two threads and 7.7 s on one beside a busy process, AMD EPYC): about
50 seconds idle, about 77 beside a busy worker (from the 20 steps). Pass a ``cache_dir`` (the
``trained_mamba_model`` fixture passes pytest's cache) to train once and load the weights
afterwards.

Tokens are bytes: vocab 256, token id = byte value, no tokenizer.

The text is the Zen of Python (``this.s``, rot13-decoded) followed by the source of the
``textwrap`` module (``inspect.getsource``), about 20 KB of English and Python. Both ship with
every CPython install and need no network; the ``textwrap`` source can differ between Python
versions, so the text's hash is part of the cache key. Its last tenth is held out of training
(see ``HELD_OUT_FRACTION``) so that tests can measure loss on bytes the model has not seen.
"""

from __future__ import annotations

import codecs
import contextlib
import dataclasses
import functools
import hashlib
import importlib
import importlib.util
import inspect
import io
import json
import math
import os
import pathlib
import tempfile
import textwrap
import time

import torch
import transformers

# Bump when the training code changes in a way the hyper-parameters below do not record.
TRAINING_CODE_VERSION = 1

HELD_OUT_FRACTION = 0.1

MODEL_CONFIG = dict(
    vocab_size=256,
    hidden_size=64,
    num_hidden_layers=2,
    state_size=16,
    expand=2,
    conv_kernel=4,
    time_step_rank=8,
)


@dataclasses.dataclass(frozen=True)
class TrainingSettings:
    """AdamW on random windows of the training text, linear warmup then cosine decay to
    ``final_lr_fraction * lr``."""

    seed: int = 0
    steps: int = 200
    batch_size: int = 12
    window: int = 128
    lr: float = 5e-3
    warmup_steps: int = 20
    final_lr_fraction: float = 0.1
    weight_decay: float = 0.01
    threads: int = 1
    loss_average_steps: int = 20  # the reported final loss averages this many last steps


TRAINING = TrainingSettings()


@functools.cache
def corpus() -> bytes:
    """The whole text (training part, then held-out part) as bytes."""
    with contextlib.redirect_stdout(io.StringIO()):  # importing ``this`` prints the Zen
        this = importlib.import_module("this")
    zen = codecs.decode(this.s, "rot13")
    return (zen + "\n\n" + inspect.getsource(textwrap)).encode("utf-8")


def _as_ids(text: bytes) -> torch.Tensor:
    return torch.tensor(list(text), dtype=torch.int64)


def training_ids() -> torch.Tensor:
    """The bytes the model is trained on, as a 1-D int64 tensor."""
    text = corpus()
    return _as_ids(text[: _held_out_start(text)])


def held_out_ids() -> torch.Tensor:
    """The last ``HELD_OUT_FRACTION`` of the text (never trained on), as a 1-D int64 tensor."""
    text = corpus()
    return _as_ids(text[_held_out_start(text) :])


def _held_out_start(text: bytes) -> int:
    return len(text) - int(len(text) * HELD_OUT_FRACTION)


def prompts(n: int, length: int) -> list[torch.Tensor]:
    """``n`` fixed prompts, each a ``(1, length)`` int64 tensor of byte ids: slices of the
    training text at offsets spread evenly over it (the same every call)."""
    ids = training_ids()
    if length > len(ids):
        raise ValueError(f"prompt length {length} exceeds the training text ({len(ids)} bytes)")
    last_start = len(ids) - length
    starts = [i * last_start // max(n - 1, 1) for i in range(n)]
    return [ids[start : start + length].unsqueeze(0).clone() for start in starts]


def mamba_config(**overrides) -> transformers.MambaConfig:
    """The ``transformers.MambaConfig`` of the trained model (``overrides`` replace fields)."""
    return transformers.MambaConfig(**{**MODEL_CONFIG, **overrides})


def next_byte_loss(model: transformers.MambaForCausalLM, ids: torch.Tensor) -> float:
    """Mean cross-entropy (nats per byte) of ``model`` predicting each byte of ``ids`` (a
    ``(1, length)`` or 1-D int64 tensor) from the ones before it."""
    ids = ids.reshape(1, -1)
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item()


def trained_mamba(cache_dir: pathlib.Path | None = None) -> transformers.MambaForCausalLM:
    """The trained ``transformers.MambaForCausalLM``, float32, in eval mode.

    With ``cache_dir``, the weights are loaded from there when a file for the current
    settings exists, and saved there (atomically: safe under pytest-xdist) after training."""
    cache_path = None if cache_dir is None else pathlib.Path(cache_dir) / _cache_file_name()
    if cache_path is not None and cache_path.exists():
        state_dict = torch.load(cache_path, weights_only=True)["state_dict"]
    else:
        state_dict, final_loss, seconds = _train()
        print(
            f"trained_mamba: {TRAINING.steps} steps in {seconds:.1f} s, final training loss "
            f"{final_loss:.3f} nats/byte"
        )
        if cache_path is not None:
            payload = {"state_dict": state_dict, "final_loss": final_loss, "seconds": seconds}
            _save_atomically(payload, cache_path)
    model = untrained_mamba()
    model.load_state_dict(state_dict)
    return model.float()


def untrained_mamba(**config_overrides) -> transformers.MambaForCausalLM:
    """The trained model's starting point, in eval mode: randomly initialised with the same
    config and seed (the same every call; the global RNG is left as it was)."""
    with torch.random.fork_rng():
        torch.manual_seed(TRAINING.seed)
        return transformers.MambaForCausalLM(mamba_config(**config_overrides)).eval()


def _uses_parallel_scan() -> bool:
    """Whether training can use mamba.py's parallel scan (``use_mambapy``), a test dependency:
    about 7x faster than the sequential loop of the HF torch path, the same maths."""
    return importlib.util.find_spec("mambapy") is not None


def _cache_file_name() -> str:
    key = {
        "model": MODEL_CONFIG,
        "training": dataclasses.asdict(TRAINING),
        "code_version": TRAINING_CODE_VERSION,
        "text_sha256": hashlib.sha256(corpus()).hexdigest(),
        "held_out_fraction": HELD_OUT_FRACTION,
        "parallel_scan": _uses_parallel_scan(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()
    return f"mamba-{digest[:20]}.pt"


def _save_atomically(payload: dict, path: pathlib.Path) -> None:
    """Write to a temporary file in ``path``'s folder, then rename it onto ``path``: a reader
    (another xdist worker) sees the old file, no file, or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            torch.save(payload, file)
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp_name)
        raise


def _learning_rate_factor(step: int) -> float:
    warmup = min(1.0, (step + 1) / TRAINING.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * step / TRAINING.steps))
    floor = TRAINING.final_lr_fraction
    return warmup * (floor + (1.0 - floor) * cosine)


def _random_windows(ids: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``(batch_size, window)`` byte ids: windows of ``ids`` at random offsets."""
    last_start = len(ids) - TRAINING.window
    starts = torch.randint(0, last_start + 1, (TRAINING.batch_size,), generator=generator)
    return torch.stack([ids[start : start + TRAINING.window] for start in starts.tolist()])


def _train() -> tuple[dict[str, torch.Tensor], float, float]:
    """Train a fresh model; return its state dict, the final training loss (mean of the last
    ``loss_average_steps`` steps, nats per byte) and the seconds it took."""
    model = untrained_mamba(use_cache=False, use_mambapy=_uses_parallel_scan()).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=TRAINING.lr, weight_decay=TRAINING.weight_decay
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, _learning_rate_factor)
    generator = torch.Generator().manual_seed(TRAINING.seed)
    ids = training_ids()
    losses = []
    threads = torch.get_num_threads()
    torch.set_num_threads(TRAINING.threads)  # fixed, for the same sums on every machine
    start = time.perf_counter()
    try:
        for _ in range(TRAINING.steps):
            windows = _random_windows(ids, generator)
            loss = model(input_ids=windows, labels=windows).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            losses.append(loss.item())
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    final_loss = sum(losses[-TRAINING.loss_average_steps :]) / TRAINING.loss_average_steps
    state_dict = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    return state_dict, final_loss, seconds
