"""The onnx target: lower, save and load (see ``lowering/registry.py`` for the contract).

Its form of a ``ProgramSet`` is a set of ONNX files sharing one weights file:
``prefill.onnx`` (``input_ids`` + states -> logits + next states), ``chunk.onnx`` (the same, with
the last position's logits only: what chunked prefill and ``generate`` run; derived from the
prefill graph where its head allows, ``chunk_graph.py``), ``step.onnx`` (one
token + states -> last logits + next states) and ``weights.bin`` (every initializer stored once,
by content). A model that does not stream has ``forward.onnx`` (its own inputs and outputs)
instead. ONNX Runtime sessions open on first use of a graph, from the graph's bytes and with its
external data handed over from memory: a loaded artifact's verified copy
(``ssmcc.artifact_files``), so nothing done to the directory after ``load`` changes what runs. In
the ``onnx_functions="keep"`` artifact every float32 product reads its weight in place
(``weights_in_place.py``; the graph entry says ``"weights_in_place": true``): its sessions share
that one copy of ``weights.bin`` and pack nothing, so the model holds its weights once. Any other
graph's session holds its own copy.

Compiling writes these files to a private working directory (ONNX Runtime reads external weights
from files) that lives as long as the compiled model; ``save`` copies them into the artifact.
The modules only compiling needs (the exporter and the emitters: onnxscript, 73 MB resident) are
imported by the functions that compile, so loading an artifact imports onnx and onnxruntime only.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import weakref

import numpy as np
import onnx
import onnx.inliner
import torch
from onnx import numpy_helper

from ssmcc.artifact_files import FolderFiles
from ssmcc.errors import ArtifactError, LoweringError
from ssmcc.file_pages import release_file_pages
from ssmcc.lowering.artifact_checks import check_state_inputs, check_vocab_size
from ssmcc.lowering.onnx.chunk_graph import chunk_from_prefill
from ssmcc.lowering.onnx.graph_edits import remove_dead_nodes
from ssmcc.lowering.onnx.schemas import DOMAIN, VERSION
from ssmcc.lowering.onnx.weights_in_place import read_weights_in_place
from ssmcc.ops.contracts import StateSpec
from ssmcc.passes.program_set import STATEFUL_GRAPHS, ProgramSet
from ssmcc.progress import phase

WEIGHTS_FILE = "weights.bin"
ALIGN = 64
_TYPE_NAMES = {
    onnx.TensorProto.INT64: "int64",
    onnx.TensorProto.FLOAT: "float32",
    onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16",
}


def _dim_names(program) -> dict[str, str]:
    """``input_ids`` dims -> batch, seq; every other user input's dim 0 -> batch and any other
    dynamic dim of a state -> past (the positions a K/V cache holds)."""
    names = {}
    user_inputs = list(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        axes = ("batch", "seq") if node.name == user_inputs[0] else ("batch",)
        for axis, size in enumerate(node.meta["val"].shape):
            if isinstance(size, torch.SymInt):
                names[str(size.node.expr)] = axes[axis] if axis < len(axes) else "past"
    return names


def _describe_values(values) -> list[dict]:
    return [
        {
            "name": v.name,
            "dtype": _TYPE_NAMES.get(
                v.type.tensor_type.elem_type, str(v.type.tensor_type.elem_type)
            ),
            "dims": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim],
        }
        for v in values
    ]


class _WeightsFile:
    """``weights.bin``, written as the graphs are exported: each graph's weights move into the
    file before the graph becomes a ModelProto (``take``; the proto then holds references only)
    and any weight a rewrite adds afterwards when the graph is final (``externalize``). Each
    distinct content is stored once (the prefill, chunk and step graphs share the weights), so
    compiling holds no copy of the weights beyond the model's own and one tensor at a time."""

    def __init__(self, folder: str):
        self.folder = folder
        self.file = open(os.path.join(folder, WEIGHTS_FILE), "wb")  # noqa: SIM115 (closed by close)
        self.stored: dict[bytes, tuple[int, int]] = {}

    def _store(self, data: np.ndarray, data_type: int) -> tuple[int, int]:
        """(offset, length) of ``data``'s bytes in the file, written unless already there."""
        raw = memoryview(np.ascontiguousarray(data).reshape(-1).view(np.uint8))
        key = hashlib.sha256(raw).digest() + bytes(str(data_type), "ascii")
        if key not in self.stored:
            self.file.write(b"\0" * (-self.file.tell() % ALIGN))
            self.stored[key] = (self.file.tell(), raw.nbytes)
            self.file.write(raw)
        return self.stored[key]

    def take(self, model) -> None:
        """Move the weights of an ONNX IR model (``WEIGHT_BYTES`` or more) into the file, each
        replaced by a reference to where it is stored."""
        import onnx_ir as ir

        from ssmcc.lowering.onnx.export import WEIGHT_BYTES

        for value in model.graph.initializers.values():
            tensor = value.const_value
            if tensor is None or isinstance(tensor, ir.ExternalTensor):
                continue
            if tensor.nbytes < WEIGHT_BYTES:
                continue
            array = tensor.numpy()
            offset, length = self._store(array, int(tensor.dtype))
            release_file_pages([array])  # a memory-mapped checkpoint's pages
            value.const_value = ir.ExternalTensor(
                WEIGHTS_FILE,
                offset,
                length,
                dtype=tensor.dtype,
                shape=tensor.shape,
                name=value.name,
                base_dir=self.folder,
            )
        self.file.flush()  # rewrites read stored tensors back (scales, weights to transpose)

    def externalize(self, model: onnx.ModelProto) -> None:
        """Move the ModelProto's initializers still held in it (``WEIGHT_BYTES`` or more)
        into the file."""
        from ssmcc.lowering.onnx.export import WEIGHT_BYTES

        for tensor in model.graph.initializer:
            if tensor.data_location == onnx.TensorProto.EXTERNAL:
                continue
            array = numpy_helper.to_array(tensor)
            if array.nbytes < WEIGHT_BYTES:
                continue
            offset, length = self._store(array, tensor.data_type)
            tensor.ClearField("raw_data")
            for field in ("float_data", "int32_data", "int64_data", "double_data", "uint64_data"):
                tensor.ClearField(field)
            tensor.data_location = onnx.TensorProto.EXTERNAL
            del tensor.external_data[:]
            for k, v in (("location", WEIGHTS_FILE), ("offset", offset), ("length", length)):
                tensor.external_data.add(key=k, value=str(v))
        self.file.flush()  # the graph is checked against the file before the next is written

    def close(self) -> None:
        self.file.close()


