"""The activations of ``ssmcc.ops.activations`` on every path.

- The table: each name's form computes what transformers' ``ACT2FN[name]`` computes (the module
  Hugging Face's mixers apply), and names ``ACT2FN`` has but ssmcc has no form for are refused.
- Every op that takes an activation x every form x every path against the float64 oracle of the
  fuzz corpus (``fuzzing.py``: the reference, the C++ kernel through its torch entry, the node in
  ONNX Runtime with the ssmcc library and without it (its portable body), the Triton launcher in
  the interpreter), at the corpus's tolerances (mamba_ssm's). The TensorRT plugins' kernels:
  ``test_tensorrt_plugins.py`` (``test_conv_plugin_kernel_applies_each_activation``).
- A code outside the table is refused by the C++ kernels and the ONNX Runtime library.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from ssmcc.ops.activations import FORMS, NAMES, SUPPORTED, activation_code, apply_activation

from . import fuzzing

OPS = (
    "causal_conv1d",
    "causal_conv1d_update",
    "mamba_mixer",
    "mamba_mixer_step",
    "ssd_mixer",
    "ssd_mixer_step",
)
# one Hugging Face name per form (the other names of a form map to it: test_names_are_act2fn's)
NAME_OF_FORM = {
    "identity": None,
    "silu": "swish",
    "gelu": "gelu",
    "gelu_tanh": "gelu_new",
    "relu": "relu",
    "relu2": "relu2",
}
PATHS = ("reference", "cpp", "ort-lib", "portable", "triton")
SEQUENCE = {"causal_conv1d": ("x", -1), "mamba_mixer": ("zx", 1), "ssd_mixer": ("zxbcdt", 1)}


def test_every_form_has_a_name_and_a_code():
    assert set(NAME_OF_FORM) == set(FORMS) == set(NAMES.values())
    for code, form in enumerate(FORMS):
        assert activation_code("test", NAME_OF_FORM[form]) == code


@pytest.mark.parametrize("name", [n for n in SUPPORTED if n not in ("identity", "gelu_tanh")])
def test_names_are_act2fn(name):
    """ssmcc's form of each Hugging Face name against ``ACT2FN[name]`` on [-8, 8], float32 and
    float64 (the tanh GELUs are one function written four ways: float32 rounding apart)."""
    from transformers.activations import ACT2FN

    x = torch.linspace(-8, 8, 4001, dtype=torch.float64)
    for dtype, tolerance in ((torch.float64, 1e-12), (torch.float32, 1e-6)):
        got = apply_activation("test", x.to(dtype), name)
        expected = ACT2FN[name](x.to(dtype))
        assert got.dtype == dtype
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


def test_act2fn_names_without_a_form_are_refused():
    from transformers.activations import ACT2CLS

    refused = sorted(set(ACT2CLS) - set(SUPPORTED))
    assert {"mish", "gelu_10", "quick_gelu", "sigmoid", "tanh"} <= set(refused)
    for name in refused:
        with pytest.raises(RuntimeError, match=f"ssmcc.op: activation '{name}' is not supported"):
            activation_code("op", name)
    for name in ("GELU", 1, "", ("silu",)):
        with pytest.raises(RuntimeError, match="is not supported; use one of None \\(identity\\)"):
            activation_code("op", name)


def _fits(case) -> bool:
    """float32, and a sequence (if any) of 1-16 positions: every path takes it."""
    name, axis = SEQUENCE.get(case.op, (None, None))
    if case.dtype != torch.float32:
        return False
    if name is not None and not 1 <= case.args[name].shape[axis] <= 16:
        return False
    return all(fuzzing.applies(case, path) for path in PATHS)


@functools.cache
def _cases(op: str) -> dict:
    """Form -> the first fitting fuzz case of ``op`` with the activation set to the form's Hugging
    Face name and the conv weight scaled up (outputs over [-6, 6] or so), whose oracle outputs
    differ between every two forms by more than the checks below allow (10 ``TIGHT`` for the
    convs, 1e-2 for the mixers; the mixers' two GELUs, 4.7e-4 apart at most, excepted: the convs
    tell those apart), so that a path computing the wrong form fails."""
    conv = op.startswith("causal")
    for seed in range(1000):
        base = fuzzing.draw(op, seed)
        if not _fits(base):
            continue
        cases, outputs = {}, {}
        for form in FORMS:
            case = fuzzing.draw(op, seed)
            weight = "weight" if conv else "conv_weight"
            case.args[weight] = case.args[weight] * 3
            case.args["activation"] = NAME_OF_FORM[form]
            cases[form], outputs[form] = case, fuzzing.oracle(case)[0]
        pairs = [(a, b) for i, a in enumerate(FORMS) for b in FORMS[i + 1 :]]
        if not conv:
            pairs.remove(("gelu", "gelu_tanh"))
        apart = 10 * TIGHT if conv else 1e-2
        if all((outputs[a] - outputs[b]).abs().max() > apart for a, b in pairs):
            return cases
    raise AssertionError(f"no fuzz case of {op} fits every path and separates the forms")


TIGHT = 1e-5  # rtol = atol for the convs in float32: a k-term sum, then the form


def _check_tight(case, path: str) -> str | None:
    """The conv's outputs within ``TIGHT`` of the oracle: tight enough to tell the erf GELU from
    the tanh one (4.7e-4 apart at most, at |x| = 2.7), which the corpus's scan tolerance is not."""
    try:
        got = fuzzing.RUNNERS[path](case)
    except Exception as error:
        return f"{path} raised {type(error).__name__}: {error}"
    for g, e in zip(got, fuzzing.oracle(case), strict=True):
        try:
            torch.testing.assert_close(g.double(), e, rtol=TIGHT, atol=TIGHT)
        except AssertionError as error:
            return f"{path}: {str(error).strip().splitlines()[-2:]}"
    return None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("op", OPS)
