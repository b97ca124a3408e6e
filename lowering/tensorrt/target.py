"""The tensorrt target: lower, save and load (see ``lowering/registry.py`` for the contract).

Its form of a ``ProgramSet`` is a TensorRT-ready artifact, data only:

    prefill.onnx, chunk.onnx, step.onnx   the ONNX lowering's portable graphs (``write_graphs``)
                                          with every ssmcc node bound to its plugin
                                          (``graphs.bind_plugins``)
    weights.bin                           their weights, stored once
    <kernel>-<key>.<arch>.ptx             each plugin kernel the graphs need, per architecture
    plugin_kernels.json                   entry points, parameters, constants, warps, shared
                                          memory and grids of those binaries

and, in the manifest: the plugins (namespace, version), the optimisation profiles (min / opt /
max of every input, from the dynamic dims and the options) and the engine-build command. The
plugins themselves (``plugins.py``) and the builder (``engines.py``, ``ssmcc trt-build``) are code
of the installed package.

Loading checks what the manifest says against the files (``plugin_kernels.json`` names only listed
PTX, every graph's states and logits agree with the manifest) from the artifact's verified copy in
memory (``ssmcc.artifact_files``). Running needs TensorRT and a CUDA GPU: where ``tensorrt``
imports, the first run writes that verified copy into a private folder, builds the engines there
and runs them (``engines.EngineRunner``): never from the artifact's directory, whose unlisted
files (an ``.engine`` that ``ssmcc trt-build`` left there) nothing has verified. Elsewhere it
fails with one message saying what is missing and how to build the engines on a machine that has
it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import onnx

from ssmcc.artifact_files import FolderFiles
from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError, LoweringError, OptionError
from ssmcc.lowering.onnx import target as onnx_target
from ssmcc.lowering.tensorrt.graphs import bind_plugins
from ssmcc.lowering.tensorrt.kernels_aot import KERNELS_FILE, build_plugin_kernels
from ssmcc.lowering.tensorrt.specs import NAMESPACE, OP_PLUGINS, PLUGIN_VERSION
from ssmcc.ops import SSMCC_OPS
from ssmcc.ops.contracts import StateSpec
from ssmcc.passes.program_set import ProgramSet
from ssmcc.progress import phase

INSTALL_HINT = (
    "pip install tensorrt (TensorRT >= 10.8 with its Python plugin API, tensorrt.plugin) on a "
    "machine with an NVIDIA GPU"
)


def tensorrt_missing() -> str | None:
    """Why TensorRT cannot run here, or None."""
    try:
        import tensorrt  # noqa: F401
        import tensorrt.plugin  # noqa: F401
    except Exception as error:  # an ImportError, or a library that fails to load (OSError)
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"`import tensorrt.plugin` fails here ({first})"
    import torch

    if not torch.cuda.is_available():
        return "this machine has no CUDA GPU (torch.cuda.is_available() is False)"
    return None


def _parse_archs(text: str) -> tuple[str, ...]:
    from ssmcc.kernels.triton.aot import ARCHS

    archs = tuple(a.strip() for a in text.split(",") if a.strip())
    unknown = [a for a in archs if a not in ARCHS]
    if not archs or unknown:
        raise OptionError(
            f"archs={text!r}: unknown architecture(s) {unknown}; known: {', '.join(ARCHS)}"
        )
    return archs


def _dim_range(dim, options, chunk_size: int) -> tuple[int, int, int]:
    if isinstance(dim, int):
        return dim, dim, dim
    if dim == "batch":
        return 1, 1, options["max_batch"]
    longest = options["max_length"]
    if dim == "past":  # a K/V cache's positions: none before the first chunk
        return 0, min(chunk_size, longest), longest
    return 1, min(chunk_size, longest), longest  # seq


def profiles(graphs: dict, options, chunk_size: int) -> dict:
    """Per graph, per input: the min / opt / max shapes of its one optimisation profile."""
    found = {}
    for name, entry in graphs.items():
        found[name] = {}
        for value in entry["inputs"]:
            ranges = [_dim_range(d, options, chunk_size) for d in value["dims"]]
            found[name][value["name"]] = {
                which: [r[i] for r in ranges] for i, which in enumerate(("min", "opt", "max"))
            }
    return found


def trtexec_line(folder: str, graph: str, profile: dict) -> str:
    """The ``trtexec`` command with the same shapes (for reference: trtexec loads plugin
    libraries, not plugins defined in Python, so ``ssmcc trt-build`` is the builder)."""

    def shapes(which):
        return ",".join(f"{n}:{'x'.join(map(str, p[which]))}" for n, p in profile.items())

    return (
        f"trtexec --onnx={os.path.join(folder, graph + '.onnx')} --stronglyTyped "
        f"--minShapes={shapes('min')} --optShapes={shapes('opt')} --maxShapes={shapes('max')} "
        f"--saveEngine={os.path.join(folder, graph + '.engine')}"
    )


class TensorRTExecutable:
    """The model's files (``ssmcc.artifact_files``); engines built and run where TensorRT is."""

    def __init__(self, files, graphs: dict, specs, kernels: dict, shape_profiles: dict):
        self.model_files = files
        self.folder = files.folder
        self.graph_entries = graphs
        self.specs = specs
        self.kernels = kernels  # plugin_kernels.json
        self.profiles = shape_profiles  # graph -> input -> min / opt / max
        self._runner = None

    @property
    def graphs(self) -> tuple[str, ...]:
        return tuple(self.graph_entries)

    def run(self, graph: str, *inputs):
        if self._runner is None:
            missing = tensorrt_missing()
            if missing is not None:
                build = "on a machine with TensorRT and a GPU run `ssmcc trt-build"
                if isinstance(self.model_files, FolderFiles):  # compiled, not saved yet
                    save = "save it (CompiledModel.save / ssmcc compile --out DIR), then"
                    build = f"{save} {build} DIR`"
                else:
                    build = f"{build} {self.folder}`"
                raise OptionError(
                    f"target 'tensorrt' runs on TensorRT, and {missing}. The artifact is "
                    f"complete: {build} to build and check the engines ({INSTALL_HINT}); here, "
                    "use target 'onnx' or 'torch'"
                )
            from ssmcc.lowering.tensorrt.engines import EngineRunner

            self._runner = EngineRunner(self._private_folder(), self.graph_entries, self.profiles)
        return self._runner.run(graph, *inputs)

    def _private_folder(self) -> str:
        """A folder only this process wrote that holds the model's files: the compile's own, or
        for a loaded artifact its verified copy written out (removed with the executable)."""
        if isinstance(self.model_files, FolderFiles):
            return self.folder
        folder = tempfile.mkdtemp(prefix="ssmcc-tensorrt-")
        weakref.finalize(self, shutil.rmtree, folder, True)
        for name in self.files:
            self.model_files.copy_to(name, os.path.join(folder, name))
        return folder

    @property
    def files(self) -> list[str]:
        names = [entry["file"] for entry in self.graph_entries.values()]
        names += [onnx_target.WEIGHTS_FILE, KERNELS_FILE]
        return names + sorted({entry["ptx"] for entry in self.kernels["kernels"]})

    def file_paths(self) -> dict[str, str]:
        return {name: os.path.join(self.folder, name) for name in self.files}


