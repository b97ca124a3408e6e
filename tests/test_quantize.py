"""Weight-only quantisation (``quantize=``): the ops against their math, the C++ and ORT kernels
against the references, the ``quantize_weights`` pass's rules, every target and scheme against
the quantised program's reference, the portable ONNX form in stock ONNX Runtime, and accuracy
against float32 on a model whose weights were trained (random weights hide quantisation error)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import pytest
import torch

import ssmcc
from ssmcc.ops.quantized_linear import (
    INT8_MAX,
    SCHEMES,
    dequantize_weight,
    quantize_weight,
    quantized_embedding_ref,
    quantized_linear_ref,
)
from ssmcc.options import QUANTIZE
from tests.conftest import make_hf_model

SCHEME_NAMES = [q for q in QUANTIZE if q != "none"]
SLOW = pytest.mark.slow
# float32 sums in another order: a few ulps of |x| |W| k
KERNEL_TOLERANCE = dict(rtol=1e-5, atol=1e-4)


def _weight(rows: int, cols: int, seed: int = 0) -> torch.Tensor:
    """Rows with different ranges (and one all-zero row), as trained weights have."""
    generator = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=generator)
    w *= torch.logspace(-2, 1, rows)[:, None]
    w[rows // 2] = 0.0
    return w


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
def test_quantize_weight_error_is_half_a_step(scheme):
    w = _weight(20, 128)
    stored, scale = quantize_weight(w, scheme)
    dtype, group = SCHEMES[scheme]
    assert stored.dtype == dtype and scale.dtype == torch.float32
    assert scale.shape == (20, 1 if group is None else 128 // group)
    error = (dequantize_weight(stored, scale) - w).abs()
    if dtype == torch.int8:
        assert stored.abs().max() <= INT8_MAX
        step = scale.repeat_interleave(128 // scale.shape[1], dim=1)
        assert (error <= step / 2 * (1 + 1e-6)).all()
        assert (dequantize_weight(stored, scale)[10] == 0).all()  # the zero row stays zero
    else:
        assert (scale == 1).all()
        assert torch.equal(dequantize_weight(stored, scale), w.to(dtype).float())


def test_references_are_the_dequantised_float_ops():
    w, bias = _weight(12, 64), torch.randn(12)
    stored, scale = quantize_weight(w, "int8-g32")
    dense = dequantize_weight(stored, scale)
    x = torch.randn(2, 3, 64)
    torch.testing.assert_close(
        quantized_linear_ref(x, stored, scale, bias), torch.nn.functional.linear(x, dense, bias)
    )
    ids = torch.tensor([[0, 11, 5], [3, 3, 10]])
    assert torch.equal(quantized_embedding_ref(ids, stored, scale), dense[ids])


def test_bad_operands_are_refused_with_the_rule():
    stored, scale = quantize_weight(_weight(8, 64), "int8")
    with pytest.raises(Exception, match=r"x must be \(\.\.\., 64\)"):
        quantized_linear_ref(torch.randn(2, 63), stored, scale)
    with pytest.raises(Exception, match="weight must be stored as int8"):
        quantized_linear_ref(torch.randn(2, 64), stored.float(), scale)
    with pytest.raises(Exception, match="groups must divide"):
        quantized_linear_ref(torch.randn(2, 64), stored, torch.ones(8, 3))


def _grouped_int8(weight, group: int):
    """int8 per group of ``group`` columns, as ``quantize_weight`` stores its group schemes."""
    rows, cols = weight.shape
    grouped = weight.reshape(rows, cols // group, group)
    scale = grouped.abs().amax(-1) / 127
    stored = torch.round(grouped / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return stored.reshape(rows, cols), scale


def _mixer_operands(step: bool, scheme: str = "int8"):
    """A fused Mamba-1 mixer's operands (d 72, R 5, n 7) with x_proj and dt_proj stored small
    (d = 72: groups of 32 do not fit, of 8 / 24 / 72 do; AVX-512's 64-weight step and a tail)."""
    from ssmcc.ops.quantized_linear import quantize_weight as q

    g = torch.Generator().manual_seed(5)
    d, k, R, n = 72, 4, 5, 7
    zx = torch.randn(2, *(() if step else (9,)), 2 * d, generator=g)
    x_proj, dt_proj = torch.randn(R + 2 * n, d, generator=g) * 0.2, torch.randn(d, R, generator=g)
    if scheme.startswith("int8-g"):  # groups of 24 columns (3 a row): quantize_weight's formula
        xq, xs = _grouped_int8(x_proj, 24)
        dq, ds = q(dt_proj, "int8")
    else:
        (xq, xs), (dq, ds) = q(x_proj, scheme), q(dt_proj, scheme)
    args = [zx, torch.randn(d, k, generator=g), torch.randn(d, generator=g), xq, dq]
    args += [-torch.rand(d, n, generator=g), torch.randn(d, generator=g), None, 0, d]
    states = [torch.randn(2, d, k - 1, generator=g), torch.randn(2, d, n, generator=g)]
    extra = ["silu", True, None, *states]
    return args, extra, dict(x_proj_scale=xs, dt_proj_scale=ds), (x_proj, dt_proj)


@pytest.mark.parametrize("step", [False, True])
@pytest.mark.parametrize("scheme", ["int8", "int8-g24", "fp16", "bf16"])
def test_mixer_with_small_projections_is_the_float_mixer_on_the_dequantised_weights(step, scheme):
    """The fused mixer's reference with stored x_proj / dt_proj equals the float op on
    ``weight * scale``; the C++ kernel equals the reference (sequence and step paths)."""
    from ssmcc.kernels.cpu import native
    from ssmcc.kernels.cpu.mixer_binding import mamba_mixer_cpu, mamba_mixer_step_cpu
    from ssmcc.ops.mamba_mixer import mamba_mixer_ref, mamba_mixer_step_ref

    ref, cpu = (
        (mamba_mixer_step_ref, mamba_mixer_step_cpu) if step else (mamba_mixer_ref, mamba_mixer_cpu)
    )
    args, extra, scales, _ = _mixer_operands(step, scheme)
    dense = [dequantize_weight(args[3], scales["x_proj_scale"])]
    dense.append(dequantize_weight(args[4], scales["dt_proj_scale"]))
    expected = ref(*args[:3], *dense, *args[5:], *extra)
    got = ref(*args, *extra, **scales)
    for e, o in zip(expected, got, strict=True):
        torch.testing.assert_close(o, e, rtol=0, atol=0)
    if native.available():
        for e, o in zip(expected, cpu(*args, *extra, **scales), strict=True):
            torch.testing.assert_close(o, e, **KERNEL_TOLERANCE)


def test_mixer_projection_storage_is_checked_in_python_and_in_the_kernel():
    from ssmcc.kernels.cpu import mixer_binding, native
    from ssmcc.ops.mamba_mixer import mamba_mixer_step_ref

    args, extra, scales, (x_proj, _) = _mixer_operands(step=True)
    with pytest.raises(RuntimeError, match="x_proj_weight must be a real floating-point"):
        mamba_mixer_step_ref(*args, *extra)  # int8 without its scale
    with pytest.raises(RuntimeError, match=r"mamba_mixer_step \(x_proj_weight\): scale must be"):
        mamba_mixer_step_ref(*args, *extra, **{**scales, "x_proj_scale": torch.ones(3, 1)})
    with pytest.raises(RuntimeError, match="groups must divide"):
        mamba_mixer_step_ref(*args, *extra, **{**scales, "x_proj_scale": torch.ones(19, 5)})
    if not native.available():
        return
    # the unchecked entry (the torch lowering's) reaches the C++ contract
    with pytest.raises(RuntimeError, match="x_proj scale groups=5 must divide its 72 columns"):
        mixer_binding._mamba_mixer_step(
            *args, *extra, **{**scales, "x_proj_scale": torch.ones(19, 5)}
        )


@pytest.mark.parametrize("scheme", SCHEME_NAMES)
@pytest.mark.parametrize("rows", [1, 3, 8, 13])  # 13: more rows than the matrix-vector path
@pytest.mark.parametrize("cols", [128, 72, 45])  # 72: a vector tail; 45: a scalar one too
def test_cpp_kernel_matches_reference(scheme, rows, cols):
    from ssmcc.kernels.cpu import native
    from ssmcc.kernels.cpu.quantized_binding import quantized_linear_cpu

    if not native.available():
        pytest.skip("the C++ kernels do not build here")
    group = SCHEMES[scheme][1]
    if group is not None and cols % group:
        pytest.skip(f"{scheme} needs columns divisible by {group}")
    stored, scale = quantize_weight(_weight(37, cols), scheme)  # 37: a partial row block
    x, bias = torch.randn(rows, cols), torch.randn(37)
    for b in (bias, None):
        torch.testing.assert_close(
            quantized_linear_cpu(x, stored, scale, b),
            quantized_linear_ref(x, stored, scale, b),
            **KERNEL_TOLERANCE,
        )


@pytest.mark.parametrize("scheme", ["int8", "int8-g32", "bf16", "fp16"])
@pytest.mark.parametrize("rows", [1, 9, 300])  # the emitter uses the node for few; any are right
@pytest.mark.parametrize("out_features", [37, 130])  # a partial row block, several blocks
def test_ort_library_node_matches_reference_at_any_rows(scheme, rows, out_features):
    """The ssmcc ORT library's QuantizedLinear / HalfLinear node alone, x (2, rows, k), against
    the reference."""
    from onnx import TensorProto, helper, numpy_helper

    from ssmcc.lowering.onnx.runtime import custom_op_library
    from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION

    library = custom_op_library("auto")
    if library is None:
        pytest.skip("the ssmcc ORT library does not build here")
    import onnxruntime as ort

    cols = 96
    stored, scale = quantize_weight(_weight(out_features, cols), scheme)
    x, bias = torch.randn(2, rows, cols), torch.randn(out_features)
    weight = stored.view(torch.int16) if stored.dtype == torch.bfloat16 else stored
    weight_tensor = numpy_helper.from_array(weight.numpy(), "weight")
    if stored.dtype == torch.bfloat16:
        weight_tensor.data_type = TensorProto.BFLOAT16
    name = "QuantizedLinear" if stored.dtype == torch.int8 else "HalfLinear"
    graph = helper.make_graph(
        [helper.make_node(name, ["x", "weight", "scale", "bias"], ["y"], domain=DOMAIN)],
        "one_node",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, rows, cols])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            weight_tensor,
            numpy_helper.from_array(scale.numpy(), "scale"),
            numpy_helper.from_array(bias.numpy(), "bias"),
        ],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid(DOMAIN, VERSION)]
    )
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    session = ort.InferenceSession(model.SerializeToString(), options)
    (y,) = session.run(None, {"x": x.numpy()})
    torch.testing.assert_close(
        torch.from_numpy(y), quantized_linear_ref(x, stored, scale, bias), **KERNEL_TOLERANCE
    )


