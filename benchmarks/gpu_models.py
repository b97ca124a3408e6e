"""One-shot GPU check of the triton target end to end: real model shapes (random weights),
against the Hugging Face model in the same run.

For each preset, ``ssmcc.compile(model, target="triton")`` against the Hugging Face model on the
same GPU, both fp32 (HF without mamba_ssm runs its PyTorch path: what a user without those CUDA
extensions gets):

    ok           prefill logits (batch 2, 64 tokens) within ``TOLERANCE`` of HF's, relative to
                 the largest logit: max|ssmcc - hf| <= TOLERANCE * max(1, max|hf|)
    greedy       how many of 32 greedy tokens equal HF's greedy generation (random weights put
                 near-ties in the logits: a late mismatch is a tie broken the other way)
    compile_s    capture + passes + lowering; first_call_s: the first prefill (Triton's JIT)
    prefill_ms   one 512-token prompt, batch 1, last position's logits (ssmcc: the chunk graph;
                 HF: ``logits_to_keep=1``)
    decode_ms    per generated token, batch 1, 64 tokens after a 32-token prompt:
                 (generate(64) - generate(1)) / 63
    decode_path  "cuda graph" where the decode replays one graph per token, else "eager: <why>"
                 (``decode_refusal``: e.g. the CPU under ``--dry``, Jamba's separate step ops)
    contenders   the same two figures, per row, for
                   hf-eager     the HF model's forward / ``generate``
                   hf-compiled  the same with ``model.forward = torch.compile(model.forward,
                                mode="reduce-overhead")`` (inductor + CUDA graphs), in a process
                                of its own stopped at the budget's end; ``compile_s`` is its
                                first prefill, ``decode_first_s`` its first generate, ``graphs``
                                how many graphs Dynamo compiled
                 each "measured", "skipped: <why>" or "failed: <error>" (``gpu_contenders.py``),
                 with ``prefill_x`` / ``decode_x``: its time over ssmcc's. ``gates`` counts, per
                 contender and figure, the rows where ssmcc's time is at most the contender's:
                 met, not met, unmeasured (a contender skipped or failed is never beaten)

Prints a table and writes JSON after every model. The presets run while the first
``MODELS_SHARE`` of ``--budget`` lasts, then each model's hf-compiled in what is left. ``--dry``
runs the tiny presets on the CPU with ``interpret=True`` (Triton's interpreter), hf-compiled with
Dynamo's ``eager`` backend (the same capture, no code generation: inductor takes minutes per
model on these CPUs), so the script cannot rot.

    python benchmarks/gpu_models.py --out gpu_models.json        # CUDA machine, < 5 min
    python benchmarks/gpu_models.py --dry --out /tmp/m.json      # anywhere
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

if __package__ in (None, ""):  # run as a script: the repository's root on the path
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.gpu_contenders import (  # noqa: E402
    describe,
    failed,
    gate_summary,
    is_measured,
    measured,
    skipped,
)

TOLERANCE = 1e-3
MODELS_SHARE = 0.6  # no preset starts after this share of the budget; hf-compiled gets the rest
FIGURES = {"prefill_ms": "prefill_ms", "decode_ms": "decode_ms"}
GPU_PRESETS = ("mamba-130m", "mamba2-130m", "granite-hybrid-200m", "jamba-tiny")
DRY_PRESETS = ("mamba-tiny", "mamba2-tiny")


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def _seconds(fn, device, repeats=3) -> float:
    """Best of ``repeats`` wall times, the device synchronised."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        _sync(device)
        started = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return best


def _hf_generate(model, prompt, new_tokens):
    return model.generate(
        prompt,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        pad_token_id=0,
    )


def _hf_last_logits(model, ids):
    try:
        return model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[:, -1]
    except TypeError:  # a model class without logits_to_keep
        return model(input_ids=ids, use_cache=False).logits[:, -1]


def _per_token_ms(generate, device, new_tokens: int, repeats: int) -> float:
    one = _seconds(lambda: generate(1), device, repeats)
    many = _seconds(lambda: generate(new_tokens), device, max(1, repeats - 1))
    return (many - one) / (new_tokens - 1) * 1e3


def _prompts(vocab: int, dry: bool) -> dict:
    """The prompts every contender of a model gets (seeded: the same in every process)."""
    gen = torch.Generator().manual_seed(0)
    return {
        "check": torch.randint(0, vocab, (2, 64 if not dry else 9), generator=gen),
        "prompt": torch.randint(0, vocab, (1, 32 if not dry else 5), generator=gen),
        "long": torch.randint(0, vocab, (1, 512 if not dry else 8), generator=gen),
        "new": 32 if not dry else 4,
        "decode": 64 if not dry else 3,
        # timed runs after the warm-up: in the dry run one takes every timing path (it times
        # a few interpreted tokens, never compared against a gate's figure)
        "repeats": 3 if not dry else 1,
    }


