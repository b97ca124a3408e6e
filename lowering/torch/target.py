"""The torch target: lower, save and load (see ``lowering/registry.py`` for the contract).

Lowering is lazy per program: ``forward`` is lowered when first called, and the stateful programs
(prefill, chunk, step) are derived and lowered on the first streaming call, so a model that is
only called never pays for them. With the C++ kernels, ``run("step", ...)`` goes through the step
replay (``replay.py``): the step's kernel calls recorded once per input layout, then run in one C
call per token.

Artifact: ``weights.safetensors`` (every weight once, shared by all programs), one
``<graph>.pt2`` per program with its weights stripped (``torch.export.save`` of the graph and
signature, plus ``extra/ssmcc_states.json``: the states it takes, in order), and the manifest. A
streaming model stores prefill, chunk and step (its full-sequence call runs prefill from zero
states); a plain module stores forward.

Loading reads everything from the artifact's verified copy in memory (``ssmcc.artifact_files``):
each archive passes ``check_archive``'s allow-list before torch reads it, the weights file's
header is checked against its bytes, every weight against the shape and dtype its program was
saved with, and the manifest's states and vocabulary against what the programs take and return.
"""

from __future__ import annotations

import json
import os
import threading

import torch

from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError, PassError
from ssmcc.frontend.report import ssmcc_op_counts
from ssmcc.kernels.cpu import native
from ssmcc.lowering.artifact_checks import check_state_inputs, check_vocab_size
from ssmcc.lowering.torch.archive_check import check_archive
from ssmcc.lowering.torch.lower import TORCH_TABLE, lower_to_torch
from ssmcc.lowering.torch.program_load import load_program
from ssmcc.lowering.torch.replay import StepReplay
from ssmcc.lowering.torch.weights import (
    bind_weights,
    read_weights,
    strip_weights,
    write_weights,
)
from ssmcc.ops import SSMCC_OPS
from ssmcc.ops.backends import description
from ssmcc.ops.contracts import StateSpec
from ssmcc.passes.program_set import STATEFUL_GRAPHS, ProgramSet
from ssmcc.passes.verifier import verify_program

WEIGHTS_FILE = "weights.safetensors"
STATES_FILE = "ssmcc_states.json"  # in each archive's extra/: the states its program takes


class TorchExecutable:
    """Lowered ``nn.Module``s of a ``ProgramSet``, one per graph, made on first use."""

    def __init__(self, programs: ProgramSet, kernels: str):
        self.programs = programs
        self.kernels = kernels
        self.specs: list[StateSpec] = programs.specs
        self._modules: dict[str, torch.nn.Module] = {}
        self._replay: StepReplay | None = None
        self._replay_lock = threading.Lock()

    @property
    def graphs(self) -> tuple[str, ...]:
        return self.programs.graphs

    def module(self, graph: str) -> torch.nn.Module:
        if graph not in self._modules:
            module = lower_to_torch(self.programs.program(graph), self.kernels)
            if graph in STATEFUL_GRAPHS:
                # CompiledModel checks the ids and every state before a target sees them; the
                # exported module's own pytree check would cost ~1 ms per decoded token.
                module.validate_inputs = False
            self._modules[graph] = module
        return self._modules[graph]

    def step_replay(self) -> StepReplay | None:
        """The step's kernel calls replayed in one C call (``replay.py``): with the C++ kernels
        only (with the references every node is Python)."""
        if self._replay is None and self.kernels == "auto" and native.available():
            with self._replay_lock:  # threads decoding at once share one
                if self._replay is None:
                    self._replay = StepReplay(self.module("step"))
        return self._replay

    def run(self, graph: str, *inputs) -> list[torch.Tensor]:
        replay = self.step_replay() if graph == "step" else None
        outputs = (replay or self.module(graph))(*inputs)
        return list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]


def lower(programs: ProgramSet, options) -> TorchExecutable:
    return TorchExecutable(programs, options.kernels)


def _saved_graphs(programs: ProgramSet) -> tuple[str, ...]:
    return STATEFUL_GRAPHS if programs.streaming else ("forward",)


def _describe_inputs(program) -> list[dict]:
    """Name, dtype and dims of each user input: ``batch``/``seq`` (the first input's dims 0, 1;
    dim 0 of the others) where symbolic, else the size."""
    user_inputs = list(program.graph_signature.user_inputs)
    described = []
    for node in program.graph.nodes:
        if node.op != "placeholder" or node.name not in user_inputs:
            continue
        value = node.meta["val"]
        axes = ("batch", "seq") if node.name == user_inputs[0] else ("batch",)
        dims = [
            axes[axis]
            if isinstance(size, torch.SymInt) and axis < len(axes)
            else str(size)
            if isinstance(size, torch.SymInt)
            else int(size)
            for axis, size in enumerate(value.shape)
        ]
        described.append(
            {"name": node.name, "dtype": str(value.dtype).removeprefix("torch."), "dims": dims}
        )
    return described


def save(executable: TorchExecutable, folder: str) -> dict:
    programs = {
        name: executable.programs.program(name) for name in _saved_graphs(executable.programs)
    }
    index = write_weights(os.path.join(folder, WEIGHTS_FILE), programs)
    graphs = {}
    for name, program in programs.items():
        file = f"{name}.pt2"
        states = executable.specs if name in STATEFUL_GRAPHS else []
        torch.export.save(
            strip_weights(program),
            os.path.join(folder, file),
            extra_files={STATES_FILE: json.dumps([s.to_dict() for s in states])},
        )
        graphs[name] = {
            "file": file,
            "inputs": _describe_inputs(program),
            "outputs": list(program.graph_signature.user_outputs),
            "nodes": len(program.graph.nodes),
            "ssmcc_nodes": sorted(ssmcc_op_counts(program)),
            "weights": index[name],
        }
    return {"graphs": graphs, "weights": WEIGHTS_FILE}


