"""The TensorRT target's plugins where TensorRT cannot run: their size rules against the ops' fake
implementations over many shapes, and their kernels — launched as TensorRT's AOT plugin launches
them (inputs, int32 extras, outputs; grid and constants from the same rules) — against the ops'
references in Triton's interpreter."""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

pytest.importorskip("triton")

from ssmcc.errors import LoweringError  # noqa: E402
from ssmcc.lowering.tensorrt.plugin_launch import launch_plugin, output_shapes  # noqa: E402
from ssmcc.lowering.tensorrt.specs import FLOAT32, INT_OPS, SPECS  # noqa: E402
from ssmcc.ops import SSMCC_OPS  # noqa: E402
from ssmcc.ops.activations import FORMS  # noqa: E402

CONVS = ("CausalConv1d", "CausalConv1dUpdate")
# one plugin per ONNX node (the scans' chains of plugins: tests/test_tensorrt_scan_chain.py,
# tests/test_tensorrt_ssd_chain.py)
NODE_PLUGINS = sorted(op_type for op_type, spec in SPECS.items() if not spec.part_of)


def node_inputs(op_type: str, sizes: dict, make) -> dict:
    """The node's inputs (layouts of ``lowering/onnx/schemas.py``) of the given sizes, each
    from ``make(shape)``."""
    b, d, n, g, k = sizes["b"], sizes["d"], sizes["n"], sizes["g"], sizes["k"]
    length, h, p = sizes["l"], sizes["h"], sizes["p"]
    shapes = {
        "SelectiveScan": dict(
            u=(b, d, length),
            delta=(b, d, length),
            A=(d, n),
            B=(b, g, n, length),
            C=(b, g, n, length),
            D=(d,),
            z=(b, d, length),
            delta_bias=(d,),
            initial_state=(b, d, n),
        ),
        "CausalConv1d": dict(
            x=(b, d, length), weight=(d, k), bias=(d,), initial_state=(b, d, k - 1)
        ),
        "SelectiveStateUpdate": dict(
            state=(b, d, n),
            x=(b, d),
            dt=(b, d),
            A=(d, n),
            B=(b, g, n),
            C=(b, g, n),
            D=(d,),
            z=(b, d),
            dt_bias=(d,),
        ),
        "CausalConv1dUpdate": dict(x=(b, d), conv_state=(b, d, k - 1), weight=(d, k), bias=(d,)),
        "SsdScan": dict(
            x=(b, length, h, p),
            dt=(b, length, h),
            A=(h,),
            B=(b, length, g, n),
            C=(b, length, g, n),
            D=(h, p),
            z=(b, length, h, p),
            dt_bias=(h,),
            initial_state=(b, h, p, n),
        ),
        "SsdStateUpdate": dict(
            state=(b, h, p, n),
            x=(b, h, p),
            dt=(b, h),
            A=(h,),
            B=(b, g, n),
            C=(b, g, n),
            D=(h, p),
            z=(b, h, p),
            dt_bias=(h,),
        ),
        # prefill's (b, l, d), or a step's (b, d) when l is odd
        "RmsNormGated": dict(
            x=(b, length, d) if length % 2 == 0 else (b, d),
            z=(b, length, d) if length % 2 == 0 else (b, d),
            weight=(d,),
        ),
    }[op_type]
    return {name: make(shape, name) for name, shape in shapes.items()}


def call_op(op_type: str, t: dict, attributes: dict):
    """The ssmcc op the node computes, on the node's inputs (every optional input given; z
    dropped where ``has_z`` is 0), its flags after them (a scan's initial state last)."""
    spec = SPECS[op_type]
    op = SSMCC_OPS[spec.op]
    args = [t[name] for name in spec.inputs]
    if "has_z" in attributes and not attributes["has_z"]:
        args[spec.inputs.index("z")] = None
    if op_type in CONVS:  # the attribute is the activation's code; its form is a name the op takes
        return op(*args, FORMS[attributes["activation"]])
    if op_type == "RmsNormGated":
        group, eps = attributes["group_size"], attributes["eps"]
        return (op(*args, group, eps, bool(attributes["norm_before_gate"])),)
    flags = [bool(attributes.get("delta_softplus", attributes.get("dt_softplus")))]
    if op_type.startswith("Ssd"):
        dt_max = attributes["dt_max"]
        flags += [attributes["dt_min"], None if math.isinf(dt_max) else dt_max]
    if op_type in ("SelectiveScan", "SsdScan"):
        return op(*args[:-1], *flags, args[-1])
    return op(*args, *flags)


