"""The contenders: one model, several ways to run it. Each ``prepare`` returns a ``Runner``.

A runner answers ``prefill(ids) -> logits`` and ``generate(ids, new_tokens, streamer=None) -> ids``
(the streamer is told of each new token: ``stats.TokenClock``), and
carries ``info`` (preparation time, graph nodes, artifact size, whether it runs at another
length). A suite a contender cannot run raises ``Unsupported`` with the reason (the row's note).
Later issues add ssmcc targets here (one entry each). A contender timed by an external tool
(llama.cpp's ``llama-bench``) fills ``Runner.measure`` instead.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import time
from collections.abc import Callable

import torch
from torch import nn

from benchmarks.stats import invert


class Unsupported(Exception):
    """This contender cannot run this suite; the message says why."""


@dataclasses.dataclass
class Runner:
    prefill: Callable[[torch.Tensor], torch.Tensor]
    generate: Callable[..., torch.Tensor] | None = None  # (ids, new_tokens, streamer=None)
    info: dict = dataclasses.field(default_factory=dict)
    compiled: object = None  # an ssmcc CompiledModel: chunked prefill, prefix cache
    # suite -> fn(spec) -> measured fields per row, for a contender that times itself (an
    # external tool); each entry is one row's fields besides suite and contender
    measure: dict = dataclasses.field(default_factory=dict)

    def require_generate(self, contender: str):
        if self.generate is None:
            raise Unsupported(f"{contender} has no decode path")
        return self.generate

    def require_compiled(self, contender: str):
        if self.compiled is None:
            raise Unsupported(f"{contender} has no chunked prefill or prefix state cache")
        return self.compiled


def _hf_generate(model: nn.Module):
    def generate(ids: torch.Tensor, new_tokens: int, streamer=None) -> torch.Tensor:
        return model.generate(
            ids,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
            streamer=streamer,
        )

    return generate


def prepare_hf_eager(model: nn.Module, ctx: dict) -> Runner:
    @torch.inference_mode()
    def prefill(ids):
        return model(input_ids=ids, use_cache=False).logits

    return Runner(
        prefill,
        torch.inference_mode()(_hf_generate(model)),
        {"prepare_s": 0.0, "runs_other_length": True},
    )


def prepare_torch_compile(model: nn.Module, ctx: dict) -> Runner:
    """Inductor on the HF model; the first call (compile) is timed as preparation."""
    compiled_forward = torch.compile(model.forward)

    @torch.inference_mode()
    def prefill(ids):
        return compiled_forward(input_ids=ids, use_cache=False).logits

    first = torch.zeros(ctx["batch"], ctx["first_length"], dtype=torch.long)
    started = time.perf_counter()
    prefill(first)
    info = {
        "prepare_s": time.perf_counter() - started,
        "prepare_what": f"first call (compile) at length {ctx['first_length']}",
        "runs_other_length": "recompiles per length",
    }

    @torch.inference_mode()
    def generate(ids, new_tokens, streamer=None):
        original = model.forward
        model.forward = compiled_forward
        try:
            return _hf_generate(model)(ids, new_tokens, streamer)
        finally:
            model.forward = original

    return Runner(prefill, generate, info)


def _onnx_size_mb(path: str) -> float:
    folder = os.path.dirname(path)
    return sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder)) / 1e6


def prepare_torch_onnx(model: nn.Module, ctx: dict) -> Runner:
    """``torch.onnx.export(dynamo=True)`` with dynamic batch/seq requested, run in onnxruntime."""
    import onnx
    import onnxruntime as ort

    from ssmcc.frontend.export import CausalLMLogits

    length = ctx["export_length"]
    folder = tempfile.mkdtemp(prefix="bench-torch-onnx-")
    path = os.path.join(folder, "model.onnx")
    example = torch.zeros(2, length, dtype=torch.long)
    dims = {"input_ids": {0: torch.export.Dim.AUTO, 1: torch.export.Dim.AUTO}}
    started = time.perf_counter()
    torch.onnx.export(
        CausalLMLogits(model),
        (example,),
        path,
        dynamo=True,
        dynamic_shapes=dims,
        external_data=True,
        verbose=False,
    )
    export_s = time.perf_counter() - started
    nodes = len(onnx.load(path, load_external_data=False).graph.node)
    options = ort.SessionOptions()
    options.intra_op_num_threads = ctx["threads"]
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def prefill(ids):
        return session.run(None, {name: ids.numpy()})[0]

    try:
        prefill(torch.zeros(1, length + 7, dtype=torch.long))
        other = True
    except Exception as error:  # onnxruntime raises its own exception types
        other = f"no: {str(error).splitlines()[0][:160]}"
    info = {
        "prepare_s": export_s,
        "prepare_what": f"torch.onnx.export at length {length}",
        "nodes": nodes,
        "artifact_MB": _onnx_size_mb(path),
        "runs_other_length": other,
    }
    return Runner(prefill, None, info)


def _stored_weight_bytes(compiled) -> int | None:
    """The bytes a decode step reads when weights are stored small (``quantize=``), else None
    (the float model's own bytes, which the bounds assume)."""
    quantization = compiled.report.quantization
    return quantization["bytes_after"] if quantization else None


def prepare_ssmcc_torch(model: nn.Module, ctx: dict, quantize: str = "none") -> Runner:
    import ssmcc

    started = time.perf_counter()
    compiled = ssmcc.compile(model, target="torch", quantize=quantize)
    info = {
        "prepare_s": time.perf_counter() - started,
        "prepare_what": f"ssmcc.compile(quantize={quantize!r})",
        "nodes": compiled.report.node_count,
        "runs_other_length": True,
    }
    compiled.prefill(torch.zeros(1, 2, dtype=torch.long))  # derive the stateful programs now
    info["prepare_s"] = time.perf_counter() - started
    info["weight_bytes"] = _stored_weight_bytes(compiled)
    return Runner(compiled, compiled.generate, info, compiled)


def _prepare_ssmcc_onnx(
    model: nn.Module, ctx: dict, kernels: str, pipeline: str = "default", quantize: str = "none"
) -> Runner:
    import ssmcc

    started = time.perf_counter()
    compiled = ssmcc.compile(
        model, target="onnx", kernels=kernels, pipeline=pipeline, quantize=quantize
    )
    prepare_s = time.perf_counter() - started
    folder = tempfile.mkdtemp(prefix="bench-ssmcc-onnx-")
    compiled.save(os.path.join(folder, "artifact"))
    loaded = ssmcc.load(os.path.join(folder, "artifact"), kernels=kernels, threads=ctx["threads"])
    manifest = loaded.manifest
    info = {
        "prepare_s": prepare_s,
        "prepare_what": f"ssmcc.compile(target='onnx', quantize={quantize!r})",
        "nodes": {name: graph["nodes"] for name, graph in manifest["graphs"].items()},
        "runs_other_length": True,
        "artifact_MB": sum(f["bytes"] for f in manifest["files"].values()) / 1e6,
        "kernels": loaded.executable.session("step").ssmcc_kernels,
        "weight_bytes": _stored_weight_bytes(compiled),
    }
    return Runner(loaded, loaded.generate, info, loaded)


def prepare_ssmcc_onnx(model: nn.Module, ctx: dict) -> Runner:
    """ONNX Runtime with the ssmcc custom-op library registered."""
    return _prepare_ssmcc_onnx(model, ctx, "auto")


def prepare_ssmcc_onnx_unfused(model: nn.Module, ctx: dict) -> Runner:
    """The ssmcc-onnx contender compiled with the ``unfused`` pipeline (no fuse_scan_norm_mlp)."""
    return _prepare_ssmcc_onnx(model, ctx, "auto", pipeline="unfused")


def prepare_ssmcc_onnx_portable(model: nn.Module, ctx: dict) -> Runner:
    """ONNX Runtime running the portable function bodies (stock ORT, no ssmcc library)."""
    return _prepare_ssmcc_onnx(model, ctx, "reference")


def prepare_matmuls_only(model: nn.Module, ctx: dict) -> Runner:
    """Only the model's own matmuls (every nn.Linear, LM head included, and each MoE layer's
    experts on k/E of the tokens each) at the prefill shapes:
    the floor a prefill implementation is compared with. They run on oneDNN where torch has it
    (as the torch target's do: MKL's sgemm is 2x slower on AMD processors, which would make the
    floor too easy), else on ``torch.matmul``."""
    from benchmarks.model_bounds import expert_layers
    from ssmcc.lowering.torch.linear import onednn_available

    weights = [m.weight.detach() for m in model.modules() if isinstance(m, nn.Linear)]
    experts = [(up.detach(), down.detach(), k) for up, down, k in expert_layers(model)]
    onednn = onednn_available()

    def linear(rows: int, weight: torch.Tensor) -> None:
        x = torch.ones(rows, weight.shape[1])
        if onednn:
            torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], "")
        else:
            torch.matmul(x, weight.t())

    @torch.inference_mode()
    def prefill(ids):
        rows = ids.numel()
        for weight in weights:
            linear(rows, weight)
        for up, down, k in experts:  # the k chosen experts per token, spread evenly
            for expert in range(up.shape[0]):
                linear(max(1, rows * k // up.shape[0]), up[expert])
                linear(max(1, rows * k // up.shape[0]), down[expert])

    return Runner(
        prefill, None, {"prepare_s": 0.0, "prepare_what": "none", "runs_other_length": True}
    )


def _prepare_llama_cpp(model: nn.Module, ctx: dict, outtype: str) -> Runner:
    """llama.cpp (``benchmarks/llama_cpp.py``): GGUF ``outtype`` timed by llama-bench."""
    from benchmarks import llama_cpp
    from benchmarks.stats import summarize

    try:
        gguf, convert_s = llama_cpp.convert(model, outtype)
    except llama_cpp.LlamaCppMissing as missing:
        raise Unsupported(str(missing)) from None
    threads = ctx["threads"]

    def prefill_rows(spec: dict) -> list[dict]:
        rows = []
        for length in spec["lengths"]:
            entry = llama_cpp.bench(gguf, threads, length, 0, spec["repeats"])
            seconds = summarize(llama_cpp.seconds_per_run(entry, length))
            rows.append(
                dict(
                    batch=1,
                    length=length,
                    seconds=seconds,
                    tokens_per_s=invert(seconds, length),
                    remark="llama.cpp computes the last position's logits only",
                )
            )
        return rows

    def decode_rows(spec: dict) -> list[dict]:
        new, depth = spec["new_tokens"], spec["prompt_length"]
        entry = llama_cpp.bench(gguf, threads, 0, new, spec["repeats"], depth)
        per_token = summarize(llama_cpp.seconds_per_run(entry, 1))
        return [
            dict(
                batch=1,
                prompt_length=depth,
                new_tokens=new,
                ms_per_token={k: v * 1e3 if k != "n" else v for k, v in per_token.items()},
                tokens_per_s=invert(per_token, 1),
                remark=f"llama-bench tg after {depth} tokens of context (-d {depth})",
                weight_bytes=os.path.getsize(gguf) if outtype != "f32" else None,
            )
        ]

    info = {
        "prepare_s": convert_s,
        "prepare_what": f"save_pretrained + convert_hf_to_gguf.py --outtype {outtype}",
        "artifact_MB": os.path.getsize(gguf) / 1e6,
        "runs_other_length": True,
        "weight_bytes": os.path.getsize(gguf) if outtype != "f32" else None,
    }
    return Runner(None, None, info, measure={"prefill": prefill_rows, "decode": decode_rows})


def prepare_debug_fail(model: nn.Module, ctx: dict) -> Runner:
    """Harness self-test: a contender whose preparation raises."""
    raise RuntimeError("debug-fail: this contender always fails (harness self-test)")


def prepare_debug_hang(model: nn.Module, ctx: dict) -> Runner:
    """Harness self-test: a contender that never finishes (the time limit must end it)."""
    while True:
        time.sleep(1)


# Suites a contender cannot run at all, known before preparing it (no export spent to learn it).
_NO_CHUNKS = "no chunked prefill or prefix state cache"
UNSUPPORTED_SUITES: dict[str, dict[str, str]] = {
    "hf-eager": {"long-prefill": _NO_CHUNKS, "prefix-cache": _NO_CHUNKS},
    "torch-onnx": {
        "decode": "torch.onnx export has no state inputs/outputs: no decode graph",
        "long-prefill": "fixed length: runs only at the traced length",
        "prefix-cache": "no state inputs/outputs",
    },
    "torch-compile": {
        "memory": "not run: inductor compiles HF Mamba-1's per-token loop unrolled, which at "
        "2048+ tokens takes longer than any useful limit (see the prefill rows)",
        "long-prefill": _NO_CHUNKS,
        "prefix-cache": _NO_CHUNKS,
    },
    "matmuls-only": {
        suite: "a prefill bound only"
        for suite in ("decode", "memory", "export", "long-prefill", "prefix-cache")
    },
    **{
        name: {
            suite: "timed by llama-bench: prefill and decode only"
            for suite in ("memory", "long-prefill", "prefix-cache")
        }
        for name in ("llama-cpp", "llama-cpp-f16", "llama-cpp-q8_0")
    },
}

CONTENDERS: dict[str, Callable[[nn.Module, dict], Runner]] = {
    "hf-eager": prepare_hf_eager,
    "torch-compile": prepare_torch_compile,
    "torch-onnx": prepare_torch_onnx,
    "ssmcc-torch": prepare_ssmcc_torch,
    "ssmcc-onnx": prepare_ssmcc_onnx,
    "ssmcc-onnx-unfused": prepare_ssmcc_onnx_unfused,
    "ssmcc-onnx-portable": prepare_ssmcc_onnx_portable,
    # weight-only quantisation (quantize=): int8 per output channel, 16-bit float storage
    **{
        f"ssmcc-{target}-{scheme}": (
            lambda model, ctx, target=target, scheme=scheme: prepare_ssmcc_torch(
                model, ctx, quantize=scheme
            )
            if target == "torch"
            else _prepare_ssmcc_onnx(model, ctx, "auto", quantize=scheme)
        )
        for target in ("torch", "onnx")
        for scheme in ("int8", "bf16", "fp16")
    },
    "matmuls-only": prepare_matmuls_only,
    "llama-cpp": lambda model, ctx: _prepare_llama_cpp(model, ctx, "f32"),
    "llama-cpp-f16": lambda model, ctx: _prepare_llama_cpp(model, ctx, "f16"),
    "llama-cpp-q8_0": lambda model, ctx: _prepare_llama_cpp(model, ctx, "q8_0"),
}
DEBUG_CONTENDERS = {"debug-fail": prepare_debug_fail, "debug-hang": prepare_debug_hang}