def lower(programs: ProgramSet, options) -> TensorRTExecutable:
    if not programs.streaming:
        raise LoweringError(
            f"target 'tensorrt' builds prefill, chunk and step engines, and this model does not "
            f"stream: {programs.refusal}"
        )
    from ssmcc.kernels.triton.runtime import require_triton

    require_triton("the tensorrt target (its plugins' PTX)")
    archs = _parse_archs(options["archs"])
    workdir = tempfile.mkdtemp(prefix="ssmcc-tensorrt-")
    try:
        graphs = onnx_target.write_graphs(programs, workdir, "portable", bind_plugins)
        models = {
            name: onnx.load(os.path.join(workdir, entry["file"]), load_external_data=False)
            for name, entry in graphs.items()
        }
        phase(f"building the plugin kernels' PTX for {', '.join(archs)}")
        kernels = build_plugin_kernels(models, workdir, archs)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    executable = TensorRTExecutable(
        FolderFiles(workdir),
        graphs,
        programs.specs,
        kernels,
        profiles(graphs, options, options.chunk_size),
    )
    weakref.finalize(executable, shutil.rmtree, workdir, True)
    return executable


def save(executable: TensorRTExecutable, folder: str) -> dict:
    for name in executable.files:
        executable.model_files.copy_to(name, os.path.join(folder, name))
    return {
        "graphs": executable.graph_entries,
        "plugins": {
            "namespace": NAMESPACE,
            "version": PLUGIN_VERSION,
            "kernels": KERNELS_FILE,
            "archs": executable.kernels["archs"],
            "triton": executable.kernels["triton"],
        },
        "profiles": executable.profiles,
        "build": {
            "command": "ssmcc trt-build DIR",
            "trtexec": {g: trtexec_line("DIR", g, p) for g, p in executable.profiles.items()},
            "run_on_tensorrt": "never, in this project's CI (no TensorRT there)",
        },
        "versions": {"onnx": onnx.__version__},
    }


