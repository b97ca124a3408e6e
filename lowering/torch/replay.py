"""Decode steps replayed as one C call: the kernel calls of a step recorded once, then run back to
back by ``ssmcc_replay`` (``kernels/cpu/replay.cpp``) with nothing in Python between them.

A lowered step program is ~500 fx nodes; mamba-130m's makes ~120 kernel calls per token (49
matrix-vector products, 24 fused mixer steps, 25 norms, 24 residual adds). Each costs ~10 us of
Python and ctypes argument handling: ~2 ms per token beside ~12 ms of weight reading.

Recording: the step runs once per input layout (shapes, strides and dtypes of the inputs, and
torch's thread count, which the kernels take as an argument) under an ``fx.Interpreter`` that
records every ``call_kernel`` of each node. Each node is one of:

- a kernel node: its calls become instructions (entry, arguments, relocations);
- ``aten.add.Tensor`` of two contiguous float32 tensors of one shape: ``ssmcc_add_f32``;
- an alias (``getitem`` of a tuple, or an ATen view op such as select, unsqueeze, view): nothing
  runs, the kernels reach its memory through their pointers;
- a prologue node: any other node whose inputs are only the step's inputs, constants and other
  prologue nodes (the token embedding): it runs in Python before the kernels, every call;
- the program's input-shape guard, which the layout key stands for.

Anything else refuses, and ``refusal`` says which node: a kernel wrapper that passes a temporary
copy (a strided input) or takes its many-rows path refuses that layout only, which keeps running
through the fx module; a node that must run in Python between kernels (a hybrid's attention)
stops the replay for good, as do ``MAX_LAYOUTS`` refused layouts without one recorded.

Memory. Every pointer a call receives is resolved when its node returns, against the memory known
then (all of it kept alive for the whole recording, so no address is reused): a step input or
prologue result (a slot, filled per call with that call's tensor; offsets are kept), memory an
earlier node produced (constants and intermediates, held by the replay for its lifetime: all
intermediates of one step, ~1 MB for mamba-130m at batch 1; fixed addresses), or else the calling
node's own result. Storage that holds a result of the step is not fixed: each replay allocates it
fresh (one allocation per storage, as the module does), so returned states never alias a later
step's. Results are bitwise those of the fx module: the same kernels with the same arguments in the
same order.

One thread replays at a time per layout set; a call that finds the replay busy (another thread
decoding with the same model) runs the fx module instead.
"""

from __future__ import annotations

import collections
import ctypes
import operator
import struct
import threading

import torch
from torch import fx
from torch.utils import _pytree as pytree

from ssmcc.kernels.cpu import native

aten = torch.ops.aten
MAX_LAYOUTS = 8  # recorded layouts kept per step (batch sizes in use), least recently used out


def _extent(t: torch.Tensor) -> int:
    """Bytes from ``t``'s first element to one past its last (non-negative strides)."""
    if t.numel() == 0:
        return 0
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return (last + 1) * t.element_size()


def _tensors(value) -> list[torch.Tensor]:
    return [v for v in pytree.tree_leaves(value) if isinstance(v, torch.Tensor)]


def _float_bits(value: float) -> int:
    """The 32 bits ctypes would pass for ``value`` (above FLT_MAX: infinity)."""
    return struct.unpack("<I", bytes(ctypes.c_float(value)))[0]


def _layout(t: torch.Tensor) -> tuple:
    return tuple(t.shape), t.stride(), t.dtype


def layout_key(inputs) -> tuple:
    return (
        tuple(_layout(t) for t in inputs),
        torch.get_num_threads(),
    )


class Refused(Exception):
    """A step that cannot be replayed; the message names the node and why. ``layout``: only at
    this input layout (a strided input the binding copies); otherwise the program's structure
    (a node that must run in Python), which no layout changes."""

    def __init__(self, message: str, layout: bool = False):
        super().__init__(message)
        self.layout = layout