def random_sizes(rng: random.Random) -> dict:
    g = rng.choice([1, 1, 2, 4])
    return dict(
        b=rng.randint(1, 9),
        d=g * rng.randint(1, 40),
        n=rng.randint(1, 24),
        g=g,
        k=rng.randint(2, 5),
        l=rng.choice([0, 1, 2, rng.randint(3, 700)]),
        h=g * rng.randint(1, 4),
        p=rng.randint(1, 40),
    )


def attributes_for(
    op_type: str, sizes: dict, flag: int, eps: float = 1e-5, dt_max: float = math.inf
) -> dict:
    """Every attribute of the node: the flags at ``flag``, the norm's group of d / g, dt
    clamped to [0.001, dt_max] when ``flag`` is set."""
    values = {"group_size": sizes["d"] // sizes["g"], "eps": eps, "dt_max": dt_max}
    values["dt_min"] = 0.001 if flag else 0.0
    return {name: values.get(name, flag) for name, _ in SPECS[op_type].attributes}


def random_attributes(op_type: str, sizes: dict, rng: random.Random) -> dict:
    floats = ("group_size", "eps", "dt_min", "dt_max")
    flags = {name: rng.randint(0, 1) for name, _ in SPECS[op_type].attributes}
    eps, dt_max = rng.choice([1e-5, 1e-6, 0.1]), rng.choice([math.inf, 0.1, 5.0])
    values = attributes_for(op_type, sizes, rng.randint(0, 1), eps, dt_max)
    if op_type in CONVS:
        flags["activation"] = rng.randrange(len(FORMS))
    return values | {k: v for k, v in flags.items() if k not in floats}


@pytest.mark.parametrize("op_type", NODE_PLUGINS)
def test_descriptor_rules_equal_the_fake_impls_on_random_shapes(op_type):
    """Each output's shape rule over int dims, and its dtype rule, equal what the op's fake
    implementation returns for 200 random shapes."""
    spec = SPECS[op_type]
    rng = random.Random(f"trt-{op_type}")
    for _ in range(200):
        sizes = random_sizes(rng)
        attributes = random_attributes(op_type, sizes, rng)
        with FakeTensorMode():
            inputs = node_inputs(op_type, sizes, lambda shape, _: torch.empty(shape))
            fake = call_op(op_type, inputs, attributes)
        dims = {name: tuple(t.shape) for name, t in inputs.items()}
        expected = [tuple(t.shape) for t in fake]
        assert output_shapes(spec, dims, attributes) == expected, (op_type, sizes, attributes)
        for rule, out in zip(spec.output_dtypes, fake, strict=True):
            assert (torch.float32 if rule == FLOAT32 else inputs[rule].dtype) == out.dtype


@pytest.mark.parametrize("op_type", NODE_PLUGINS)
def test_grid_covers_every_output_element_once(op_type):
    """The grid's program count along the channel dim covers ``dim`` with the kernel's block
    (the norm: one program per row and group)."""
    spec = SPECS[op_type]
    rng = random.Random(f"grid-{op_type}")
    for _ in range(200):
        sizes = random_sizes(rng)
        dims = {
            name: shape
            for name, shape in node_inputs(op_type, sizes, lambda shape, _: shape).items()
        }
        attributes = random_attributes(op_type, sizes, rng)
        static = {key: dims[key[0]][key[1]] for key in spec.static_dims}
        constexprs = spec.constexprs(attributes, static, dict.fromkeys(spec.inputs, "*fp32"))
        grid = spec.grid(dims, INT_OPS, constexprs)
        if op_type == "RmsNormGated":  # no rows at length 0 (TensorRT's profiles start at 1)
            assert grid == (math.prod(dims["x"][:-1]), sizes["g"], 1)
            continue
        assert all(g >= 1 for g in grid)
        assert grid[0] == sizes["b"]
        if op_type == "SsdStateUpdate":  # (batch, heads, head-dim row blocks)
            block = constexprs.get("BLOCK_P", constexprs.get("BLOCK_R"))
            assert grid[1] == sizes["h"]
            assert (grid[2] - 1) * block < sizes["p"] <= grid[2] * block
            continue
        block = constexprs.get("BLOCK_D", constexprs.get("BLOCK_R"))
        channel_axis = 2 if op_type == "SelectiveStateUpdate" else 1
        assert (grid[channel_axis] - 1) * block < sizes["d"] <= grid[channel_axis] * block


CASES = [  # sizes, flags (and dt clamped to [0.001, 0.5] when set)
    (dict(b=2, d=6, n=4, g=2, k=4, l=5, h=4, p=3), 1),
    (dict(b=1, d=5, n=3, g=1, k=2, l=1, h=1, p=5), 0),
    (dict(b=3, d=8, n=5, g=4, k=3, l=0, h=4, p=2), 1),
    (dict(b=2, d=70, n=16, g=1, k=4, l=9, h=3, p=20), 0),
]


@pytest.mark.parametrize("op_type", NODE_PLUGINS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_plugin_kernel_equals_the_reference(op_type, case):
    """The kernel, given what TensorRT gives it, computes the node's outputs (float32, 1e-5; the
    scans' chains of plugins: tests/test_tensorrt_scan_chain.py, test_tensorrt_ssd_chain.py)."""
    sizes, flag = CASES[case]
    generator = torch.Generator().manual_seed(case)

    def make(shape, name):
        if name == "A":
            return -torch.rand(shape, generator=generator) - 0.1
        if name == "dt" and op_type.startswith("Ssd"):  # around softplus's bend and the clamps
            return torch.randn(shape, generator=generator) - 1.0
        return torch.randn(shape, generator=generator)

    inputs = node_inputs(op_type, sizes, make)
    attributes = attributes_for(op_type, sizes, flag, dt_max=0.5 if flag else math.inf)
    got = launch_plugin(SPECS[op_type], inputs, attributes)
    expected = call_op(op_type, inputs, attributes)
    for g, e in zip(got, expected, strict=True):
        assert g.shape == e.shape and g.dtype == e.dtype
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op_type", CONVS)
@pytest.mark.parametrize("code", range(len(FORMS)))
def test_conv_plugin_kernel_applies_each_activation(op_type, code):
    """The conv plugins with each activation code (a constant of the specialisation) against the
    op with that activation (float32, 1e-5); inputs spread over [-4, 4] so every form's curve
    (erf and tanh's bends, relu's kink) is crossed."""
    sizes = dict(b=2, d=70, n=1, g=1, k=4, l=9, h=1, p=1)
    generator = torch.Generator().manual_seed(code)
    inputs = node_inputs(
        op_type, sizes, lambda shape, _: 2 * torch.randn(shape, generator=generator)
    )
    attributes = {"activation": code}
    made = SPECS[op_type].constexprs(attributes, {("weight", 1): sizes["k"]}, {})
    assert made["ACTIVATION"] == code
    got = launch_plugin(SPECS[op_type], inputs, attributes)
    expected = call_op(op_type, inputs, attributes)
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("op_type", CONVS)
def test_conv_plugin_refuses_an_unknown_activation_code(op_type):
    with pytest.raises(LoweringError, match="activation attribute is 6; the codes are 0-5"):
        SPECS[op_type].constexprs({"activation": 6}, {("weight", 1): 4}, {})


def test_every_activation_of_the_conv_plugin_compiles_to_its_own_ptx(tmp_path):
    """The conv plugin's specialisation for each activation code builds (Triton compiled, no GPU
    needed) into PTX of its own: the constant selects the form's code, erf and tanh included."""
    from ssmcc.kernels.triton import aot
    from ssmcc.lowering.tensorrt.kernels_aot import specialization

    pointers = {name: "*fp32" for name in SPECS["CausalConv1d"].inputs}
    made = [
        specialization("CausalConv1d", {"activation": code}, {("weight", 1): 4}, pointers)
        for code in range(len(FORMS))
    ]
    manifest = aot.build(made, ("sm_90",), str(tmp_path / "out"))
    texts = [(tmp_path / "out" / entry["ptx"]).read_text() for entry in manifest["kernels"]]
    assert len(texts) == len(FORMS) and len(set(texts)) == len(FORMS)
