"""llama.cpp as a contender: the same HF model converted to GGUF and measured by ``llama-bench``.

Where it is found: ``$SSMCC_LLAMA_CPP`` names a llama.cpp source tree built with cmake, holding
``build/bin/llama-bench``, ``convert_hf_to_gguf.py`` and ``gguf-py/`` (how to get one:
``benchmarks/README.md``). Without it the contender's rows say so and nothing else runs.

The model is written with ``save_pretrained``, converted with ``convert_hf_to_gguf.py --outtype``
(f32, f16 or q8_0: the contender's name says which) and timed by ``llama-bench`` with the run's
threads: ``-p L -n 0`` for prefill (llama.cpp computes the last position's logits only, so its
rows compare with ssmcc's ``last_only`` chunked prefill, not with full-logits prefill) and
``-p 0 -n N`` for decode (ms per generated token). Preparation time is the conversion.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from torch import nn

ENV = "SSMCC_LLAMA_CPP"


class LlamaCppMissing(Exception):
    """llama.cpp is not available here; the message says what to do."""


def llama_cpp_tree() -> str:
    tree = os.environ.get(ENV)
    if not tree:
        raise LlamaCppMissing(
            f"llama.cpp not found: set {ENV} to a llama.cpp tree built with cmake "
            "(benchmarks/README.md says how)"
        )
    for part in ("build/bin/llama-bench", "convert_hf_to_gguf.py", "gguf-py"):
        if not os.path.exists(os.path.join(tree, part)):
            raise LlamaCppMissing(f"{ENV}={tree} has no {part}: build llama-bench with cmake")
    return tree


# transformers 5 writes a hybrid's layer_types as full_attention / linear_attention; the
# converter of llama-cpp-python 0.3.36's tree (conversion/granite.py) looks for "attention" and
# otherwise takes every layer for a Mamba layer (its GGUF then fails to load).
_CONVERTER_LAYER_TYPES = {"full_attention": "attention", "linear_attention": "mamba"}


def _layer_types_for_converter(config_path: str) -> None:
    with open(config_path) as handle:
        config = json.load(handle)
    types = config.get("layer_types")
    if isinstance(types, list) and any(t in _CONVERTER_LAYER_TYPES for t in types):
        config["layer_types"] = [_CONVERTER_LAYER_TYPES.get(t, t) for t in types]
        with open(config_path, "w") as handle:
            json.dump(config, handle, indent=2)


def convert(model: nn.Module, outtype: str) -> tuple[str, float]:
    """The GGUF file of ``model`` and the seconds the conversion took."""
    tree = llama_cpp_tree()
    folder = tempfile.mkdtemp(prefix="bench-llama-cpp-")
    atexit.register(shutil.rmtree, folder, True)  # the GGUF lives as long as the worker
    started = time.perf_counter()
    model.save_pretrained(os.path.join(folder, "hf"))
    _layer_types_for_converter(os.path.join(folder, "hf", "config.json"))
    gguf = os.path.join(folder, f"model-{outtype}.gguf")
    env = dict(os.environ, PYTHONPATH=os.path.join(tree, "gguf-py"))
    done = subprocess.run(
        [
            sys.executable,
            os.path.join(tree, "convert_hf_to_gguf.py"),
            os.path.join(folder, "hf"),
            "--outtype",
            outtype,
            "--outfile",
            gguf,
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"convert_hf_to_gguf.py failed: {last[0][:200]}")
    return gguf, time.perf_counter() - started


def bench(
    gguf: str, threads: int, prompt: int, generate: int, repeats: int, depth: int = 0
) -> dict:
    """``llama-bench``'s JSON entry for one (prompt, generate) pair: avg_ts, samples_ts, ...;
    ``depth`` tokens of context are processed first and not timed (``-d``)."""
    tool = os.path.join(llama_cpp_tree(), "build", "bin", "llama-bench")
    command = [tool, "-m", gguf, "-t", str(threads), "-r", str(repeats), "-o", "json"]
    command += ["-p", str(prompt), "-n", str(generate), "-d", str(depth)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {done.stderr.strip()[-200:]}")
    (entry,) = json.loads(done.stdout)
    return entry


def seconds_per_run(entry: dict, tokens: int) -> list[float]:
    """Seconds per ``tokens`` tokens for each of llama-bench's samples (``samples_ts`` are
    tokens per second): ``tokens`` = the prompt length for prefill, 1 for decode's per token."""
    return [tokens / rate for rate in entry["samples_ts"]]