def _graph_entry(name: str, model: onnx.ModelProto, in_place: bool) -> dict:
    return {
        "file": f"{name}.onnx",
        "inputs": _describe_values(model.graph.input),
        "outputs": _describe_values(model.graph.output),
        "nodes": len(model.graph.node),
        "ssmcc_nodes": sorted({n.op_type for n in model.graph.node if n.domain == DOMAIN}),
        "weights_in_place": in_place,
    }


def _check_float32(program) -> None:
    """The ONNX target runs float32 programs (ONNX Runtime's CPU kernels lack bf16 for most ops);
    weights stored small by ``quantize=`` are widened by their ops."""
    for name, tensor in program.state_dict.items():
        stored = name.endswith(".quantized")
        if tensor.is_floating_point() and tensor.dtype != torch.float32 and not stored:
            dtype = str(tensor.dtype).removeprefix("torch.")
            raise LoweringError(
                f"backend 'onnx' runs float32 programs; this one holds {dtype} weights (e.g. "
                f"{name}): compile with dtype='float32' (ssmcc casts a copy of the model) or "
                "use target='torch', which runs bfloat16 and float16 models"
            )


def _exported_models(programs: ProgramSet, take_weights, runtime_nodes: bool = True):
    """(graph name, ONNX model) for each graph of the program set, exported one at a time,
    its weights moved out by ``take_weights`` (``lower_to_onnx``, as ``runtime_nodes`` says)."""
    from ssmcc.lowering.onnx.export import lower_to_onnx

    _check_float32(programs.forward)
    if programs.streaming:
        names = [s.name for s in programs.specs]
        inputs = ["input_ids", *names]
        outputs = ["logits", *[f"{n}.next" for n in names]]
        prefill = None
        for graph in STATEFUL_GRAPHS:
            if graph == "chunk" and prefill is not None:
                chunk = chunk_from_prefill(prefill)
                del prefill
                if chunk is not None:
                    phase("derived the chunk graph from the prefill graph")
                    yield graph, chunk
                    continue
            phase(f"exporting the {graph} graph to ONNX")
            program = programs.program(graph)
            model = lower_to_onnx(
                program, inputs, outputs, _dim_names(program), take_weights, runtime_nodes
            )
            if graph == "prefill":  # its weights are references by now: a small copy
                prefill = onnx.ModelProto()
                prefill.CopyFrom(model)
            yield graph, model
        return
    token = programs.token_model
    phase("exporting the forward graph to ONNX")
    yield (
        "forward",
        lower_to_onnx(
            programs.forward,
            ["input_ids"] if token else None,
            ["logits"] if token else None,
            _dim_names(programs.forward) if token else None,
        ),
    )


