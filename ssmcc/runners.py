"""What runs a compiled model, per target: ``logits``, ``prefill`` and ``step`` on tensors.

States travel as lists of tensors in the order of ``specs``; ``CompiledModel`` wraps them in
``State`` objects and checks every input before a runner sees it.
"""

from __future__ import annotations

import functools

import numpy as np
import torch


class TorchRunner:
    """The torch target: lowered modules; the stateful ones are derived on first use."""

    def __init__(self, program, kernels: str):
        from ssmcc.lowering import lower

        self.program = program
        self.kernels = kernels
        self.module = lower(program, "torch", kernels=kernels)

    @functools.cached_property
    def _stateful(self):
        from ssmcc.lowering import lower
        from ssmcc.stateful import derive_stateful_programs

        programs = derive_stateful_programs(self.program)
        modules = {
            name: lower(getattr(programs, name), "torch", kernels=self.kernels)
            for name in ("prefill", "chunk", "step")
        }
        for module in modules.values():
            # CompiledModel checks the ids and every state before a runner sees them; the
            # exported module's own pytree check would cost ~1 ms per decoded token.
            module.validate_inputs = False
        return modules, programs

    @property
    def specs(self) -> list[dict]:
        return self._stateful[1].specs

    def logits(self, *args):
        return self.module(*args)

    def _run(self, program: str, input_ids, states):
        logits, *new = self._stateful[0][program](input_ids, *states)
        return logits, new

    def prefill(self, input_ids, states):
        return self._run("prefill", input_ids, states)

    def prefill_last(self, input_ids, states):
        """Logits of the last position only (b, vocab), and the states."""
        return self._run("chunk", input_ids, states)

    def step(self, input_ids, states):
        return self._run("step", input_ids, states)


class OnnxRunner:
    """The onnx target: one ORT session per graph (prefill, chunk, step), each opened on first
    use by ``open_session(graph_name)``."""

    def __init__(self, open_session, manifest: dict):
        self._open_session = open_session
        self._sessions: dict = {}
        self.specs = manifest.get("states", [])
        self.graphs = manifest["graphs"]

    def session(self, graph: str):
        if graph not in self._sessions:
            self._sessions[graph] = self._open_session(graph)
        return self._sessions[graph]

    def _run(self, graph: str, input_ids, states):
        session = self.session(graph)
        names = [i["name"] for i in self.graphs[graph]["inputs"]]
        arrays = [np.ascontiguousarray(input_ids.numpy(), dtype=np.int64)]
        arrays += [np.ascontiguousarray(s.numpy(), dtype=np.float32) for s in states]
        outputs = session.run(None, dict(zip(names, arrays, strict=True)))
        return torch.from_numpy(outputs[0]), [torch.from_numpy(o) for o in outputs[1:]]

    def logits(self, *args):
        if not self.specs:  # a plain module: its own inputs and outputs, as exported
            names = [i["name"] for i in self.graphs["prefill"]["inputs"]]
            feed = {
                name: np.ascontiguousarray(a.numpy()) for name, a in zip(names, args, strict=True)
            }
            outputs = [torch.from_numpy(o) for o in self.session("prefill").run(None, feed)]
            return outputs[0] if len(outputs) == 1 else tuple(outputs)
        (input_ids,) = args
        zeros = [torch.zeros(input_ids.shape[0], *s["shape"][1:]) for s in self.specs]
        return self._run("prefill", input_ids, zeros)[0]

    def prefill(self, input_ids, states):
        return self._run("prefill", input_ids, states)

    def prefill_last(self, input_ids, states):
        if "chunk" not in self.graphs:  # an artifact from before the chunk graph existed
            logits, new = self._run("prefill", input_ids, states)
            return logits[:, -1], new
        return self._run("chunk", input_ids, states)

    def step(self, input_ids, states):
        return self._run("step", input_ids, states)
