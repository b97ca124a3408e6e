"""One (contender, suite) measurement in its own process: ``python -m benchmarks.worker SPEC``.

SPEC is JSON (see ``run.py``). Each row is printed as ``BENCH_ROW {json}`` as soon as it is
measured (so a worker stopped at its time limit keeps what it finished), then ``BENCH_DONE``.
The process's peak RSS is its own, so memory figures are not polluted by other contenders.
"""

from __future__ import annotations

import json
import resource
import sys
import warnings

import torch

from benchmarks.contenders import (
    CONTENDERS,
    DEBUG_CONTENDERS,
    UNSUPPORTED_SUITES,
    Runner,
    Unsupported,
)
from benchmarks.stats import TokenClock, invert, summarize, time_calls


def _peak_rss_bytes() -> int:
    """This process's peak RSS (VmHWM). Not ``ru_maxrss``: that survives exec, so a child would
    report its parent's peak."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux ``clear_refs`` 5): the next peak is the prefill's."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def _current_rss_bytes() -> int:
    import psutil

    return psutil.Process().memory_info().rss


def _ids(spec: dict, batch: int, length: int, salt: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(spec["seed"] + salt)
    return torch.randint(0, spec["vocab_size"], (batch, length), generator=generator)


def _row(spec: dict, **fields) -> dict:
    row = {"suite": spec["suite"], "contender": spec["contender"], **fields}
    print("BENCH_ROW " + json.dumps(row), flush=True)
    return row


def run_prefill(spec: dict, runner: Runner) -> list[dict]:
    rows = []
    for length in spec["lengths"]:
        tokens = spec["batch"] * length
        try:
            ids = _ids(spec, spec["batch"], length, length)
            seconds = summarize(time_calls(lambda ids=ids: runner.prefill(ids), spec["repeats"]))
            rows.append(
                _row(
                    spec,
                    batch=spec["batch"],
                    length=length,
                    seconds=seconds,
                    tokens_per_s=invert(seconds, tokens),
                )
            )
        except Exception as error:
            rows.append(
                _row(
                    spec,
                    batch=spec["batch"],
                    length=length,
                    error=f"{type(error).__name__}: {str(error).splitlines()[0][:200]}",
                )
            )
    return rows


def run_decode(spec: dict, runner: Runner) -> list[dict]:
    generate = runner.require_generate(spec["contender"])
    batch, new = spec["batch"], spec["new_tokens"]
    ids = _ids(spec, batch, spec["prompt_length"])
    ttft = summarize(time_calls(lambda: generate(ids, 1), spec["repeats"]))

    def decode_seconds() -> float:
        clock = TokenClock()
        generate(ids, new, streamer=clock)
        return clock.seconds_per_token(new)

    decode_seconds()  # warm-up
    per_token = summarize([decode_seconds() for _ in range(spec["repeats"])])
    return [
        _row(
            spec,
            batch=batch,
            prompt_length=spec["prompt_length"],
            new_tokens=new,
            ttft_s=ttft,
            ms_per_token={k: v * 1e3 if k != "n" else v for k, v in per_token.items()},
            tokens_per_s=invert(per_token, batch),
            weight_bytes=runner.info.get("weight_bytes"),
        )
    ]


def _rss_around(fn):
    """(what ``fn`` returned, RSS before it, peak RSS while it ran)."""
    baseline = _current_rss_bytes()
    _reset_peak_rss()
    result = fn()
    return result, baseline, _peak_rss_bytes()


def run_memory(spec: dict, runner: Runner) -> list[dict]:
    (length,) = spec["lengths"]
    ids = _ids(spec, spec["batch"], length)
    peak_while_preparing = _peak_rss_bytes()
    _, baseline, peak = _rss_around(lambda: runner.prefill(ids))
    return [
        _row(
            spec,
            batch=spec["batch"],
            length=length,
            rss_before_MB=baseline / 1e6,
            peak_rss_MB=peak / 1e6,
            peak_while_preparing_MB=peak_while_preparing / 1e6,
            prefill_extra_MB=max(0, peak - baseline) / 1e6,
        )
    ]


def run_export(spec: dict, runner: Runner) -> list[dict]:
    return [_row(spec, **runner.info)]


def run_long_prefill(spec: dict, runner: Runner) -> list[dict]:
    """One length per process: chunked prefill returning the last logits, its time and peak RSS.
    Each length is timed over at least ~8K tokens in all (short ones repeat), so a single lucky
    or unlucky second does not decide a ratio between lengths."""
    compiled = runner.require_compiled(spec["contender"])
    (length,) = spec["lengths"]
    ids = _ids(spec, spec["batch"], length)
    repeats = max(spec["long_repeats"], -(-8192 // length))
    compiled.prefill(ids[:, : 2 * compiled.chunk_size], last_only=True)  # warm-up
    times, baseline, peak = _rss_around(
        lambda: time_calls(lambda: compiled.prefill(ids, last_only=True), repeats, warmup=0)
    )
    seconds = summarize(times)
    return [
        _row(
            spec,
            batch=spec["batch"],
            length=length,
            chunk_size=compiled.chunk_size,
            seconds=seconds,
            tokens_per_s=invert(seconds, spec["batch"] * length),
            peak_rss_MB=peak / 1e6,
            prefill_extra_MB=max(0, peak - baseline) / 1e6,
        )
    ]


def run_prefix_cache(spec: dict, runner: Runner) -> list[dict]:
    """Time to first token of a prompt whose first ``cached`` tokens an earlier prompt shared,
    against the same prompt with no cache; and how far their last logits differ."""
    import ssmcc

    compiled = runner.require_compiled(spec["contender"])
    length, cached = spec["prefix_prompt_length"], spec["prefix_cached_length"]
    shared = _ids(spec, spec["batch"], length, salt=1)
    cache = ssmcc.PrefixCache(max_bytes=2 << 30)
    compiled.prefill(shared, last_only=True, prefix_cache=cache)  # the earlier request
    prompts = [  # same first `cached` tokens, different rest, one per timed run
        torch.cat([shared[:, :cached], _ids(spec, spec["batch"], length - cached, salt=2 + r)], 1)
        for r in range(spec["repeats"] + 1)
    ]
    plain_prompts, cached_prompts = iter(prompts), iter(prompts)
    uncached = summarize(
        time_calls(lambda: compiled.generate(next(plain_prompts), 1), spec["repeats"])
    )
    with_cache = summarize(
        time_calls(
            lambda: compiled.generate(next(cached_prompts), 1, prefix_cache=cache),
            spec["repeats"],
        )
    )
    rest = _ids(spec, spec["batch"], length - cached, salt=1000)
    fresh = torch.cat([shared[:, :cached], rest], 1)
    plain, _ = compiled.prefill(fresh, last_only=True)
    reused, _ = compiled.prefill(fresh, last_only=True, prefix_cache=cache)
    return [
        _row(
            spec,
            batch=spec["batch"],
            prompt_length=length,
            cached_length=cached,
            chunk_size=compiled.chunk_size,
            ttft_uncached_s=uncached,
            ttft_cached_s=with_cache,
            ttft_ratio=with_cache["median"] / uncached["median"],
            max_logit_diff=float((plain - reused).abs().max()),
        )
    ]


SUITES = {
    "prefill": run_prefill,
    "decode": run_decode,
    "memory": run_memory,
    "export": run_export,
    "long-prefill": run_long_prefill,
    "prefix-cache": run_prefix_cache,
}


def main(spec: dict) -> None:
    reason = UNSUPPORTED_SUITES.get(spec["contender"], {}).get(spec["suite"])
    if reason:
        _row(spec, note=reason)
        return
    warnings.filterwarnings("ignore")
    from transformers.utils import logging

    logging.set_verbosity_error()
    torch.set_num_threads(spec["threads"])
    from ssmcc.presets import build_preset

    model = build_preset(spec["model"], seed=spec["seed"])
    spec["vocab_size"] = model.config.vocab_size
    prepare = {**CONTENDERS, **DEBUG_CONTENDERS}[spec["contender"]]
    ctx = {
        "batch": spec["batch"],
        "threads": spec["threads"],
        "export_length": spec["export_length"],
        "first_length": spec["lengths"][0],
    }
    try:
        runner = prepare(model, ctx)
        if spec.get("with_export"):  # the export figures come from this same preparation
            _row({**spec, "suite": "export"}, **runner.info)
        if spec["suite"] in runner.measure:  # timed by the contender's own tool
            for fields in runner.measure[spec["suite"]](spec):
                _row(spec, **fields)
        else:
            SUITES[spec["suite"]](spec, runner)
    except Unsupported as reason:
        _row(spec, note=str(reason))


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
    print("BENCH_DONE", flush=True)