def test_every_form_on_every_path(op, path):
    """Each form through ``op`` on ``path`` against the float64 oracle (the convs at ``TIGHT``,
    the fused mixers at the corpus's tolerances), on cases that tell the forms apart."""
    if path == "triton":
        pytest.importorskip("triton")
    conv = op.startswith("causal")
    failures = []
    for form, case in _cases(op).items():
        problem = _check_tight(case, path) if conv else fuzzing.check(case, path)
        if problem is not None:
            failures.append(f"{form}: {case.describe()}\n    {problem}")
    assert not failures, "\n".join(failures)


def test_the_cpp_kernels_refuse_an_unknown_code():
    from ssmcc.kernels.cpu.native import call_kernel

    x, weight = torch.randn(1, 2, 3), torch.randn(2, 4)
    out, state = torch.empty(1, 2, 3), torch.empty(1, 2, 3)
    with pytest.raises(RuntimeError, match=r"causal_conv1d: activation must be 0 \(identity\)"):
        call_kernel(
            "ssmcc_causal_conv1d_f32",
            x.data_ptr(),
            weight.data_ptr(),
            None,
            None,
            out.data_ptr(),
            state.data_ptr(),
            1,
            2,
            3,
            4,
            len(FORMS),
            1,
        )


@pytest.mark.parametrize("op", ["causal_conv1d", "ssd_mixer_step", "mamba_mixer"])
def test_the_ort_library_refuses_an_unknown_code(op):
    """A node whose activation attribute is no code: ONNX Runtime with the ssmcc library fails
    creating the session, naming the node's op and the codes."""
    case = _cases(op)["silu"]
    feed, attrs = fuzzing.node_form(case)
    attrs["activation"] = len(FORMS)
    with pytest.raises(Exception, match=r"activation must be 0 \(identity\), 1 \(silu\)"):
        fuzzing.session_for(op, feed, attrs, library=True)
    assert all(isinstance(v, np.ndarray) for v in feed.values())


def test_the_experts_route_maps_act2fn_classes_to_their_forms():
    """Hugging Face's experts are routed by their ``act_fn``'s class (``hf_moe``): each mapped
    class computes its form (``ssmcc.moe_experts``'s activations are forms of the same table)."""
    from transformers.activations import ACT2CLS, ACT2FN

    from ssmcc.frontend.hf_moe import _ACTIVATIONS
    from ssmcc.ops.moe_experts import ACTIVATIONS, activate

    x = torch.linspace(-8, 8, 4001)
    mapped = 0
    for name in ACT2CLS:
        module = ACT2FN[name]
        form = _ACTIVATIONS.get(type(module).__name__)
        if form is None:
            continue
        assert form in ACTIVATIONS and form == NAMES[name], name
        torch.testing.assert_close(activate(x, form), module(x), rtol=1e-6, atol=1e-6)
        mapped += 1
    assert mapped >= 11
