"""ssmcc's TensorRT plugins, registered with ``tensorrt.plugin`` (TensorRT >= 10.8's "quickly
deployable plugins") from the specs (``specs.py``): one plugin per ssmcc ONNX node type, plugin
id ``ssmcc::<op_type>``, as TensorRT's ONNX parser looks it up (``plugin_namespace`` /
``plugin_version`` on the node).

Per plugin:

    register   output descriptors: each output's shape as the spec's expressions over the input
               shape expressions, its dtype an input's or float32
    aot_impl   the kernel for the node: the specialisation key from the node's attributes, its
               static dims and dtypes (``kernels_aot.specialization``, the key the artifact's PTX
               was built under), the PTX for this GPU's architecture, the launch grid (the spec's
               grid over shape expressions), block = warps x 32, shared memory as compiled, and
               the int32 extras; attributes are not serialised into the engine (AOT), floats are
               constants of the binary
    autotune   the I/O dtypes as the network has them, linear formats (the binary for the
               dtypes is found by the key: the artifact holds float32 builds)

``tensorrt.plugin`` validates each function's signature: inputs annotated ``TensorDesc``, then
the attributes with their types, ``outputs`` and ``tactic``; the functions here take the spec's
names through an explicit ``__signature__``. NOT RUN: TensorRT cannot be installed where ssmcc
is developed; the rules and the key these functions evaluate are tested over ints
(``tests/test_tensorrt_plugins.py``), this glue only where ``tensorrt.plugin`` imports.
"""

from __future__ import annotations

import inspect
import os
import typing

from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError
from ssmcc.lowering.tensorrt.kernels_aot import KERNELS_FILE, launch_description
from ssmcc.lowering.tensorrt.specs import FLOAT32, SPECS, PluginSpec

_POINTER_TYPES = {"FLOAT": "*fp32", "HALF": "*fp16", "BF16": "*bf16"}
_REGISTERED: set[str] = set()
_BINARIES: dict[tuple[str, str], dict] = {}  # (specialisation key, arch) -> entry, with "text"


def load_binaries(artifact_dir: str) -> int:
    """Read the artifact's PTX for the plugins' ``aot_impl``; returns how many binaries."""
    path = os.path.join(artifact_dir, KERNELS_FILE)
    if not os.path.exists(path):
        raise ArtifactError(f"{artifact_dir}: no {KERNELS_FILE}; is it a tensorrt artifact?")
    with open(path, "rb") as f:
        manifest = loads_bounded(f.read(), path)
    for entry in manifest["kernels"]:
        with open(os.path.join(artifact_dir, entry["ptx"])) as f:
            _BINARIES[(entry["specialization"], entry["arch"])] = {**entry, "text": f.read()}
    return len(manifest["kernels"])


def _device_arch() -> str:
    import torch

    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


class _ShapeOps:
    """``cdiv`` and ``max`` over TensorRT shape expressions (the specs' ``ops``)."""

    def __init__(self, trtp):
        self.cdiv, self.max = trtp.cdiv, trtp.max


def _signature(spec: PluginSpec, desc, *, outputs=None, tactic: bool = False):
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    params = [inspect.Parameter(name, kind, annotation=desc) for name in spec.inputs]
    params += [inspect.Parameter(name, kind, annotation=t) for name, t in spec.attributes]
    if outputs is not None:
        params.append(inspect.Parameter("outputs", kind, annotation=outputs))
    if tactic:
        params.append(inspect.Parameter("tactic", kind, annotation=int))
    return params