class OnnxExecutable:
    """ONNX Runtime sessions over the model's files (``ssmcc.artifact_files``: a loaded
    artifact's verified copy in memory, or a compile's private folder), each opened on first
    use from the graph's bytes, its external data handed over from memory."""

    def __init__(self, files, graphs: dict, specs: list[StateSpec], kernels, threads):
        self.model_files = files
        self.folder = files.folder
        self.graph_entries = graphs
        self.specs = specs
        self.kernels = kernels
        self.threads = threads
        self._sessions: dict = {}
        self._weights = None  # SharedWeights, made on the first session that reads in place

    @property
    def graphs(self) -> tuple[str, ...]:
        return tuple(self.graph_entries)

    def _open(self, graph: str):
        from ssmcc.lowering.onnx.runtime import SharedWeights, external_locations, make_session

        entry = self.graph_entries[graph]
        data = bytes(self.model_files.data(entry["file"]))
        external = {
            name: self.model_files.array(name)
            for name in external_locations(onnx.load_from_string(data))
        }
        weights = None
        if entry.get("weights_in_place") and WEIGHTS_FILE in external:
            if self._weights is None:
                self._weights = SharedWeights(WEIGHTS_FILE, external[WEIGHTS_FILE])
            weights = self._weights
        return make_session(data, self.kernels, self.threads, weights, external)

    def session(self, graph: str):
        if graph not in self._sessions:
            try:
                self._sessions[graph] = self._open(graph)
            except Exception as error:  # onnxruntime's own exception types
                first = str(error).strip().splitlines()[0]
                where = self.model_files.where(self.graph_entries[graph]["file"])
                raise ArtifactError(
                    f"{where} could not be loaded by onnxruntime: {first}"
                ) from error
        return self._sessions[graph]

    def run(self, graph: str, *inputs) -> list[torch.Tensor]:
        entries = self.graph_entries[graph]["inputs"]
        feed = {}
        for entry, tensor in zip(entries, inputs, strict=True):
            array = tensor.numpy()
            if entry["dtype"] == "int64":
                array = array.astype(np.int64, copy=False)
            elif entry["dtype"] == "float32":
                array = array.astype(np.float32, copy=False)
            feed[entry["name"]] = np.ascontiguousarray(array)
        return [torch.from_numpy(o) for o in self.session(graph).run(None, feed)]

    def file_paths(self) -> dict[str, str]:
        """Every file of a compiled (not loaded) model, by name: its private folder's."""
        return {name: os.path.join(self.folder, name) for name in self.files}

    @property
    def files(self) -> list[str]:
        names = [entry["file"] for entry in self.graph_entries.values()]
        return names + ([WEIGHTS_FILE] if self.model_files.has(WEIGHTS_FILE) else [])