def _hf_figures(model, device, prompts: dict) -> dict:
    """Prefill and decode of an HF model (eager or compiled) on ``device``."""
    long_prompt, prompt = prompts["long"].to(device), prompts["prompt"].to(device)
    return {
        "prefill_ms": _seconds(
            lambda: _hf_last_logits(model, long_prompt), device, prompts["repeats"]
        )
        * 1e3,
        "decode_ms": _per_token_ms(
            lambda n: _hf_generate(model, prompt, n), device, prompts["decode"], prompts["repeats"]
        ),
    }


@torch.inference_mode()
def check_model(name: str, device: torch.device, dry: bool) -> dict:
    import ssmcc
    from ssmcc.presets import build_preset

    row: dict = {"model": name}
    model = build_preset(name).eval()
    prompts = _prompts(model.config.vocab_size, dry)
    started = time.perf_counter()
    compiled = ssmcc.compile(model, target="triton", interpret=dry)
    row["compile_s"] = time.perf_counter() - started
    # A copy for HF on the device: the captured program shares the model's parameters, and
    # ``model.to`` moves parameters in place.
    model = copy.deepcopy(model).to(device)
    ids = prompts["check"]
    started = time.perf_counter()
    logits = compiled(ids)
    row["first_call_s"] = time.perf_counter() - started
    expected = model(input_ids=ids.to(device), use_cache=False).logits.float().cpu()
    row["max_abs_diff"] = float((logits - expected).abs().max())
    row["ok"] = row["max_abs_diff"] <= TOLERANCE * max(1.0, float(expected.abs().max()))

    prompt, new = prompts["prompt"], prompts["new"]
    ours = compiled.generate(prompt, new)[0, prompt.shape[1] :]
    theirs = _hf_generate(model, prompt.to(device), new)[0, prompt.shape[1] :].cpu()
    row["greedy_equal"] = int((ours == theirs).cumprod(0).sum())
    row["greedy_of"] = new
    row["prefill_ms"] = (
        _seconds(
            lambda: compiled.prefill(prompts["long"], last_only=True), device, prompts["repeats"]
        )
        * 1e3
    )
    row["decode_ms"] = _per_token_ms(
        lambda n: compiled.generate(prompt, n), device, prompts["decode"], prompts["repeats"]
    )
    refusal = compiled.executable.decode_refusal(prompt.shape[0])
    row["decode_path"] = "cuda graph" if refusal is None else f"eager: {refusal}"
    try:
        row["contenders"] = {"hf-eager": measured(**_hf_figures(model, device, prompts))}
    except Exception as error:  # reported, never counted as beaten
        row["contenders"] = {"hf-eager": failed(error)}
    return row


@torch.inference_mode()
def measure_hf_compiled(name: str, device: torch.device, dry: bool) -> dict:
    """The hf-compiled contender of one preset (run in a process of its own)."""
    from ssmcc.presets import build_preset

    model = build_preset(name).eval().to(device)
    prompts = _prompts(model.config.vocab_size, dry)
    how = {"backend": "eager"} if dry else {"mode": "reduce-overhead"}
    model.forward = torch.compile(model.forward, **how)
    long_prompt, prompt = prompts["long"].to(device), prompts["prompt"].to(device)
    started = time.perf_counter()
    _hf_last_logits(model, long_prompt)
    _sync(device)
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    _hf_generate(model, prompt, prompts["decode"])
    _sync(device)
    decode_first_s = time.perf_counter() - started
    figures = _hf_figures(model, device, prompts)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    return measured(
        **figures,
        compile_s=compile_s,
        decode_first_s=decode_first_s,
        graphs=int(graphs),
        how=f"torch.compile(model.forward, {', '.join(f'{k}={v!r}' for k, v in how.items())})",
    )


def _isolated(name: str, dry: bool, seconds: float) -> dict:
    """``measure_hf_compiled`` in a fresh process, stopped after ``seconds``."""
    if seconds < 10:
        return skipped("time budget")
    with tempfile.TemporaryDirectory(prefix="ssmcc-gpu-models-") as folder:
        out = os.path.join(folder, "contender.json")
        command = [sys.executable, os.path.abspath(__file__), "--contender", "hf-compiled"]
        command += ["--models", name, "--out", out] + (["--dry"] if dry else [])
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=seconds)
        except subprocess.TimeoutExpired:
            return skipped(f"time budget (stopped after {seconds:.0f} s)")
        if done.returncode != 0 or not os.path.exists(out):
            lines = (done.stderr or done.stdout or f"exit {done.returncode}").strip().splitlines()
            return failed(lines[-1] if lines else f"exit {done.returncode}")
        with open(out) as f:
            return json.load(f)