def test_pass_rules_on_mamba():
    """Every projection (the fused mixer's x_proj and dt_proj too) and the tied head/embedding:
    one int8 copy."""
    model = make_hf_model("mamba", hidden_size=64, vocab_size=300)
    compiled = ssmcc.compile(model, target="torch", quantize="int8", kernels="reference")
    hits = compiled.report.rule_hits
    layers = model.config.num_hidden_layers
    assert hits["quantize_weights.linear"] == 2 * layers + 1  # in/out projections + LM head
    assert hits["quantize_weights.mixer"] == 2 * layers  # x_proj, dt_proj
    assert hits["quantize_weights.embedding"] == 1 and hits["quantize_weights.tied"] == 1
    program = compiled.program
    assert not [n for n in program.graph.nodes if n.target == torch.ops.aten.linear.default]
    mixers = [n for n in program.graph.nodes if n.target == torch.ops.ssmcc.mamba_mixer.default]
    assert len(mixers) == layers
    for mixer in mixers:
        assert mixer.args[3].meta["val"].dtype == mixer.args[4].meta["val"].dtype == torch.int8
        assert {"x_proj_scale", "dt_proj_scale"} <= set(mixer.kwargs)
    int8 = {k for k, v in program.state_dict.items() if v.dtype == torch.int8}
    assert "model.lm_head.weight.quantized" in int8 and len(int8) == 4 * layers + 1
    q = compiled.report.quantization
    assert q["weights"] == 4 * layers + 1
    assert q["bytes_after"] < q["bytes_before"] / 2
    assert not any("x_proj" in line or "dt_proj" in line for line in q["kept"])
    assert "quantized:      int8" in compiled.report.format()


