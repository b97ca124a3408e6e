"""One-shot GPU check of the triton target end to end: real model shapes (random weights).

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
                 (generate(64) - generate(1)) / 63, for ssmcc and for HF ``generate``

Prints a table and writes JSON after every model. ``--dry`` runs the tiny presets on the CPU with
``interpret=True`` (Triton's interpreter), so the script cannot rot.

    python benchmarks/gpu_models.py --out gpu_models.json        # CUDA machine, ~3 min
    python benchmarks/gpu_models.py --dry --out /tmp/m.json      # anywhere
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch

TOLERANCE = 1e-3
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


def _per_token_ms(generate, device, new_tokens: int) -> float:
    one = _seconds(lambda: generate(1), device)
    many = _seconds(lambda: generate(new_tokens), device, repeats=2)
    return (many - one) / (new_tokens - 1) * 1e3


@torch.inference_mode()
def check_model(name: str, device: torch.device, dry: bool) -> dict:
    import ssmcc
    from ssmcc.presets import build_preset

    row: dict = {"model": name}
    model = build_preset(name).eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    started = time.perf_counter()
    compiled = ssmcc.compile(model, target="triton", interpret=dry)
    row["compile_s"] = time.perf_counter() - started
    # A copy for HF on the device: the captured program shares the model's parameters, and
    # ``model.to`` moves parameters in place.
    model = copy.deepcopy(model).to(device)
    ids = torch.randint(0, vocab, (2, 64 if not dry else 9), generator=gen)
    started = time.perf_counter()
    logits = compiled(ids)
    row["first_call_s"] = time.perf_counter() - started
    expected = model(input_ids=ids.to(device), use_cache=False).logits.float().cpu()
    row["max_abs_diff"] = float((logits - expected).abs().max())
    row["ok"] = row["max_abs_diff"] <= TOLERANCE * max(1.0, float(expected.abs().max()))

    prompt = torch.randint(0, vocab, (1, 32 if not dry else 5), generator=gen)
    new = 32 if not dry else 4
    ours = compiled.generate(prompt, new)[0, prompt.shape[1] :]
    theirs = _hf_generate(model, prompt.to(device), new)[0, prompt.shape[1] :].cpu()
    row["greedy_equal"] = int((ours == theirs).cumprod(0).sum())
    row["greedy_of"] = new
    long_prompt = torch.randint(0, vocab, (1, 512 if not dry else 8), generator=gen)
    row["prefill_ms"] = (
        _seconds(lambda: compiled.prefill(long_prompt, last_only=True), device) * 1e3
    )
    on_device = long_prompt.to(device)
    row["hf_prefill_ms"] = _seconds(lambda: _hf_last_logits(model, on_device), device) * 1e3
    decode_tokens = 64 if not dry else 3
    row["decode_ms"] = _per_token_ms(lambda n: compiled.generate(prompt, n), device, decode_tokens)
    hf_prompt = prompt.to(device)
    row["hf_decode_ms"] = _per_token_ms(
        lambda n: _hf_generate(model, hf_prompt, n), device, decode_tokens
    )
    row["prefill_speedup"] = row["hf_prefill_ms"] / row["prefill_ms"]
    row["decode_speedup"] = row["hf_decode_ms"] / row["decode_ms"]
    return row


def _fmt(value, spec=".2f"):
    return "-" if value is None else format(value, spec)


def _print_row(row: dict) -> None:
    print(
        f"{row['model']:22s} {'ok ' if row.get('ok') else 'BAD'} "
        f"diff {_fmt(row.get('max_abs_diff'), '.1e')} "
        f"greedy {row.get('greedy_equal', '-')}/{row.get('greedy_of', '-')} "
        f"compile {_fmt(row.get('compile_s'), '.1f')} s "
        f"first {_fmt(row.get('first_call_s'), '.1f')} s | "
        f"prefill {_fmt(row.get('prefill_ms'))} ms (hf {_fmt(row.get('hf_prefill_ms'))}, "
        f"x{_fmt(row.get('prefill_speedup'))}) | decode {_fmt(row.get('decode_ms'))} ms/tok "
        f"(hf {_fmt(row.get('hf_decode_ms'))}, x{_fmt(row.get('decode_speedup'))}) "
        f"{row.get('error', '')}",
        flush=True,
    )


def run_models(dry: bool, out: str | None, budget_s: float, presets=None) -> dict:
    """Each preset in turn while ``budget_s`` lasts; JSON rewritten after every model."""
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
        if time.perf_counter() - started > budget_s:
            result["rows"].append({"model": name, "ok": None, "error": "skipped (time budget)"})
            continue
        try:
            row = check_model(name, device, dry)
        except Exception as error:  # a model that fails is a finding: keep going
            row = {"model": name, "ok": False, "error": f"{type(error).__name__}: {error}"[:500]}
        result["rows"].append(row)
        _print_row(row)
        result["seconds"] = time.perf_counter() - started
        result["all_ok"] = all(r.get("ok") for r in result["rows"] if r.get("ok") is not None)
        write_json(result, out)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry", action="store_true", help="CPU, tiny presets, interpreter")
    parser.add_argument("--out", default="gpu_models.json", help="JSON file to write")
    parser.add_argument(
        "--budget", type=float, default=240.0, help="seconds after which no model is started"
    )
    parser.add_argument("--models", nargs="*", help=f"presets (default: {' '.join(GPU_PRESETS)})")
    args = parser.parse_args(argv)
    from benchmarks.gpu_check import cuda_missing

    if not args.dry and cuda_missing("gpu_models", "the tiny presets"):
        return 2
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    result = run_models(args.dry, args.out, args.budget, args.models)
    return 0 if result.get("all_ok") else 1


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    sys.exit(main())
