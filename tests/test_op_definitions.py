"""Ops defined once (``ssmcc/ops/definition.py``) and backends registered against them
(``ssmcc/ops/backends.py``).

A test-only op — a custom op, its reference and fake, one ``define`` and one ``torch`` backend
registration, all in this file — compiles on the torch target (its registered kernel runs) and is
a row of ``ssmcc coverage``, with no other file edited; the tables (``SSMCC_OPS``,
``SSMCC_REFERENCES``, ``ssmcc.ops``' names) are built from the definitions; a reference that does
not take the schema's arguments, a registration naming an op that is not defined, a launcher not
taking the op's arguments and a second implementation are import-time errors naming the op and
the backend. The test op is removed from the tables after each test (other tests hold every
defined op to their backends).
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch import Tensor, nn

import ssmcc
import ssmcc.ops as ops
from ssmcc.lowering.registry import coverage
from ssmcc.ops.backends import REGISTRY, implements, register, takes_op_arguments
from ssmcc.ops.definition import DEFINITIONS, OpDefinitionError, define

NAME = "test_shift_scale"


def shift_scale_ref(x: Tensor, shift: float, scale: float = 2.0) -> Tensor:
    """Reference: (x + shift) * scale."""
    return (x + shift) * scale


@functools.cache
def _custom_op():
    """The custom op, made once per process (torch.library keeps it)."""

    @torch.library.custom_op(f"ssmcc::{NAME}", mutates_args=())
    def shift_scale(x: Tensor, shift: float, scale: float = 2.0) -> Tensor:
        return shift_scale_ref(x, shift, scale)

    @shift_scale.register_fake
    def _fake(x, shift, scale=2.0):
        return x.new_empty(x.shape)

    return shift_scale


@pytest.fixture
def test_op():
    """The op defined, with a torch kernel that counts its calls; removed afterwards."""
    calls = []

    def shift_scale_kernel(x, shift, scale=2.0):
        calls.append(tuple(x.shape))
        return (x + shift) * scale

    definition = define(_custom_op(), shift_scale_ref)
    implements("torch", NAME, description="test kernel: (x + shift) * scale")(shift_scale_kernel)
    try:
        yield definition, calls
    finally:
        DEFINITIONS.pop(NAME, None)
        for table in REGISTRY.values():
            table.pop(NAME, None)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        return torch.ops.ssmcc.test_shift_scale(self.proj(x), 0.5, 3.0)


def test_a_test_op_compiles_on_torch_and_is_in_coverage(test_op):
    definition, calls = test_op
    assert ops.SSMCC_OPS[NAME] is definition.overload
    assert ops.SSMCC_REFERENCES[NAME] is shift_scale_ref
    model = Model().eval()
    x = torch.randn(2, 6)
    compiled = ssmcc.compile(model, target="torch", example_inputs=(x,))
    torch.testing.assert_close(compiled(x), model(x))
    assert calls, "the registered torch kernel did not run"
    rows = {row["backend"]: row for row in coverage() if row["op"] == NAME}
    assert rows["torch"] == {
        "op": NAME,
        "backend": "torch",
        "status": "supported",
        "detail": "test kernel: (x + shift) * scale",
    }
    assert rows["onnx"]["status"] == "unsupported"


def test_the_tables_are_built_from_the_definitions():
    assert list(ops.SSMCC_OPS) == list(DEFINITIONS) == list(ops.SSMCC_REFERENCES)
    for name, definition in DEFINITIONS.items():
        assert getattr(ops, name) is definition.op
        assert getattr(ops, f"{name}_ref") is definition.reference
        assert name in ops.__all__ and f"{name}_ref" in ops.__all__
        assert getattr(torch.ops.ssmcc, name).default is ops.SSMCC_OPS[name]


def test_bad_definitions_and_registrations_fail_naming_op_and_backend():
    def wrong_ref(x, scale, shift):
        return x

    with pytest.raises(OpDefinitionError, match=rf"ssmcc.{NAME}: its reference wrong_ref takes"):
        define(_custom_op(), wrong_ref)
    assert NAME not in DEFINITIONS
    with pytest.raises(OpDefinitionError, match=r"backend 'onnx': no ssmcc op 'no_such_op'"):
        implements("onnx", "no_such_op")(lambda: None)

    def rmsnorm_gated_fwd(x, weight, z, group_size):  # arguments out of the op's order
        return x

    with pytest.raises(
        OpDefinitionError, match=r"backend 'triton', rmsnorm_gated_fwd for ssmcc.rmsnorm_gated: "
    ) as error:
        implements("triton", "rmsnorm_gated", check=takes_op_arguments)(rmsnorm_gated_fwd)
    assert "the op's arguments are (x, z, weight, group_size, eps, norm_before_gate)" in str(
        error.value
    )

    def first(*args):
        return args

    def second(*args):
        return args

    register("test-backend", "ssd_scan", first)
    register("test-backend", "ssd_scan", first)  # the same one again (a module re-imported)
    try:
        with pytest.raises(
            OpDefinitionError,
            match=r"backend 'test-backend' registers two implementations of ssmcc.ssd_scan: "
            r"first and second",
        ):
            register("test-backend", "ssd_scan", second)
    finally:
        REGISTRY.pop("test-backend")


def test_an_onnx_emitter_whose_schema_disagrees_fails_naming_the_op():
    pytest.importorskip("onnxscript")
    from ssmcc.lowering.onnx.emitters import ONNX_TABLE
    from ssmcc.lowering.onnx.registration import onnx_emitter

    assert set(ONNX_TABLE) == set(ops.SSMCC_OPS)  # every op, each registered beside its emitter

    def emit_rmsnorm_gated(x, z, weight, group_size, eps=1e-6, norm_before_gate=False):
        return x

    with pytest.raises(
        OpDefinitionError,
        match=r"backend 'onnx', emit_rmsnorm_gated for ssmcc.rmsnorm_gated: the schema of "
        r"ssmcc.SsdScan has no input or attribute for weight, group_size, eps, norm_before_gate",
    ):
        onnx_emitter("rmsnorm_gated", "wrong node", node="SsdScan")(emit_rmsnorm_gated)
    with pytest.raises(OpDefinitionError, match=r"emits ssmcc.RmsNorm, which has no schema"):
        onnx_emitter("rmsnorm_gated", "unknown node", node="RmsNorm")(emit_rmsnorm_gated)
    with pytest.raises(OpDefinitionError, match=r"backend 'onnx': no ssmcc op 'rms_norm'"):
        onnx_emitter("rms_norm", "no such op")(emit_rmsnorm_gated)
    assert ONNX_TABLE["rmsnorm_gated"].emit.__module__ == "ssmcc.lowering.onnx.emitters"


@pytest.mark.parametrize("op", ["mamba_mixer", "ssd_mixer_step"])
def test_a_field_added_to_a_mixers_arguments_fails_every_binding_naming_it(op):
    """A test-only field added to the mixer's argument dataclass: the op's schema no longer
    matches it (defining it so fails naming the op), and every backend's binding — the Triton
    launcher, the ONNX emitter, both C++ bindings — fails its check, each named."""
    import dataclasses

    pytest.importorskip("triton")
    pytest.importorskip("onnxscript")
    import ssmcc.kernels.cpu.torch_binding  # noqa: F401 (the C++ bindings register)
    import ssmcc.kernels.triton.registry  # noqa: F401 (the launchers register)
    import ssmcc.lowering.onnx.emitters  # noqa: F401 (the emitters register)
    from ssmcc.ops.backends import recheck

    definition = DEFINITIONS[op]
    assert recheck(definition) == []  # as defined, every binding fits
    extended = dataclasses.make_dataclass(
        "Extended",
        [("extra_gate", float, dataclasses.field(default=0.0))],
        bases=(definition.arguments_class,),
    )
    with pytest.raises(OpDefinitionError, match=rf"ssmcc.{op}: its arguments dataclass Extended"):
        define(definition.op, definition.reference, extended)
    assert DEFINITIONS[op] is definition
    problems = recheck(dataclasses.replace(definition, arguments_class=extended))
    backends = sorted(line.split("'")[1] for line in problems)
    assert backends == ["cpp", "cpp-verified", "onnx", "triton"], problems
    for line in problems:  # each names its binding (module.function) and the missing field
        binding = line.split(": ")[0].split(", ")[1]
        assert binding.startswith(("ssmcc.kernels.", "ssmcc.lowering.")) and op in binding, line
        assert "extra_gate" in line, line


def test_tensorrt_plugins_are_registrations_checked_against_their_nodes():
    """Each TensorRT plugin spec is registered against its op where it is declared; one whose
    tensors or attributes disagree with its ONNX node's schema, one for an op that does not
    exist, and a second plugin for an op that is not a step of one chain fail, naming them."""
    import dataclasses

    from ssmcc.lowering.tensorrt.specs import OP_PLUGINS, SPECS, plugin
    from ssmcc.ops.backends import description

    assert OP_PLUGINS["rmsnorm_gated"] == ("RmsNormGated",)
    assert OP_PLUGINS["ssd_scan"] == (
        "SsdChunkCumsum",
        "SsdChunkState",
        "SsdStatePassing",
        "SsdBmm",
        "SsdChunkScan",
    )
    assert description("tensorrt", "selective_scan") == " -> ".join(OP_PLUGINS["selective_scan"])
    norm = SPECS["RmsNormGated"]
    swapped = dataclasses.replace(norm, inputs=("x", "weight", "z"))
    with pytest.raises(
        OpDefinitionError,
        match=r"backend 'tensorrt', plugin RmsNormGated for ssmcc.rmsnorm_gated: its inputs are "
        r"\(x, weight, z\), the node's \(x, z, weight\)",
    ):
        plugin(swapped)
    unknown_attribute = dataclasses.replace(norm, attributes=(*norm.attributes, ("scale", float)))
    with pytest.raises(OpDefinitionError, match=r"the node has no attribute scale"):
        plugin(unknown_attribute)
    with pytest.raises(OpDefinitionError, match=r"backend 'tensorrt': no ssmcc op 'rms_norm'"):
        plugin(dataclasses.replace(norm, op="rms_norm"))
    with pytest.raises(OpDefinitionError, match=r"binds ssmcc.RmsNorm, which has no schema"):
        plugin(dataclasses.replace(norm, op_type="RmsNorm"))
    with pytest.raises(OpDefinitionError, match=r"two plugins for ssmcc.rmsnorm_gated"):
        plugin(
            dataclasses.replace(
                norm,
                op_type="SsdStateUpdate",
                inputs=SPECS["SsdStateUpdate"].inputs,
                outputs=SPECS["SsdStateUpdate"].outputs,
                attributes=(),
            )
        )
    assert OP_PLUGINS["rmsnorm_gated"] == ("RmsNormGated",)  # nothing half-registered