def test_group_that_does_not_divide_keeps_the_weight_and_says_why():
    """A linear weight is kept float; a fused mixer's x_proj / dt_proj is stored int8 per output
    channel instead (any scale layout serves the mixer), and the report says so."""
    model = make_hf_model("mamba")  # hidden 24: no group of 32 fits
    compiled = ssmcc.compile(model, target="torch", quantize="int8-g32", kernels="reference")
    kept = compiled.report.quantization["kept"]
    assert any("not a multiple of the group size 32" in line for line in kept)
    per_channel = compiled.report.quantization["notes"]
    assert all("stored int8: its" in line for line in per_channel)
    assert "note:" in compiled.report.format()
    assert len(per_channel) == 2 * model.config.num_hidden_layers
    assert all("x_proj" in line or "dt_proj" in line for line in per_channel)
    assert compiled.report.quantization["weights"] == 2 * model.config.num_hidden_layers
    scales = [v for k, v in compiled.program.state_dict.items() if k.endswith("proj.weight.scale")]
    assert scales and all(scale.shape[1] == 1 for scale in scales)


@pytest.fixture(scope="module")
def small_mamba():
    # two layers: what holds per layer is counted per layer, and a second layer shows it repeats
    return make_hf_model("mamba", hidden_size=64, vocab_size=300, seed=3, num_hidden_layers=2)