def _ratios(row: dict) -> None:
    """Each measured contender's time over ssmcc's (above 1: ssmcc is faster)."""
    for entry in row.get("contenders", {}).values():
        for figure in FIGURES:
            if is_measured(entry) and isinstance(row.get(figure), float) and row[figure] > 0:
                entry[figure.replace("_ms", "_x")] = entry[figure] / row[figure]


def _fmt(value, spec=".2f"):
    return "-" if value is None else format(value, spec)


def _print_row(row: dict) -> None:
    print(
        f"{row['model']:22s} {'ok ' if row.get('ok') else 'BAD'} "
        f"diff {_fmt(row.get('max_abs_diff'), '.1e')} "
        f"greedy {row.get('greedy_equal', '-')}/{row.get('greedy_of', '-')} "
        f"compile {_fmt(row.get('compile_s'), '.1f')} s "
        f"first {_fmt(row.get('first_call_s'), '.1f')} s | "
        f"prefill {_fmt(row.get('prefill_ms'))} ms | decode {_fmt(row.get('decode_ms'))} ms/tok "
        f"({row.get('decode_path', '-')[:40]}) {row.get('error', '')}",
        flush=True,
    )
    for name, entry in row.get("contenders", {}).items():
        figures = describe(entry, "prefill_ms")
        if is_measured(entry):
            figures = (
                f"prefill {_fmt(entry.get('prefill_ms'))} ms (x{_fmt(entry.get('prefill_x'))}) | "
                f"decode {_fmt(entry.get('decode_ms'))} ms/tok (x{_fmt(entry.get('decode_x'))})"
            )
        print(f"    {name:12s} {figures}", flush=True)


def _summarise(result: dict, started: float) -> None:
    result["seconds"] = time.perf_counter() - started
    result["all_ok"] = all(r.get("ok") for r in result["rows"] if r.get("ok") is not None)
    result["gates"] = gate_summary(result["rows"], FIGURES)


def run_models(dry: bool, out: str | None, budget_s: float, presets=None) -> dict:
    """Each preset in turn while ``MODELS_SHARE`` of ``budget_s`` lasts, then each one's
    hf-compiled contender in what is left; JSON rewritten after every step."""
    from benchmarks.gpu_check import write_json

    device = torch.device("cpu" if dry else "cuda")
    presets = presets or (DRY_PRESETS if dry else GPU_PRESETS)
    started = time.perf_counter()
    result = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "dry": dry,
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "transformers": __import__("transformers").__version__,
        "tolerance": TOLERANCE,
        "rows": [],
    }
    for name in presets:
        if time.perf_counter() - started > MODELS_SHARE * budget_s:
            result["rows"].append({"model": name, "ok": None, "error": "skipped (time budget)"})
            continue
        try:
            row = check_model(name, device, dry)
        except Exception as error:  # a model that fails is a finding: keep going
            row = {"model": name, "ok": False, "error": f"{type(error).__name__}: {error}"[:500]}
        result["rows"].append(row)
        _ratios(row)
        _print_row(row)
        _summarise(result, started)
        write_json(result, out)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    for row in result["rows"]:
        if "contenders" not in row:
            continue
        left = budget_s - (time.perf_counter() - started)
        row["contenders"]["hf-compiled"] = _isolated(row["model"], dry, left)
        _ratios(row)
        _print_row(row)
        _summarise(result, started)
        write_json(result, out)
    _summarise(result, started)
    write_json(result, out)
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, tiny presets, interpreter")
    parser.add_argument("--out", default="gpu_models.json", help="JSON file to write")
    parser.add_argument(
        "--budget", type=float, default=240.0, help="seconds after which no model is started"
    )
    parser.add_argument("--models", nargs="*", help=f"presets (default: {' '.join(GPU_PRESETS)})")
    parser.add_argument("--contender", choices=["hf-compiled"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from benchmarks.gpu_check import cuda_missing, write_json

    if not args.dry and cuda_missing("gpu_models", "the tiny presets"):
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if args.contender:  # one contender of one model, in this process (``_isolated``)
        device = torch.device("cpu" if args.dry else "cuda")
        write_json(measure_hf_compiled(args.models[0], device, args.dry), args.out)
        return 0
    result = run_models(args.dry, args.out, args.budget, args.models)
    return 0 if result.get("all_ok") else 1


if __name__ == "__main__":
    sys.exit(main())
