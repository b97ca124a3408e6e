"""A plugin's kernel launched as TensorRT's AOT plugin launches it, on concrete tensors: the
spec's size rules evaluated over ints, outputs allocated from its shape rules, then one launch
with the node's inputs, the int32 extras and the outputs, in that order. On CPU tensors the kernel
runs in Triton's interpreter; on CUDA tensors it is compiled. This is how the plugins are tested
where TensorRT cannot run (``tests/test_tensorrt_plugins.py``)."""

from __future__ import annotations

import torch

from ssmcc.lowering.tensorrt.specs import FLOAT32, INT_OPS, PluginSpec, static_dims


def concrete_dims(spec: PluginSpec, inputs: dict[str, torch.Tensor]) -> dict[str, tuple]:
    return {name: tuple(inputs[name].shape) for name in spec.inputs}


def output_shapes(spec: PluginSpec, dims: dict, attributes: dict) -> list[tuple[int, ...]]:
    return [tuple(int(x) for x in rule(dims, INT_OPS, attributes)) for rule in spec.output_shapes]


def pointer_types(spec: PluginSpec, inputs: dict[str, torch.Tensor]) -> dict[str, str]:
    from ssmcc.kernels.triton.aot import POINTER_TYPES

    return {name: POINTER_TYPES[inputs[name].dtype] for name in spec.inputs}


def launch_plugin(
    spec: PluginSpec, inputs: dict[str, torch.Tensor], attributes: dict[str, int]
) -> list[torch.Tensor]:
    """The node's outputs, computed by its plugin kernel. ``inputs``: every input of the node,
    contiguous; ``attributes``: the node's int attributes."""
    from ssmcc.kernels.triton import plugin_kernels
    from ssmcc.kernels.triton.runtime import launch

    dims = concrete_dims(spec, inputs)
    constexprs = spec.constexprs(attributes, static_dims(spec, dims), pointer_types(spec, inputs))
    meta = dict(constexprs)
    device = next(iter(inputs.values())).device
    if device.type == "cpu" and meta.get("DOT") == "bf16":  # the interpreter's bf16 tl.dot
        meta["WIDEN"] = True  # (operands.py): rounded operands kept in float32
    outputs = [
        torch.empty(
            shape,
            dtype=torch.float32 if dtype == FLOAT32 else inputs[dtype].dtype,
            device=device,
        )
        for shape, dtype in zip(
            output_shapes(spec, dims, attributes), spec.output_dtypes, strict=True
        )
    ]
    grid = tuple(int(g) for g in spec.grid(dims, INT_OPS, constexprs))
    if 0 in grid:
        return outputs
    extras = [int(rule(dims)) for _, rule in spec.extras]
    tensors = [inputs[name].contiguous() for name in spec.inputs]
    launch(getattr(plugin_kernels, spec.kernel), grid)(*tensors, *extras, *outputs, **meta)
    return outputs