@pytest.fixture(scope="module")
def quantised_reference():
    """``(model, scheme)`` -> the torch target's quantised program on the reference kernels,
    compiled once per module: the cases of one scheme on different targets compare against the
    same compile (a model of one ``id`` is not changed by any test here)."""
    compiled = {}

    def reference(model, scheme: str):
        key = (id(model), scheme)
        if key not in compiled:
            compiled[key] = ssmcc.compile(
                model, target="torch", quantize=scheme, kernels="reference"
            )
        return compiled[key]

    return reference


# The default run covers each storage on each target once (a group size on torch); the slow run
# adds a group size on ONNX and bf16 on torch (the other group sizes and fp16 take these paths).
TARGET_CASES = [
    ("torch", "int8"),
    pytest.param("torch", "int8-g64", marks=SLOW),
    pytest.param("torch", "fp16", marks=SLOW),
    pytest.param("onnx", "int8", marks=SLOW),  # by default: test_onnx_step_uses_the_library_kernel
    pytest.param("onnx", "bf16", marks=SLOW),
    pytest.param("onnx", "int8-g32", marks=SLOW),
    pytest.param("torch", "bf16", marks=SLOW),
]


@pytest.mark.parametrize(("target", "scheme"), TARGET_CASES)
def test_targets_compute_the_quantised_program(small_mamba, quantised_reference, target, scheme):
    """Prefill logits equal the quantised program's reference; decode equals the torch target's
    reference tokens, with the native kernels and with the references / portable bodies."""
    ids = torch.randint(0, 300, (2, 11), generator=torch.Generator().manual_seed(1))
    reference = quantised_reference(small_mamba, scheme)
    with torch.no_grad():
        expected = reference.program.module()(ids)
    tokens = reference.generate(ids, max_new_tokens=6)
    for kernels in ("auto", "reference"):
        compiled = ssmcc.compile(small_mamba, target=target, quantize=scheme, kernels=kernels)
        torch.testing.assert_close(compiled(ids), expected, rtol=1e-4, atol=1e-4)
        assert torch.equal(compiled.generate(ids, max_new_tokens=6), tokens)