def _versions() -> dict[str, str]:
    import onnxruntime

    return {"onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__}


def inline_functions(model: onnx.ModelProto, graph: str) -> onnx.ModelProto:
    """``model`` with every model-local function call replaced by its body: standard ONNX ops
    only, or ``LoweringError`` naming the nodes that have no standard form."""
    inlined = onnx.inliner.inline_local_functions(model)
    del inlined.functions[:]
    custom = sorted({f"{n.domain}.{n.op_type}" for n in inlined.graph.node if n.domain})
    if custom:
        raise LoweringError(
            f"backend 'onnx', onnx_functions='inline': the {graph} graph keeps {', '.join(custom)}"
            ", which have no standard-op body; compile with onnx_functions='keep' (ONNX Runtime "
            "with ssmcc's library) or without the option that produced them"
        )
    standard = [o for o in inlined.opset_import if o.domain in ("", "ai.onnx")]
    del inlined.opset_import[:]
    inlined.opset_import.extend(standard)
    remove_dead_nodes(inlined.graph)
    return inlined


def write_graphs(programs: ProgramSet, folder: str, form: str, edit=None) -> dict:
    """Export the program set's graphs into ``folder`` (``<graph>.onnx`` and ``weights.bin``);
    returns the graph entries of the manifest. ``form``:

        runtime    what ssmcc's ONNX Runtime sessions run: float32 products read their weights in
                   place through ssmcc's library (``weights_in_place.py``)
        inline     standard ONNX ops only: every function body written into the graph
        portable   one ``ssmcc`` node per ssmcc op with its body as a model-local function, and
                   nothing specific to ONNX Runtime: no weights read in place, a decode step's
                   MoE experts as standard ops (what other runtimes' importers read: the
                   TensorRT target binds the nodes to its plugins)

    ``edit(name, model)``, when given, edits each graph before it is checked and saved."""
    weights = _WeightsFile(folder)
    graphs = {}
    for name, model in _exported_models(programs, weights.take, form != "portable"):
        if form == "runtime":  # ONNX Runtime: products on the weights as stored
            read_weights_in_place(model, folder)
        weights.externalize(model)  # what the rewrites added
        if form == "inline":
            model = inline_functions(model, name)
        if edit is not None:
            edit(name, model)
        path = os.path.join(folder, f"{name}.onnx")
        onnx.save_model(model, path)
        onnx.checker.check_model(path, full_check=True)  # by path: it reads weights.bin
        graphs[name] = _graph_entry(name, model, form == "runtime")
        del model
    weights.close()
    phase(f"wrote the ONNX graphs and {WEIGHTS_FILE}")
    return graphs


def lower(programs: ProgramSet, options) -> OnnxExecutable:
    inline = options["onnx_functions"] == "inline"
    workdir = tempfile.mkdtemp(prefix="ssmcc-onnx-")
    try:
        graphs = write_graphs(programs, workdir, "inline" if inline else "runtime")
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    executable = OnnxExecutable(
        FolderFiles(workdir), graphs, programs.specs, options.kernels, options["threads"]
    )
    weakref.finalize(executable, shutil.rmtree, workdir, True)
    return executable


def save(executable: OnnxExecutable, folder: str) -> dict:
    for name in executable.files:
        executable.model_files.copy_to(name, os.path.join(folder, name))
    return {
        "graphs": executable.graph_entries,
        "opset": _opsets(executable),
        "versions": _versions(),
    }


def _opsets(executable: OnnxExecutable) -> dict[str, int]:
    """The operator sets the graph files import (ONNX's, ssmcc's and, where products read
    their weights in place, com.microsoft's), highest version per domain."""
    from ssmcc.lowering.onnx.export import OPSET

    found = {"": OPSET, DOMAIN: VERSION}
    for entry in executable.graph_entries.values():
        proto = onnx.load_from_string(bytes(executable.model_files.data(entry["file"])))
        for opset in proto.opset_import:
            domain = "" if opset.domain == "ai.onnx" else opset.domain
            found[domain] = max(found.get(domain, 0), opset.version)
    return found


def _tensors(graph: onnx.GraphProto):
    """Every TensorProto of a graph: initializers and tensor attributes, subgraphs included."""
    yield from graph.initializer
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.HasField("t"):
                yield attribute.t
            yield from attribute.tensors
            if attribute.HasField("g"):
                yield from _tensors(attribute.g)
            for sub in attribute.graphs:
                yield from _tensors(sub)


def check_graph_file(files, name: str, manifest: dict, specs: list[StateSpec]) -> list:
    """The graph's inputs (as ``_describe_values``), after checking that it reads external data
    only from the artifact's own files, that its state inputs are the manifest's states and its
    logits as wide as the manifest's vocabulary."""
    where = files.where(name)
    try:
        model = onnx.load_from_string(bytes(files.data(name)))
    except Exception as error:  # protobuf's own exception types
        raise ArtifactError(f"{where} is not a readable ONNX model: {error}") from error
    for tensor in _tensors(model.graph):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        location = {entry.key: entry.value for entry in tensor.external_data}.get("location")
        if location not in manifest["files"] or location == name:
            raise ArtifactError(
                f"{where}: tensor {tensor.name!r} reads external data from {location!r}, which "
                "is not one of the artifact's listed weight files"
            )
    if manifest["streaming"]:
        inputs = [
            (
                value.name,
                _TYPE_NAMES.get(value.type.tensor_type.elem_type, "other"),
                [d.dim_value if d.HasField("dim_value") else d.dim_param for d in dims[1:]],
            )
            for value in model.graph.input[1:]
            for dims in [value.type.tensor_type.shape.dim]
        ]
        check_state_inputs(where, specs, inputs)
    if manifest["vocab_size"] is not None and model.graph.output:
        dims = model.graph.output[0].type.tensor_type.shape.dim
        fixed = len(dims) > 0 and dims[len(dims) - 1].HasField("dim_value")
        check_vocab_size(where, manifest, dims[len(dims) - 1].dim_value if fixed else None)
    return _describe_values(model.graph.input)


def load(files, manifest: dict, options) -> OnnxExecutable:
    """The executable of a verified artifact (``files``: ``ssmcc.artifact_files``)."""
    specs = [StateSpec.from_dict(s) for s in manifest["states"]]
    graphs = {}
    for name, entry in manifest["graphs"].items():
        inputs = check_graph_file(files, entry["file"], manifest, specs)
        graphs[name] = {**entry, "inputs": inputs}  # what the file takes, not what is said of it
    return OnnxExecutable(files, graphs, specs, options.kernels, options["threads"])


def native_ops() -> dict[str, str]:
    from ssmcc.lowering.onnx.emitters import ONNX_TABLE

    return {op: emitter.kernel for op, emitter in ONNX_TABLE.items()}


def unsupported_ops() -> dict[str, str]:
    from ssmcc.lowering.onnx.emitters import ONNX_UNSUPPORTED

    return dict(ONNX_UNSUPPORTED)
