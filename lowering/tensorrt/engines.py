"""TensorRT engines for a tensorrt artifact: the build (``ssmcc trt-build DIR``) and the runner
behind ``CompiledModel`` where TensorRT is.

Build, per graph (prefill, chunk, step): register the plugins (``plugins.register_plugins``),
parse the graph with TensorRT's ONNX parser (it binds each ssmcc node to its plugin), one
optimisation profile from the manifest's min / opt / max shapes, a strongly typed network (TRT
11 requires it), and the serialized engine written to ``<graph>.engine`` beside the graph (a
temporary name first, renamed when whole). ``check`` then runs the prefill engine and compares
its logits with the torch target's on the same ids.

Run: inputs and outputs are CUDA tensors bound by name (``set_tensor_address``), shapes set per
call, one ``execute_async_v3`` on the current stream; logits come back to the CPU, states stay
on the GPU.

NOT RUN: TensorRT cannot be installed where ssmcc is developed (see docs/targets/tensorrt.md).
This module follows TensorRT 10's documented Python API (``Builder``, ``OnnxParser``,
``IBuilderConfig``, ``Runtime.deserialize_cuda_engine``, ``IExecutionContext``).
"""

from __future__ import annotations

import os

from ssmcc.errors import ArtifactError, LoweringError
from ssmcc.lowering.tensorrt.plugins import register_plugins

GRAPHS = ("prefill", "chunk", "step")


def engine_path(folder: str, graph: str) -> str:
    return os.path.join(folder, f"{graph}.engine")


def build_engine(folder: str, graph: str, profile: dict, progress=print) -> str:
    """Build ``<graph>.engine`` in ``folder`` from ``<graph>.onnx``; returns its path."""
    import tensorrt as trt

    register_plugins(folder)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    source = os.path.join(folder, f"{graph}.onnx")
    if not parser.parse_from_file(source):
        errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
        raise LoweringError(f"TensorRT could not parse {source}:\n" + "\n".join(errors[:8]))
    config = builder.create_builder_config()
    shapes = builder.create_optimization_profile()
    for name, ranges in profile.items():
        shapes.set_shape(name, ranges["min"], ranges["opt"], ranges["max"])
    config.add_optimization_profile(shapes)
    progress(f"[ssmcc] building the {graph} engine (TensorRT {trt.__version__})")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise LoweringError(f"TensorRT failed to build the {graph} engine (see its log above)")
    path = engine_path(folder, graph)
    partial = path + ".partial"
    with open(partial, "wb") as f:
        f.write(serialized)
    os.replace(partial, path)
    return path


def build_engines(folder: str, manifest: dict, progress=print) -> list[str]:
    return [
        build_engine(folder, graph, manifest["profiles"][graph], progress)
        for graph in GRAPHS
        if graph in manifest["graphs"]
    ]


class EngineRunner:
    """The artifact's engines, built on first use where missing, run by graph name."""

    def __init__(self, folder: str, graphs: dict, profiles: dict):
        import tensorrt as trt

        register_plugins(folder)
        self.folder, self.graphs = folder, graphs
        self._runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self._profiles = profiles
        self._contexts: dict = {}
        self._stream = None

    def _context(self, graph: str):
        if graph not in self._contexts:
            path = engine_path(self.folder, graph)
            if not os.path.exists(path):
                build_engine(self.folder, graph, self._profiles[graph])
            with open(path, "rb") as f:
                engine = self._runtime.deserialize_cuda_engine(f.read())
            if engine is None:
                raise ArtifactError(f"{path}: TensorRT could not load this engine")
            self._contexts[graph] = (engine, engine.create_execution_context())
        return self._contexts[graph]

    def run(self, graph: str, *inputs):
        import torch

        engine, context = self._context(graph)
        entry = self.graphs[graph]
        bound = []  # the inputs on the GPU, alive until the run ends
        for value, tensor in zip(entry["inputs"], inputs, strict=True):
            dtype = torch.int64 if value["dtype"] == "int64" else torch.float32
            bound.append(tensor.to("cuda", dtype).contiguous())
            if not context.set_input_shape(value["name"], tuple(bound[-1].shape)):
                raise ArtifactError(
                    f"{graph}: input {value['name']!r} of shape {tuple(bound[-1].shape)} is "
                    f"outside the engine's profile {self._profiles[graph][value['name']]}; "
                    "recompile with larger max_batch / max_length"
                )
            context.set_tensor_address(value["name"], bound[-1].data_ptr())
        outputs = []
        for value in entry["outputs"]:
            shape = tuple(context.get_tensor_shape(value["name"]))
            out = torch.empty(shape, dtype=torch.float32, device="cuda")
            context.set_tensor_address(value["name"], out.data_ptr())
            outputs.append(out)
        if self._stream is None:  # not the legacy default stream, which TensorRT syncs on
            self._stream = torch.cuda.Stream()
        stream = self._stream
        if not context.execute_async_v3(stream.cuda_stream):
            raise ArtifactError(f"TensorRT failed to run the {graph} engine")
        stream.synchronize()
        del bound
        outputs[0] = outputs[0].cpu()
        return outputs