def test_onnx_step_uses_the_library_kernel_and_int8_initializers(small_mamba, tmp_path):
    """In step.onnx every projection is one QuantizedLinear node over int8 initializers; a wrong
    function body changes nothing while the library runs the node, and everything without it."""
    from onnx import helper

    from ssmcc.lowering.onnx.runtime import make_session

    compiled = ssmcc.compile(small_mamba, target="onnx", quantize="int8")
    folder = shutil.copytree(compiled.executable.folder, tmp_path / "copy")
    proto = onnx.load(str(folder / "step.onnx"))
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("QuantizedLinear") == 2 * small_mamba.config.num_hidden_layers + 1
    assert "Gemm" not in ops and "MatMul" not in ops
    layers = small_mamba.config.num_hidden_layers
    assert ops.count("QuantizedMambaMixerStep") == layers and "MambaMixerStep" not in ops
    int8 = [t for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8]
    assert len(int8) == 4 * layers + 1  # in/out projections, x_proj, dt_proj, the head
    # prefill: each product dequantises the same int8 initializers per call and reads the
    # float32 weight (n, k) as it comes (FusedMatMul transB): no float32 copy held, none transposed
    prefill = onnx.load(str(folder / "prefill.onnx"), load_external_data=False)
    prefill_ops = [n.op_type for n in prefill.graph.node]
    products = 2 * small_mamba.config.num_hidden_layers + 1
    assert prefill_ops.count("FusedMatMul") == prefill_ops.count("DequantizeLinear") == products
    assert "MatMul" not in prefill_ops and "Transpose" not in prefill_ops
    # the chunk program's head runs on the last position only: one row per sequence
    chunk = onnx.load(str(folder / "chunk.onnx"), load_external_data=False)
    assert [n.op_type for n in chunk.graph.node].count("QuantizedLinear") == 1
    ids = torch.randint(0, 300, (2, 11))
    torch.testing.assert_close(
        compiled.prefill(ids, last_only=True, chunk_size=4)[0],
        compiled(ids)[:, -1],
        **KERNEL_TOLERANCE,
    )

    proto = onnx.load(str(folder / "step.onnx"), load_external_data=False)
    index = next(i for i, f in enumerate(proto.functions) if f.name == "QuantizedLinear")
    body = proto.functions[index]
    wrong = helper.make_function(
        "ssmcc",
        "QuantizedLinear",
        list(body.input),
        ["y"],
        [
            helper.make_node("Shape", ["bias"], ["n"]),
            helper.make_node("Shape", ["x"], ["lead"], end=-1),
            helper.make_node("Concat", ["lead", "n"], ["shape"], axis=0),
            helper.make_node("ConstantOfShape", ["shape"], ["y"]),
        ],
        list(body.opset_import),
    )
    proto.functions[index].CopyFrom(wrong)
    path = str(folder / "wrong_body.onnx")
    onnx.save(proto, path)
    ids = torch.randint(0, 300, (2, 1))
    feed = {"input_ids": ids.numpy()}
    for spec in compiled.state_specs:
        feed[spec.name] = np.random.default_rng(0).standard_normal(
            (2, *spec.shape), dtype=np.float32
        )
    expected = make_session(str(folder / "step.onnx"), "reference").run(["logits"], feed)[0]
    library = make_session(path, "auto").run(["logits"], feed)[0]
    portable = make_session(path, "reference").run(["logits"], feed)[0]
    np.testing.assert_allclose(library, expected, rtol=1e-4, atol=1e-4)
    assert np.abs(portable).max() == 0


