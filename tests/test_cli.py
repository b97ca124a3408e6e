"""The ssmcc command line, run as a user would (the installed console script) and in-process."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest
import torch

import ssmcc
from ssmcc.cli import main
from ssmcc.presets import build_preset

from .conftest import make_hf_model


def test_console_script_inspects_the_default_preset():
    exe = pathlib.Path(sys.executable).parent / "ssmcc"
    assert exe.exists(), "the ssmcc console script is not installed (pip install -e .)"
    done = subprocess.run(
        [str(exe), "inspect", "mamba-tiny"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "SSM layers:     2" in done.stdout
    assert "ssmcc ops:      mamba_mixer x2, rmsnorm_gated x3" in done.stdout
    assert "[ssmcc] capturing MambaForCausalLM" in done.stderr  # progress goes to stderr


def test_inspect_json_and_graph(capsys):
    assert main(["inspect", "falcon-mamba-tiny", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["capture"]["routes"] == ["hf-falcon-mamba"]
    assert report["op_counts"] == {"mamba_mixer": 2, "rmsnorm_gated": 3}
    assert main(["inspect", "mamba-tiny", "--graph", "--pipeline", "none"]) == 0
    out = capsys.readouterr().out
    assert "## nodes" in out and "ssmcc.selective_scan(" in out
    assert main(["inspect", "mamba-tiny", "--graph"]) == 0
    assert "ssmcc.mamba_mixer(" in capsys.readouterr().out


def test_inspect_a_saved_model_directory(tmp_path, capsys):
    model = make_hf_model("mamba", num_hidden_layers=2)
    model.save_pretrained(tmp_path / "my-mamba")
    assert main(["inspect", str(tmp_path / "my-mamba")]) == 0
    assert "backbone.layers.1.mixer (MambaMixer)" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv,message",
    [
        (["inspect", "no-such-model"], "neither a local model directory nor a preset"),
        (["inspect", "mamba-tiny", "--seq-len", "0"], "--seq-len must be >= 1"),
        (
            ["inspect", "mamba-tiny", "--pipeline", "fast"],
            "argument --pipeline: invalid choice: 'fast' "
            "(choose from 'default', 'unfused', 'none')",
        ),
        (["compile", "mamba-tiny", "--out", "x", "--chunk-size", "0"], "chunk_size must be a"),
        (["compile", "mamba-tiny", "--out", "x", "--threads", "2"], "belongs to target onnx"),
    ],
)
def test_bad_arguments_give_one_line_errors(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exit:  # argparse's own refusals (a choice not offered)
        code = exit.code
    assert code != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "compile", "inspect"])
def test_a_missing_model_is_reported_before_anything_else(command, tmp_path, capsys):
    extra = {"run": ["--prompt-ids", "1"], "compile": ["--out", str(tmp_path / "o")]}
    missing = str(tmp_path / "nonexistent_dir")
    assert main([command, missing, *extra.get(command, [])]) == 1
    err = capsys.readouterr().err
    assert err.splitlines() == [
        f"ssmcc: error: {missing!r} is neither a local model directory nor a preset; presets: "
        + err.split("presets: ", 1)[1].splitlines()[0]
    ]  # one line: nothing was announced, loaded or compiled first
    assert main([command, "state-spaces/mamba-130m-hf", *extra.get(command, [])]) == 1
    err = capsys.readouterr().err
    assert "hf download state-spaces/mamba-130m-hf --local-dir ./mamba-130m-hf" in err
    assert len(err.splitlines()) == 1


def test_directory_without_config(tmp_path, capsys):
    assert main(["inspect", str(tmp_path)]) == 1
    assert "has no config.json" in capsys.readouterr().err


def test_help_explains_commands(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "inspect" in out and "presets" in out and "coverage" in out
    assert main(["presets"]) == 0
    assert "mamba-130m" in capsys.readouterr().out


def test_run_streams_greedy_tokens_from_an_artifact(tmp_path, capsys):
    import torch

    import ssmcc
    from ssmcc.presets import build_preset

    out = str(tmp_path / "art")
    assert main(["compile", "mamba-tiny", "--out", out]) == 0
    capsys.readouterr()
    assert main(["run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "6"]) == 0
    captured = capsys.readouterr()
    tokens = [int(t) for t in captured.out.split()]
    expected = ssmcc.compile(build_preset("mamba-tiny")).generate(torch.tensor([[1, 2, 3]]), 6)
    assert tokens == expected[0, 3:].tolist()
    assert "time to first token" in captured.err
    argv = ["run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "6", "--chunk-size", "2"]
    assert main(argv) == 0  # the prompt in chunks of 2: the same tokens
    assert [int(t) for t in capsys.readouterr().out.split()] == tokens


def test_cli_defaults_come_from_the_options():
    """Flags take their defaults and choices from ssmcc.options and the target registry."""
    from ssmcc.cli import build_parser
    from ssmcc.lowering.registry import target_names
    from ssmcc.options import COMMON_OPTIONS, DEFAULT_TARGET

    parser = build_parser()
    args = parser.parse_args(["compile", "mamba-tiny", "--out", "x"])
    assert args.target == DEFAULT_TARGET and args.kernels == COMMON_OPTIONS["kernels"].default
    assert args.chunk_size == COMMON_OPTIONS["chunk_size"].default
    run = parser.parse_args(["run", "mamba-tiny", "--prompt-ids", "1"])
    assert run.chunk_size is None  # the artifact's own, or the option's default when compiling
    compile_parser = parser._subparsers._group_actions[0].choices["compile"]
    target_action = next(a for a in compile_parser._actions if a.dest == "target")
    assert list(target_action.choices) == target_names()
    # every option the API's compile takes has a flag, with the option's default
    for name, spec in COMMON_OPTIONS.items():
        if "compile" in spec.stages:
            assert getattr(args, name) == spec.default, name
    pipeline = next(a for a in compile_parser._actions if a.dest == "pipeline")
    assert list(pipeline.choices) == ["default", "unfused", "none"]


@pytest.mark.slow
def test_compile_takes_dtype_and_pipeline_like_the_api(tmp_path, capsys):
    out = str(tmp_path / "bf16")
    argv = ["compile", "mamba-tiny", "--target", "torch", "--dtype", "bfloat16", "--out", out]
    assert main([*argv, "--pipeline", "unfused", "--verify"]) == 0
    with open(f"{out}/manifest.json") as f:
        manifest = json.load(f)
    assert "mamba_mixer" not in manifest["ssmcc_ops"] and "selective_scan" in manifest["ssmcc_ops"]
    ids = torch.tensor([[1, 2, 3, 4]])
    got = ssmcc.load(out)(ids)
    model = build_preset("mamba-tiny")
    api = ssmcc.compile(model, target="torch", dtype="bfloat16", pipeline="unfused")
    torch.testing.assert_close(got, api(ids), rtol=0, atol=0)  # what the API compiles
    assert (got - ssmcc.compile(model, target="torch")(ids)).abs().max() > 1e-3  # not float32
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["compile", "mamba-tiny", "--dtype", "float64", "--out", str(tmp_path / "x")])
    assert "invalid choice: 'float64'" in capsys.readouterr().err


def test_compile_refuses_an_out_under_a_missing_folder_and_creates_nothing(tmp_path, capsys):
    out = tmp_path / "missing" / "deeper" / "artifact"
    assert main(["compile", "mamba-tiny", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert f"the folder {out.parent} (where {out} would go) does not exist" in err
    assert list(tmp_path.iterdir()) == []


def test_a_model_without_state_space_layers_is_said_at_compile(tmp_path, capsys):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=64)
    GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    assert main(["compile", str(tmp_path / "gpt2"), "--out", str(tmp_path / "art")]) == 0
    err = capsys.readouterr().err
    assert "has no state-space layer ssmcc knows (no ssmcc op in the program)" in err, err
    assert main(["compile", "mamba-tiny", "--out", str(tmp_path / "mamba")]) == 0
    assert "state-space layer" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv,message",
    [
        (["run", "mamba-tiny", "--prompt-ids", "1,x"], "expected comma-separated token ids"),
        (["run", "mamba-tiny", "--prompt-ids", "1,,2"], "empty entry in '1,,2'"),
        (["run", "mamba-tiny", "--prompt-ids", "1,-2"], "token ids are >= 0, got -2"),
        (["run", "mamba-tiny", "--prompt-ids", "1", "--prompt", "a"], "not allowed with"),
        (
            ["run", "mamba-tiny", "--prompt-ids", "1", "--max-new-tokens", "0"],
            "max_new_tokens must be an integer >= 1",
        ),
        (["run", "mamba-tiny", "--prompt-ids", "999999"], "outside the vocabulary"),
        (
            ["run", "mamba-tiny", "--prompt-ids", "1", "--chunk-size", "0"],
            "chunk_size must be a positive integer",
        ),
    ],
)
def test_run_rejects_bad_input(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as exit_info:  # argparse errors exit with 2
        code = exit_info.code
    assert code != 0
    assert message in capsys.readouterr().err


def test_inspect_a_saved_exported_program_lists_what_was_not_rewritten(tmp_path, capsys):
    import torch

    from benchmarks.handwritten_mamba import build

    ids = torch.randint(0, 64, (2, 8))
    for form in ("loop", "mixing"):
        program = torch.export.export(build(form, layers=1), (ids,), strict=False)
        torch.export.save(program, tmp_path / f"{form}.pt2")
    assert main(["inspect", str(tmp_path / "loop.pt2")]) == 0
    out = capsys.readouterr().out
    assert "ssmcc ops:      causal_conv1d x1, rmsnorm_gated x2, selective_scan x1" in out
    assert "not rewritten" not in out
    assert main(["inspect", str(tmp_path / "mixing.pt2")]) == 0
    out = capsys.readouterr().out
    assert "ssmcc ops:      causal_conv1d x1, rmsnorm_gated x2\n" in out  # the scan stays
    assert "not rewritten:  1 scan-like structure(s)" in out
    assert "unrolled_loop: layers.0.mixer" in out and "mixes state channels" in out


def test_inspect_without_routing_rerolls_the_hugging_face_loop(capsys):
    assert main(["inspect", "mamba-tiny", "--no-route", "--seq-len", "8", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["capture"]["routes"] == []
    assert report["op_counts"] == {"mamba_mixer": 2, "rmsnorm_gated": 3}  # re-rolled, then fused
    assert report["rule_hits"]["detect_selective_scan.unrolled_loop"] == 2
    assert report["rule_hits"]["detect_causal_conv1d.padded_conv_slice"] == 2


def test_inspect_of_a_missing_program_file(tmp_path, capsys):
    assert main(["inspect", str(tmp_path / "nothing.pt2")]) == 1
    assert "no such file (expected a program saved with torch.export.save)" in (
        capsys.readouterr().err
    )


@pytest.mark.slow
def test_compile_verbose_gives_each_phase_its_time_and_memory(tmp_path, capsys):
    import re

    out = tmp_path / "artifact"
    assert main(["compile", "mamba-tiny", "--target", "onnx", "--out", str(out), "-v"]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[ssmcc]")]
    timed = re.compile(r"\[ssmcc\] +\d+\.\ds rss \d+\.\d\d GB \(peak \d+\.\d\d GB\) \S")
    assert any("exporting the step graph to ONNX" in line for line in lines), lines
    assert all(timed.match(line) for line in lines if "exporting" in line), lines
    assert main(["compile", "mamba-tiny", "--out", str(tmp_path / "plain")]) == 0
    plain = [line for line in capsys.readouterr().err.splitlines() if "capturing" in line]
    assert plain and not any(" rss " in line for line in plain)  # without -v: no figures


@pytest.mark.slow
@pytest.mark.parametrize("target", ["torch", "onnx"])
def test_compile_builds_the_kernels_so_that_run_never_builds(target, tmp_path):
    """With an empty kernel cache, ``ssmcc compile`` builds what the target runs natively (with a
    progress line), and the first ``ssmcc run`` of the artifact, a new process, builds nothing."""
    import os

    from ssmcc.kernels.cpu.build import find_ort_headers

    env = {**os.environ, "SSMCC_CACHE_DIR": str(tmp_path / "cache")}
    if target == "onnx":
        headers = find_ort_headers()
        if headers is None:
            pytest.skip("ONNX Runtime's headers are not on this machine (fetch_ort_headers.sh)")
        env["SSMCC_ORT_INCLUDE"] = headers  # no network in the test: the headers at hand
    out = str(tmp_path / "artifact")
    command = [sys.executable, "-m", "ssmcc.cli"]
    compiled = subprocess.run(
        [*command, "compile", "mamba-tiny", "--target", target, "--out", out],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert compiled.returncode == 0, compiled.stderr
    assert "preparing the" in compiled.stderr and "[ssmcc] building lib" in compiled.stderr
    ran = subprocess.run(
        [*command, "run", out, "--prompt-ids", "1,2,3", "--max-new-tokens", "2"],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr
    assert "building" not in ran.stderr, ran.stderr


def test_headers_that_cannot_be_fetched_are_said_and_the_cache_dir_is_honoured(
    tmp_path, monkeypatch
):
    import os

    from ssmcc.kernels.cpu import prepare

    monkeypatch.setattr(prepare, "find_ort_headers", lambda: None)
    monkeypatch.setattr(prepare.shutil, "which", lambda tool: None if tool == "apt-get" else tool)
    said = []
    assert prepare.prepare_native_kernels("onnx", "auto", said.append) == []
    assert "fetching them needs apt-get" in said[-1] and "portable ONNX bodies" in said[-1]
    # the fetch script's default folder is the one the build reads, under SSMCC_CACHE_DIR
    headers = tmp_path / "ort-headers" / "onnxruntime"
    headers.mkdir(parents=True)
    (headers / "onnxruntime_cxx_api.h").write_text("")
    done = subprocess.run(
        ["bash", prepare.FETCH_SCRIPT],
        capture_output=True,
        text=True,
        env={**os.environ, "SSMCC_CACHE_DIR": str(tmp_path)},
    )
    assert done.returncode == 0 and f"already in {headers}" in done.stdout, done.stdout


@pytest.mark.slow
def test_run_compiles_a_model_for_the_target_and_options_asked(tmp_path, capsys):
    """``ssmcc run MODEL`` compiles for ``--target`` with ``--dtype``/``--pipeline``/``--quantize``
    first (the tokens are those of the API's compile); given an artifact they are refused."""
    argv = ["run", "mamba-tiny", "--prompt-ids", "1,2,3", "--max-new-tokens", "4"]
    assert main([*argv, "--target", "onnx", "--pipeline", "unfused"]) == 0
    captured = capsys.readouterr()
    assert "compiling it for the onnx target" in captured.err
    api = ssmcc.compile(build_preset("mamba-tiny"), target="onnx", pipeline="unfused")
    expected = api.generate(torch.tensor([[1, 2, 3]]), 4)[0, 3:].tolist()
    assert captured.out.split() == [str(t) for t in expected]
    out = str(tmp_path / "artifact")
    assert main(["compile", "mamba-tiny", "--out", out]) == 0
    capsys.readouterr()
    assert main(["run", out, "--prompt-ids", "1", "--dtype", "bfloat16", "--target", "onnx"]) == 1
    err = capsys.readouterr().err
    assert "--target, --dtype: " in err and "is an artifact, compiled already" in err, err