def _kernels_table(files, listed: dict) -> dict:
    """``plugin_kernels.json`` from the verified files, every binary it names a listed file."""
    where = files.where(KERNELS_FILE)
    if KERNELS_FILE not in listed:
        raise ArtifactError(
            f"{files.folder}: a tensorrt artifact lists {KERNELS_FILE}, this manifest does not "
            "(was its target edited? compile with --target tensorrt)"
        )
    kernels = loads_bounded(files.data(KERNELS_FILE), where)
    entries = kernels.get("kernels") if isinstance(kernels, dict) else None
    fields = ("ptx", "specialization", "arch")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(isinstance(e.get(f), str) for f in fields) for e in entries
    ):
        raise ArtifactError(
            f"{where} must hold {{'kernels': [{{'ptx', 'specialization', 'arch', ...}}]}}: it was "
            "not written by ssmcc or was changed"
        )
    missing = [e["ptx"] for e in entries if e["ptx"] not in listed]
    if missing:
        raise ArtifactError(
            f"{where} names PTX the manifest does not list: {missing[:3]}"
        )
    return kernels


def load(files, manifest: dict, options) -> TensorRTExecutable:
    """The executable of a verified artifact (``files``: ``ssmcc.artifact_files``)."""
    for key in ("plugins", "profiles"):
        if not isinstance(manifest.get(key), dict):
            raise ArtifactError(
                f"{files.folder}: a tensorrt artifact's manifest has a {key!r} object, this one "
                "has not (was its target edited? compile with --target tensorrt)"
            )
    kernels = _kernels_table(files, manifest["files"])
    specs = [StateSpec.from_dict(s) for s in manifest["states"]]
    graphs = {}
    for name, entry in manifest["graphs"].items():
        inputs = onnx_target.check_graph_file(files, entry["file"], manifest, specs)
        if not isinstance(manifest["profiles"].get(name), dict):
            raise ArtifactError(f"{files.folder}: the manifest has no profile for graph {name}")
        graphs[name] = {**entry, "inputs": inputs}
    return TensorRTExecutable(files, graphs, specs, kernels, manifest["profiles"])


# ops the ONNX lowering writes as standard ONNX ops, which TensorRT's parser imports as layers
STANDARD_OPS = {
    "attention": "standard ONNX ops (MatMul, Softmax, Where) as TensorRT layers",
    "positions": "standard ONNX ops (Range, Add) as TensorRT layers",
}


def native_ops() -> dict[str, str]:
    plugins = {
        op: ("TensorRT plugin " if len(op_types) == 1 else "TensorRT plugins ")
        + " -> ".join(f"{NAMESPACE}::{op_type}" for op_type in op_types)
        + " (kernels/triton/plugin_kernels.py, AOT PTX; never run on a real TensorRT)"
        for op, op_types in OP_PLUGINS.items()
    }
    return {**plugins, **STANDARD_OPS}


def unsupported_ops() -> dict[str, str]:
    return {
        op: "no TensorRT plugin yet (plugins for: " + ", ".join(sorted(OP_PLUGINS)) + ")"
        for op in SSMCC_OPS
        if op not in OP_PLUGINS and op not in STANDARD_OPS
    }