def _register(trtp, trt, spec: PluginSpec) -> None:
    returns = typing.Tuple[(trtp.TensorDesc,) * len(spec.outputs)]  # noqa: UP006 (TensorRT reads it)
    count = len(spec.inputs)
    names = [name for name, _ in spec.attributes]

    def describe(*args, **keywords):  # attributes positional or by name
        inputs = dict(zip(spec.inputs, args[:count], strict=True))
        attributes = {**dict(zip(names, args[count:], strict=False)), **keywords}
        dims = {name: desc.shape_expr for name, desc in inputs.items()}
        made = []
        for rule, dtype in zip(spec.output_shapes, spec.output_dtypes, strict=True):
            kind = trt.float32 if dtype == FLOAT32 else inputs[dtype].dtype
            shape = tuple(rule(dims, _ShapeOps(trtp), attributes))
            made.append(trtp.from_shape_expr(shape, dtype=kind))
        return tuple(made)

    describe.__signature__ = inspect.Signature(
        _signature(spec, trtp.TensorDesc), return_annotation=returns
    )
    describe.__name__ = f"{spec.op_type}_describe"
    trtp.register(spec.plugin_id)(describe)

    def aot_impl(*args):
        descs, values = args[:count], args[count : count + len(names)]
        inputs = dict(zip(spec.inputs, descs, strict=True))
        attributes = dict(zip(names, values, strict=True))
        dims = {name: desc.shape_expr for name, desc in inputs.items()}
        static = {}
        for name, axis in spec.static_dims:
            expr = dims[name][axis]
            if not expr.is_constant:  # a property of tensorrt.plugin's ShapeExpr
                raise ArtifactError(
                    f"{spec.plugin_id}: dim {axis} of input {name!r} must be static (the "
                    "kernel is specialised on it)"
                )
            static[(name, axis)] = int(expr.constant_value())
        types = {n: _POINTER_TYPES[d.dtype.name] for n, d in inputs.items()}
        key, grid, extras = launch_description(
            spec, dims, attributes, types, static, _ShapeOps(trtp)
        )
        arch = _device_arch()
        entry = _BINARIES.get((key, arch))
        if entry is None:
            raise ArtifactError(
                f"{spec.plugin_id}: no PTX for specialisation {key} on {arch}; the artifact was "
                f"built for {sorted({a for _, a in _BINARIES})}: recompile with archs including "
                f"{arch}"
            )
        launch = trtp.KernelLaunchParams()
        launch.grid_x, launch.grid_y, launch.grid_z = grid
        launch.block_x = entry["num_warps"] * 32
        launch.shared_mem = entry["shared_bytes"]
        symbols = trtp.SymIntExprs(len(extras))
        for index, extra in enumerate(extras):
            symbols[index] = trtp.SymInt32(extra)
        return entry["entry"], entry["text"], launch, symbols

    outputs = typing.Tuple[(trtp.TensorDesc,) * len(spec.outputs)]  # noqa: UP006
    kernel_text = typing.Union[str, bytes]  # noqa: UP007 (tensorrt.plugin reads typing forms)
    aot_impl.__signature__ = inspect.Signature(
        _signature(spec, trtp.TensorDesc, outputs=outputs, tactic=True),
        return_annotation=typing.Tuple[  # noqa: UP006
            kernel_text, kernel_text, trtp.KernelLaunchParams, trtp.SymIntExprs
        ],
    )
    aot_impl.__name__ = f"{spec.op_type}_aot_impl"
    trtp.aot_impl(spec.plugin_id)(aot_impl)

    def autotune(*args):  # (*inputs, *attributes, outputs): the I/O dtypes as the network has them
        names = {trt.float32: "FP32", trt.float16: "FP16", trt.bfloat16: "BF16"}
        descs = [*args[:count], *args[-1]]
        return [trtp.AutoTuneCombination(", ".join(names[d.dtype] for d in descs), "LINEAR")]

    autotune.__signature__ = inspect.Signature(_signature(spec, trtp.TensorDesc, outputs=outputs))
    autotune.__name__ = f"{spec.op_type}_autotune"
    trtp.autotune(spec.plugin_id)(autotune)


def register_plugins(artifact_dir: str) -> list[str]:
    """Register every ssmcc plugin with ``tensorrt.plugin`` (once per process) and read the
    artifact's PTX; returns the plugin ids."""
    import tensorrt as trt
    import tensorrt.plugin as trtp

    load_binaries(artifact_dir)
    for spec in SPECS.values():
        if spec.plugin_id not in _REGISTERED:
            _REGISTERED.add(spec.plugin_id)  # trtp.register keeps it even if a later step fails
            _register(trtp, trt, spec)
    return sorted(_REGISTERED)