@SLOW
def test_bfloat16_model_with_int8_weights(small_mamba):
    compiled = ssmcc.compile(small_mamba, target="torch", dtype="bfloat16", quantize="int8")
    ids = torch.randint(0, 300, (2, 7))
    with torch.no_grad():
        expected = compiled.program.module()(ids)
    out = compiled(ids)
    kept = {v.dtype for k, v in compiled.program.state_dict.items() if "norm" in k}
    assert kept == {torch.bfloat16}  # what is not quantised computes in bfloat16
    torch.testing.assert_close(out, expected.float(), rtol=2e-2, atol=2e-2)
    assert compiled.generate(ids, max_new_tokens=3).shape == (2, 10)


def test_quantised_torch_artifact_round_trips(small_mamba, tmp_path):
    compiled = ssmcc.compile(small_mamba, target="torch", quantize="int8-g32")
    compiled.save(str(tmp_path / "art"))
    loaded = ssmcc.load(str(tmp_path / "art"))
    ids = torch.randint(0, 300, (1, 5))
    assert torch.equal(loaded.generate(ids, 4), compiled.generate(ids, 4))
    weights = (tmp_path / "art" / "weights.safetensors").stat().st_size
    fp32 = sum(p.numel() * 4 for p in small_mamba.parameters())
    assert weights < 0.6 * fp32


def test_cli_compile_quantize(tmp_path, capsys):
    from ssmcc.cli import main

    assert main(["compile", "mamba-tiny", "--quantize", "int8", "--out", str(tmp_path / "a")]) == 0
    # mamba-tiny: 2 layers x (in_proj, out_proj, x_proj, dt_proj) + the tied head/embedding
    assert "quantized int8: 9 weights" in capsys.readouterr().err
    manifest = ssmcc.load(str(tmp_path / "a")).manifest
    assert manifest["quantization"]["scheme"] == "int8"
    assert manifest["quantization"]["accuracy"]["top1_agreement"] > 0.9


# --- accuracy on trained weights ----------------------------------------------------------------

GENERATED = 64
PROMPTS, PROMPT_LENGTH = 8, 32


def _greedy_agreement(model, compiled, prompts) -> float:
    """The fraction of generated positions where the quantised model, fed the float model's own
    continuation (teacher forcing), picks the same next token: each position judged on its own
    instead of every token after a first divergence counting against it."""
    agree = total = 0
    for prompt in prompts:
        with torch.no_grad():
            reference = model.generate(
                prompt, max_new_tokens=GENERATED, do_sample=False, min_new_tokens=GENERATED
            )
            expected = model(reference).logits[0, prompt.shape[1] - 1 : -1].argmax(-1)
        got = compiled(reference)[0, prompt.shape[1] - 1 : -1].argmax(-1)
        agree += int((got == expected).sum())
        total += GENERATED
    return agree / total


@SLOW
def test_the_trained_model_has_learnt_its_text(trained_mamba_model):
    """The fixture is what these tests need: on held-out bytes its loss is far below a random
    model's of the same config (ln 256 = 5.5 nats/byte). Here, not in a module of its own, so
    that one pytest-xdist worker trains it."""
    from tests.trained_models import held_out_ids, next_byte_loss, untrained_mamba

    held_out = held_out_ids()[:384]
    assert next_byte_loss(trained_mamba_model, held_out) < 3.0
    assert next_byte_loss(untrained_mamba(), held_out) > 5.0