class _Recorder(fx.Interpreter):
    """Runs the step once, classifying nodes and resolving every kernel pointer (module doc)."""

    def __init__(self, module: fx.GraphModule):
        super().__init__(module)
        # memory known so far: (start, end, kind, index); kind "slot" (index into slot_nodes) or
        # "held" (index into held)
        self.regions: list[tuple[int, int, str, int]] = []
        self.slot_nodes: list[fx.Node] = []  # per slot: a placeholder or a prologue node
        self.held: list[torch.UntypedStorage] = []
        self.constant_held: set[int] = set()
        self.placeholders: list[fx.Node] = []
        self.prologue: list[fx.Node] = []
        # values of placeholders, constants and prologue nodes, kept alive while recording so
        # that no later result takes their addresses (the interpreter drops values after use)
        self.kept: dict[fx.Node, object] = {}
        self.calls: list[tuple[str, list]] = []  # entry name, args with resolved pointers
        self.refusal: str | None = None
        self.layout_only = True  # every refusal so far is about this layout only

    # -- memory ------------------------------------------------------------------------------

    def find(self, address: int):
        """("slot" | "held", index, byte offset) of the known memory holding ``address``."""
        for start, end, kind, index in self.regions:
            if start <= address < end:
                return kind, index, address - start
        return None

    def _add_slot(self, t: torch.Tensor, owner: fx.Node) -> None:
        start, size = t.data_ptr(), _extent(t)
        if size == 0:
            return
        for other, other_end, kind, _ in self.regions:
            if kind == "slot" and start < other_end and other < start + size:
                raise Refused("two inputs of the step share memory", layout=True)
        self.regions.append((start, start + size, "slot", len(self.slot_nodes)))
        self.slot_nodes.append(owner)

    def _hold(self, t: torch.Tensor, constant: bool) -> None:
        storage = t.untyped_storage()
        if storage.nbytes() == 0 or self.find(storage.data_ptr()) is not None:
            return
        if constant:
            self.constant_held.add(len(self.held))
        start = storage.data_ptr()
        self.regions.append((start, start + storage.nbytes(), "held", len(self.held)))
        self.held.append(storage)

    # -- nodes -------------------------------------------------------------------------------

    def run_node(self, node: fx.Node):
        if self.refusal is not None:
            return super().run_node(node)
        try:
            return self._classify(node)
        except Refused as refused:
            self.refusal = f"node {node.name} ({node.target}): {refused}"
            self.layout_only = refused.layout
            return self.env[node] if node in self.env else super().run_node(node)

    def _classify(self, node: fx.Node):
        if node.op in ("output", "call_module") and node.target in ("output", "_guards_fn"):
            return super().run_node(node)  # the guard: the layout key stands for it
        if node.op == "placeholder":
            value = self.env[node] = super().run_node(node)
            self.placeholders.append(node)
            self.kept[node] = value
            self._add_slot(value, node)
            return value
        if node.op == "get_attr":
            value = self.kept[node] = super().run_node(node)
            for t in _tensors(value):
                self._hold(t, constant=True)
            return value
        if node.op != "call_function":
            raise Refused(f"{node.op} nodes are not replayed")
        with native.recording_calls() as calls:
            value = self.env[node] = super().run_node(node)
        if calls:
            self._kernel_node(value, calls)
        elif self._is_alias(node, value):
            pass
        elif node.target is aten.add.Tensor and not node.kwargs:
            self._add_node(node, value)
        elif all(arg in self.kept for arg in node.all_input_nodes):
            self._prologue_node(node, value)
        else:
            # an ssmcc kernel wrapper that called no kernel took its many-rows path (a linear
            # of more than GEMV_MAX_ROWS rows goes to oneDNN): other layouts may replay
            raise Refused(
                "runs in Python between kernels",
                layout=not isinstance(node.target, torch._ops.OpOverload),
            )
        return value

    def _is_alias(self, node: fx.Node, value) -> bool:
        """A ``getitem`` of a tuple or list, or an ATen view op whose results view the node's
        tensor inputs (an in-place op or an ``out=`` variant also returns its input's storage,
        but writes it: not an alias)."""
        if node.target is operator.getitem:
            source = node.args[0]
            return isinstance(source, fx.Node) and isinstance(self.env[source], (tuple, list))
        if not (isinstance(node.target, torch._ops.OpOverload) and node.target.is_view):
            return False
        results = _tensors(value)
        storages = {
            t.untyped_storage().data_ptr()
            for arg in node.all_input_nodes
            for t in _tensors(self.env[arg])
        }
        return bool(results) and all(t.untyped_storage().data_ptr() in storages for t in results)

    def _resolve(self, name: str, args) -> list:
        """One call's args: each pointer as ("slot" | "held", index, offset), each float as its
        32 bits, the rest as ints."""
        resolved = []
        for kind, arg in zip(native.KINDS[name], args, strict=True):
            if kind == "f":
                resolved.append(_float_bits(float(arg)))
            elif kind == "p" and arg:
                place = self.find(arg)
                if place is None:
                    raise Refused(
                        f"{name} is passed memory that no node holds (a temporary)", layout=True
                    )
                resolved.append(place)
            else:
                resolved.append(int(arg or 0))
        return resolved

    def _kernel_node(self, value, calls) -> None:
        """Kernel wrappers allocate their results before calling (so no temporary of theirs can
        share an address with a result) and return what their kernels wrote."""
        results = _tensors(value)
        for t in results:
            self._hold(t, constant=False)
        pointers = [
            arg
            for name, args in calls
            for kind, arg in zip(native.KINDS[name], args, strict=True)
            if kind == "p"
        ]
        for t in results:
            start = t.untyped_storage().data_ptr()
            end = start + t.untyped_storage().nbytes()
            if not any(a and start <= a < end for a in pointers):
                # a converted copy, or a many-rows path (dequantised weights through oneDNN)
                raise Refused("returns memory its kernels did not write", layout=True)
        for name, args in calls:
            self.calls.append((name, self._resolve(name, args)))

    def _add_node(self, node: fx.Node, value) -> None:
        operands = [self.env[a] if isinstance(a, fx.Node) else a for a in node.args]
        if not all(
            isinstance(t, torch.Tensor)
            and t.dtype == torch.float32
            and t.is_contiguous()
            and t.shape == value.shape
            for t in [*operands, value]
        ):
            raise Refused(
                "adds operands that are not contiguous float32 tensors of one shape", layout=True
            )
        self._hold(value, constant=False)
        args = [operands[0].data_ptr(), operands[1].data_ptr(), value.data_ptr(), value.numel()]
        self.calls.append(("ssmcc_add_f32", self._resolve("ssmcc_add_f32", args)))

    def _prologue_node(self, node: fx.Node, value) -> None:
        if not isinstance(value, torch.Tensor):
            raise Refused("a node before the kernels must return one tensor")
        if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
            raise Refused("writes to its input")
        self.kept[node] = value
        self._add_slot(value, node)
        self.prologue.append(node)