def _state_inputs(program) -> list[tuple]:
    """(None, dtype, dims without batch) of each user input after ``input_ids``."""
    users = set(list(program.graph_signature.user_inputs)[1:])
    return [
        (
            None,
            str(value.dtype).removeprefix("torch."),
            [s if isinstance(s, int) else str(s) for s in value.shape[1:]],
        )
        for node in program.graph.nodes
        if node.op == "placeholder" and node.name in users
        for value in [node.meta["val"]]
    ]


def _logits_width(program) -> int | None:
    """The last dim of the program's first output (a language model's logits), if fixed."""
    output = next(n for n in program.graph.nodes if n.op == "output")
    first = output.args[0][0] if output.args and output.args[0] else None
    value = getattr(first, "meta", {}).get("val")
    if value is None or not value.shape or not isinstance(value.shape[-1], int):
        return None
    return int(value.shape[-1])


def _described(entry) -> str:
    """A state entry as ``float32 ['batch', 128, 16] (ssm_state)``."""
    if not isinstance(entry, dict):
        return repr(entry)
    grows = f", growing along {entry.get('grows')}" if entry.get("grows") else ""
    return f"{entry.get('dtype')} {entry.get('shape')} ({entry.get('kind')}{grows})"


def _check_saved_states(where: str, saved: str, specs: list[StateSpec]) -> None:
    """The manifest's states are exactly those the program archive records, in order."""
    if not saved:
        raise ArtifactError(
            f"{where} records no state list (written by an older ssmcc): compile the model again"
        )
    recorded = loads_bounded(saved, f"{where}: extra/{STATES_FILE}")
    expected = [s.to_dict() for s in specs]
    if not isinstance(recorded, list) or len(recorded) != len(expected):
        count = len(recorded) if isinstance(recorded, list) else "no list of"
        raise ArtifactError(
            f"{where} takes {count} states, the manifest lists {len(expected)}: the manifest was "
            "edited or does not belong to these files"
        )
    for index, (theirs, ours) in enumerate(zip(recorded, expected, strict=True)):
        if theirs != ours:
            name = theirs.get("name") if isinstance(theirs, dict) else index
            raise ArtifactError(
                f"{where}: state {name} is {_described(theirs)} in the program (state input "
                f"{index + 1}), the manifest says {ours['name']} {_described(ours)}: the "
                "manifest was edited or does not belong to these files"
            )


def _load_graph(files, name: str, entry: dict, stored: dict, specs: list[StateSpec]):
    where = files.where(entry["file"])
    data = files.data(entry["file"])
    check_archive(data, where)
    try:
        program, extra = load_program(data, where, (STATES_FILE,))
    except Exception as error:  # torch's own exception types
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ArtifactError(
            f"{where} could not be read by torch.export.load: {type(error).__name__}: {text}"
        ) from error
    _check_saved_states(where, extra[STATES_FILE], specs if name in STATEFUL_GRAPHS else [])
    weights = entry.get("weights")
    if not isinstance(weights, dict) or not all(isinstance(v, str) for v in weights.values()):
        raise ArtifactError(f"{where}: graphs[{name!r}].weights must map weight names")
    try:
        bind_weights(program, {key: stored[s] for key, s in weights.items()}, where)
    except KeyError as error:
        raise ArtifactError(
            f"{where} reads the weight {error.args[0]!r}, which {WEIGHTS_FILE} does not hold"
        ) from error
    try:
        verify_program(program, after=f"loading {where}")
    except PassError as error:
        raise ArtifactError(f"{where} is not a valid ssmcc program: {error}") from error
    if name in STATEFUL_GRAPHS:
        check_state_inputs(where, specs, _state_inputs(program))
    return program


def load(files, manifest: dict, options) -> TorchExecutable:
    """The executable of a verified artifact (``files``: ``ssmcc.artifact_files``)."""
    weights_file = manifest.get("weights")
    if weights_file not in manifest["files"]:
        raise ArtifactError(
            f"{files.folder}: the manifest names no weights file among its files (a torch "
            f"artifact has {WEIGHTS_FILE})"
        )
    stored = read_weights(files.buffer(weights_file), files.where(weights_file))
    specs = [StateSpec.from_dict(s) for s in manifest["states"]]
    programs = {}
    for name, entry in manifest["graphs"].items():
        programs[name] = program = _load_graph(files, name, entry, stored, specs)
        if manifest["vocab_size"] is not None:
            check_vocab_size(files.where(entry["file"]), manifest, _logits_width(program))
    restored = ProgramSet.restored(
        programs, specs, manifest.get("streaming_refusal"), manifest.get("vocab_size") is not None
    )
    return TorchExecutable(restored, options.kernels)


def native_ops() -> dict[str, str]:
    dispatched = "the op's registered implementation (torch.ops dispatch)"
    found = {}
    for op in SSMCC_OPS:
        registered = description("torch", op)
        found[op] = registered or (TORCH_TABLE[op].kernel if op in TORCH_TABLE else dispatched)
    return found


def unsupported_ops() -> dict[str, str]:
    return {}
