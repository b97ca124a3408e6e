"""The PTX a TensorRT artifact ships: one specialisation of a plugin kernel per distinct
(plugin, attributes, static dims, dtypes) among the graphs' plugin nodes, built for each
architecture by ``kernels/triton/aot.py``.

The constants are fixed by the node (its attributes, and static dims such as the state size and
the conv width, read from the graph after ONNX shape inference); sizes that vary at run time
(batch, length, channels) are the kernel's int32 extras. The plugin's ``aot_impl`` picks the
binary by the same key (``specialization_key``)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import onnx

from ssmcc.errors import LoweringError
from ssmcc.kernels.triton import aot
from ssmcc.lowering.tensorrt.graphs import node_attributes, plugin_nodes
from ssmcc.lowering.tensorrt.specs import FLOAT32, SPECS, static_dims

_POINTERS = {
    onnx.TensorProto.FLOAT: "*fp32",
    onnx.TensorProto.FLOAT16: "*fp16",
    onnx.TensorProto.BFLOAT16: "*bf16",
}


def _value_shapes(model: onnx.ModelProto) -> dict[str, tuple[list, int]]:
    """(dims, element type) of every value of the graph that shape inference can tell."""
    inferred = onnx.shape_inference.infer_shapes(model)
    found = {}
    for value in (*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output):
        tensor = value.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else d.dim_param for d in tensor.shape.dim]
        found[value.name] = (dims, tensor.elem_type)
    for init in model.graph.initializer:
        found[init.name] = (list(init.dims), init.data_type)
    return found


def specialization(op_type: str, attributes: dict, static: dict, input_types: dict):
    """The ``aot.Specialization`` of a plugin kernel for one node's constants and dtypes."""
    from ssmcc.kernels.triton import plugin_kernels

    spec = SPECS[op_type]
    constexprs = spec.constexprs(attributes, static, input_types)
    num_warps = constexprs.pop("num_warps")
    num_stages = constexprs.pop("num_stages", None)
    kinds = {name: input_types[name] for name in spec.inputs}
    kinds.update({name: "i32" for name, _ in spec.extras})
    for name, dtype in zip(spec.outputs, spec.output_dtypes, strict=True):
        kinds[name] = "*fp32" if dtype == FLOAT32 else input_types[dtype]
    order = [*spec.inputs, *(n for n, _ in spec.extras), *spec.outputs]
    kernel = getattr(plugin_kernels, spec.kernel)
    signature = [(arg, kinds[name]) for arg, name in zip(kernel.arg_names, order, strict=False)]
    signature += [(name, "constexpr") for name in constexprs]
    if [a for a, _ in signature] != list(kernel.arg_names):
        raise LoweringError(f"{spec.kernel}: its parameters do not follow the plugin spec")
    return aot.Specialization(
        kernel=spec.kernel,
        source="plugin_kernels.py",
        signature=tuple(signature),
        constexprs=tuple(constexprs.items()),
        num_warps=num_warps,
        grid=(),
        num_stages=num_stages,
    )


def graph_specializations(models: dict[str, onnx.ModelProto]) -> dict[str, aot.Specialization]:
    """Every distinct specialisation the graphs' plugin nodes need, by key."""
    found = {}
    for graph, model in models.items():
        shapes = _value_shapes(model)
        for node in plugin_nodes(model):
            spec = SPECS[node.op_type]
            inputs = dict(zip(spec.inputs, node.input, strict=True))
            try:
                dims = {name: shapes[value][0] for name, value in inputs.items()}
                types = {name: _POINTERS[shapes[value][1]] for name, value in inputs.items()}
                static = static_dims(spec, dims)
            except (KeyError, ValueError, TypeError) as error:
                raise LoweringError(
                    f"target 'tensorrt': node {node.name!r} of the {graph} graph: the plugin "
                    f"needs static {spec.static_dims} and float inputs; shape inference gave "
                    f"{ {n: shapes.get(v) for n, v in inputs.items()} } ({error})"
                ) from error
            made = specialization(node.op_type, node_attributes(node), static, types)
            found.setdefault(made.key, made)
    return found


KERNELS_FILE = "plugin_kernels.json"


def launch_description(spec, dims: dict, attributes: dict, input_types: dict, static: dict, ops):
    """(specialisation key, grid, extras) of one plugin launch: what the plugin's ``aot_impl``
    returns to TensorRT, over TensorRT's shape expressions (``ops``: ``tensorrt.plugin``'s cdiv
    and max) or, in the tests, over ints."""
    made = specialization(spec.op_type, attributes, static, input_types)
    constexprs = dict(made.constexprs)
    grid = tuple(spec.grid(dims, ops, constexprs))
    extras = [rule(dims) for _, rule in spec.extras]
    return made.key, grid, extras


def build_plugin_kernels(models: dict[str, onnx.ModelProto], folder: str, archs) -> dict:
    """Build the PTX the graphs' plugin nodes need into ``folder`` (flat: ``<kernel>-<key>.<arch>
    .ptx``) with ``plugin_kernels.json`` (``aot``'s manifest, PTX only: TensorRT's AOT plugins
    take PTX); returns that manifest."""
    specs = graph_specializations(models)
    staging = tempfile.mkdtemp(prefix=".ssmcc-plugin-kernels-", dir=folder)
    try:
        manifest = aot.build(list(specs.values()), archs, os.path.join(staging, "out"))
        for entry in manifest["kernels"]:
            built = os.path.join(staging, "out", entry["ptx"])
            shutil.move(built, os.path.join(folder, entry["ptx"]))
            del entry["cubin"]
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    with open(os.path.join(folder, KERNELS_FILE), "w") as f:
        json.dump(manifest, f, indent=1, allow_nan=False)
    return manifest