class _Plan:
    """One recorded layout: the prologue, the code, its slots, and how to rebuild the results."""

    def __init__(self, recorder: _Recorder, outputs):
        leaves, self.spec = pytree.tree_flatten(outputs)
        fresh: dict[int, int] = {}  # held index -> number of the fresh output storage
        sizes: list[int] = []
        # per result: ("prologue", node), or ("fresh", number, dtype, size, stride, offset)
        self.results: list[tuple] = []
        for leaf in leaves:
            if not isinstance(leaf, torch.Tensor) or leaf.numel() == 0:
                raise Refused("returns something other than a non-empty tensor")
            kind, index, _ = recorder.find(leaf.data_ptr()) or (None, None, None)
            if kind == "slot":
                owner = recorder.slot_nodes[index]
                if owner.op == "placeholder" or leaf is not recorder.kept[owner]:
                    raise Refused("returns an input of the step or a view of one")
                self.results.append(("prologue", owner))
                continue
            if kind is None or index in recorder.constant_held:
                raise Refused("returns a constant or memory that no node holds")
            if index not in fresh:
                fresh[index] = len(sizes)
                sizes.append(recorder.held[index].nbytes())
            offset = leaf.storage_offset()
            self.results.append(
                ("fresh", fresh[index], leaf.dtype, leaf.shape, leaf.stride(), offset)
            )
        self.fresh_bytes = sizes
        self.placeholders = recorder.placeholders
        self.slot_nodes = recorder.slot_nodes
        self.prologue = [
            (node, node.target, node.args, node.kwargs, _layout(recorder.kept[node]))
            for node in recorder.prologue
        ]
        self.constants = {
            arg: recorder.kept[arg]
            for node in recorder.prologue
            for arg in node.all_input_nodes
            if arg.op == "get_attr"
        }
        self.code = torch.tensor(self._encode(recorder, fresh), dtype=torch.int64)
        # what the code's fixed pointers point into (constants and intermediates)
        self.held = [s for i, s in enumerate(recorder.held) if i not in fresh]

    def _encode(self, recorder: _Recorder, fresh: dict[int, int]) -> list[int]:
        lib = native.library()
        first_fresh = len(self.slot_nodes)
        code: list[int] = []
        for name, args in recorder.calls:
            arity = ctypes.c_int32()
            entry = lib.ssmcc_replay_entry(name.encode(), ctypes.byref(arity))
            if entry < 0 or arity.value != len(args):
                raise Refused(f"the replay does not know the kernel entry {name}")
            values, relocations = [], []
            for position, arg in enumerate(args):
                if not isinstance(arg, tuple):
                    values.append(arg)
                    continue
                kind, index, offset = arg
                if kind == "slot" or index in fresh:
                    slot = index if kind == "slot" else first_fresh + fresh[index]
                    relocations += [position, slot, offset]
                    values.append(0)
                else:
                    values.append(recorder.held[index].data_ptr() + offset)
            code += [entry, len(values), len(relocations) // 3, *values, *relocations]
        return code

    def run(self, inputs) -> object:
        values = dict(self.constants)
        values.update(zip(self.placeholders, inputs, strict=True))
        for node, target, args, kwargs, layout in self.prologue:
            args, kwargs = fx.map_arg((args, kwargs), values.__getitem__)
            values[node] = target(*args, **kwargs)
            if _layout(values[node]) != layout:  # a value-dependent shape: not this plan's
                return None
        # one allocation per result storage, as the module makes them: a single buffer for all
        # (37 MB for mamba2-130m's states at batch 2) is above glibc's reuse limit, and a fresh
        # mapping of it page-faults every step
        fresh = [torch.empty(size, dtype=torch.uint8) for size in self.fresh_bytes]
        slots = [values[owner].data_ptr() for owner in self.slot_nodes]
        slots += [buffer.data_ptr() for buffer in fresh]
        lib = native.library()
        status = lib.ssmcc_replay(
            self.code.data_ptr(),
            self.code.numel(),
            (ctypes.c_int64 * len(slots))(*slots),
            len(slots),
        )
        if status != 0:
            raise RuntimeError(
                lib.ssmcc_last_error().decode(errors="replace")
                if status > 0
                else "ssmcc_replay: malformed code"
            )
        outputs = []
        for result in self.results:
            if result[0] == "prologue":
                outputs.append(values[result[1]])
                continue
            _, number, dtype, size, stride, offset = result
            outputs.append(fresh[number].view(dtype).as_strided(size, stride, offset))
        return pytree.tree_unflatten(outputs, self.spec)


class StepReplay:
    """``module(*inputs)`` with its kernel calls replayed (module doc); falls back to the module
    for a layout it cannot replay and while another thread replays, and for good once a node
    cannot be replayed at all (``refusal`` says why; a hybrid's attention, whose cache grows
    every step, stops the replay at its first step)."""

    def __init__(self, module: fx.GraphModule):
        self.module = module
        self.refusal: str | None = None
        self.disabled = False
        self._recorded = False  # some layout was recorded
        self._refused_layouts = 0
        self._plans: collections.OrderedDict = collections.OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, *inputs):
        if self.disabled or not self._lock.acquire(blocking=False):
            return self.module(*inputs)
        try:
            key = layout_key(inputs)
            plan = self._plans.get(key)
            if plan is None:
                plan, outputs = self._record(inputs)
                self._plans[key] = plan
                if len(self._plans) > MAX_LAYOUTS:
                    self._plans.popitem(last=False)
                return outputs
            self._plans.move_to_end(key)
            outputs = None if isinstance(plan, str) else plan.run(inputs)
            return self.module(*inputs) if outputs is None else outputs
        finally:
            self._lock.release()

    def _record(self, inputs):
        """(the plan, or the refusal, for this layout; this call's results)."""
        recorder = _Recorder(self.module)
        outputs = recorder.run(*inputs)
        refusal, layout_only = recorder.refusal, recorder.layout_only
        if refusal is None and not recorder.calls:
            refusal, layout_only = "the step calls no kernel", False
        if refusal is None:
            try:
                plan = _Plan(recorder, outputs)
                self._recorded = True
                return plan, outputs
            except Refused as refused:
                refusal, layout_only = f"its results: {refused}", refused.layout
        self.refusal = refusal
        self._refused_layouts += 1
        # a structural refusal, or a program that refused every layout it met so far (a
        # cache that grows every step is a new layout every step)
        self.disabled = not layout_only or (
            self._refused_layouts >= MAX_LAYOUTS and not self._recorded
        )
        return refusal, outputs
