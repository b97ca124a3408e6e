"""A plain module captured with a length torch.export fixed (mamba.py's ``Mamba``: a Python loop
over time, or its pscan padding to a power of two) runs at any length on every target once the
passes have replaced what used that length (``relax_static_dims``); a program that really is
static says so in the compile report, and a call at another size is one ``InputError`` line
naming the input, the dim, the expected and the given size. Outputs against the eager module
within 1e-4 (fp32)."""

from __future__ import annotations

import functools

import pytest
import torch

import ssmcc
from ssmcc.errors import InputError

TOLERANCE = 1e-4


@functools.cache
def _mamba_py(pscan: bool = False):
    from mambapy.mamba import Mamba, MambaConfig

    torch.manual_seed(0)
    return Mamba(MambaConfig(d_model=16, n_layers=2, d_state=4, pscan=pscan)).eval()


def _check_lengths(compiled, model, lengths=(7, 12, 1)):
    for batch, length in zip((2, 1, 3), lengths, strict=True):
        x = torch.randn(batch, length, 16, generator=torch.Generator().manual_seed(length))
        with torch.no_grad():
            expected = model(x)
        assert (torch.as_tensor(compiled(x)) - expected).abs().max() <= TOLERANCE, length


@pytest.mark.parametrize(
    "target,pscan",
    [("torch", False), ("onnx", False), pytest.param("torch", True, marks=pytest.mark.slow)],
)
def test_mamba_py_runs_at_any_length(target, pscan):
    model = _mamba_py(pscan)
    compiled = ssmcc.compile(model, target, example_inputs=(torch.randn(2, 7, 16),))
    assert compiled.report.op_counts["selective_scan"] == 2
    assert compiled.info["input_dims"] == [{"name": "x", "dims": [None, None, 16]}]
    notes = "\n".join(compiled.report.capture.notes)
    assert "made dynamic: x dim 1 (7)" in notes
    assert "static (calls must have these sizes): x dim 2 (16)" in notes
    assert compiled.report.capture.dynamic_dims["x"][2] == "16"
    _check_lengths(compiled, model)
    with pytest.raises(InputError, match=r"^input x \(argument 0\) has size 8 in dim 2; .* 16 "):
        compiled(torch.randn(1, 5, 8))


def test_a_length_equal_to_the_width_is_still_made_dynamic():
    """Captured at 16 positions of width 16: the dims of size 16 fail together (the weights fix
    the width), then axis by axis: the length alone is made dynamic."""
    model = _mamba_py()
    compiled = ssmcc.compile(model, "torch", example_inputs=(torch.randn(2, 16, 16),))
    assert compiled.info["input_dims"] == [{"name": "x", "dims": [None, None, 16]}]
    assert "made dynamic: x dim 1 (16)" in "\n".join(compiled.report.capture.notes)
    _check_lengths(compiled, model, lengths=(16, 5, 9))


@pytest.mark.parametrize("target", ["torch", pytest.param("onnx", marks=pytest.mark.slow)])
def test_a_program_that_stays_static_says_so_and_refuses_other_lengths(target, tmp_path):
    """Without the passes the unrolled loop keeps the length: the report's inputs and notes say
    so, the captured length runs, another is refused in one line (on the torch target it was a
    guard traceback), also after saving and loading."""
    model = _mamba_py()
    x = torch.randn(2, 7, 16)
    compiled = ssmcc.compile(model, target, example_inputs=(x,), pipeline="none")
    assert compiled.info["input_dims"] == [{"name": "x", "dims": [None, 7, 16]}]
    report = compiled.report.format()
    assert "x: (s" in report and ", 7, 16)" in report
    assert "static (calls must have these sizes): x dim 1 (7): " in report
    with torch.no_grad():
        assert (torch.as_tensor(compiled(x[:1])) - model(x[:1])).abs().max() <= TOLERANCE
    message = (
        r"^input x \(argument 0\) has size 12 in dim 1; this compiled model runs only at size 7 "
        r"there \(.*\), input shape \(any, 7, 16\)$"
    )
    with pytest.raises(InputError, match=message):
        compiled(torch.randn(1, 12, 16))
    with pytest.raises(InputError, match=r"takes 1 input\(s\) \(x\), got 2"):
        compiled(x, x)
    with pytest.raises(InputError, match=r"must have rank 3 \(any, 7, 16\), got shape \(7, 16\)"):
        compiled(x[0])
    compiled.save(str(tmp_path / "artifact"))
    loaded = ssmcc.load(str(tmp_path / "artifact"))
    with pytest.raises(InputError, match=message):
        loaded(torch.randn(1, 12, 16))
    assert (torch.as_tensor(loaded(x)) - torch.as_tensor(compiled(x))).abs().max() == 0