@SLOW
def test_int8_per_channel_accuracy_on_a_trained_mamba(trained_mamba_model):
    from ssmcc.runtime.quantization_report import quantization_accuracy, reference_logits
    from tests.trained_models import prompts

    model = trained_mamba_model
    compiled = ssmcc.compile(model, target="torch", quantize="int8")
    float32 = ssmcc.compile(model, target="torch")
    chosen = prompts(PROMPTS, PROMPT_LENGTH)
    text = (torch.cat(chosen),)
    on_text = quantization_accuracy(reference_logits(float32.program, text), compiled.program, text)
    assert on_text["logit_cosine_min"] >= 0.999, on_text
    assert compiled.report.quantization["accuracy"]["logit_cosine_mean"] >= 0.999
    assert _greedy_agreement(model, compiled, chosen) >= 0.95
    # free-running greedy decoding: the same 64 tokens for most prompts
    same = 0
    for prompt in chosen:
        with torch.no_grad():
            expected = model.generate(prompt, max_new_tokens=GENERATED, do_sample=False)
        got = compiled.generate(prompt, max_new_tokens=GENERATED)
        same += int((got[0, -GENERATED:] == expected[0, -GENERATED:]).sum())
    assert same / (PROMPTS * GENERATED) >= 0.95


@SLOW
def test_portable_int8_onnx_gives_the_same_tokens_in_stock_onnxruntime(
    trained_mamba_model, tmp_path
):
    """The int8 artifact without the ssmcc library (portable bodies, DequantizeLinear) in stock
    ONNX Runtime: the tokens of the torch target's int8 program."""
    from tests.trained_models import prompts

    torch_int8 = ssmcc.compile(trained_mamba_model, target="torch", quantize="int8")
    compiled = ssmcc.compile(trained_mamba_model, target="onnx", quantize="int8")
    compiled.save(str(tmp_path / "art"))
    portable = ssmcc.load(str(tmp_path / "art"), kernels="reference")
    for prompt in prompts(3, PROMPT_LENGTH):
        expected = torch_int8.generate(prompt, max_new_tokens=32)
        assert torch.equal(portable.generate(prompt, max_new_tokens=32), expected)
        assert torch.equal(compiled.generate(prompt, max_new_tokens=32), expected)


FAMILY_CASES = [
    pytest.param("jamba-tiny", "torch", "int8", marks=SLOW),
    pytest.param("jamba-tiny", "onnx", "int8", marks=SLOW),  # experts through DequantizeLinear
    pytest.param("granite-hybrid-tiny", "onnx", "bf16", marks=SLOW),  # experts through Cast
]


@pytest.fixture(scope="module")
def hybrid_models():
    """``preset`` -> its model (seed 0), built once per module: jamba's two cases share it, and
    with it their reference compile (``quantised_reference``)."""
    from ssmcc.presets import build_preset

    built = {}

    def model(preset: str):
        if preset not in built:
            built[preset] = build_preset(preset, seed=0)
        return built[preset]

    return model


@pytest.mark.parametrize(("preset", "target", "scheme"), FAMILY_CASES)
def test_quantised_hybrids(hybrid_models, quantised_reference, preset, target, scheme):
    """Attention projections, MLPs and each expert's matrices quantised, the MoE router kept
    exact (named in the report), logits those of the quantised program's reference, decode its
    tokens."""
    model = hybrid_models(preset)
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(0, model.config.vocab_size, (2, 9), generator=generator)
    reference = quantised_reference(model, scheme)
    with torch.no_grad():
        expected = reference.program.module()(ids)
    compiled = ssmcc.compile(model, target=target, quantize=scheme)
    torch.testing.assert_close(compiled(ids), expected, rtol=1e-4, atol=1e-4)
    assert torch.equal(
        compiled.generate(ids, max_new_tokens=4), reference.generate(ids, max_new_tokens=4)
    )
    quantization = compiled.report.quantization
    assert quantization["accuracy"]["logit_cosine_min"] > 0.99
    assert any("a router" in line for line in quantization["kept"])  # routers stay float32
    assert compiled.report.rule_hits["quantize_weights.experts"] >= 2
    stored = SCHEMES[scheme][0]
    experts = [v for v in compiled.program.state_dict.values() if v.dim() == 3]
    assert experts and all(v.dtype == stored for v in experts if v.dtype != torch.float32)
