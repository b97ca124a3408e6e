"""``ProgramSet``: the programs of one compiled model, what every target lowers.

- ``forward``: the program after the pipeline (the model's own inputs -> its outputs);
- for a token model that can stream, each derived once on its first use (``chunk`` from
  ``prefill``, the others from ``forward``), by its state pass and then
  the pipeline the program was compiled with, under the same ``PassContext`` (the user's choices
  and the target's gates; ``pipelines.derivation`` holds the pass lists):

      prefill  (input_ids (b, l), *states) -> (logits (b, l, v), *states)   expose_recurrent_state
      chunk    (input_ids (b, c), *states) -> (last logits (b, v), *states) chunk_state_passing
      step     (input_ids (b, 1), *states) -> (logits (b, v), *states)      scan_to_recurrent_step

- ``specs``: the states (``StateSpec``), in the order those programs take them;
- ``refusal``: why this program cannot stream, or ``None``. It is decided before anything is
  derived: a plain module (no token ids), a length fixed at capture, no stateful op, a stateful
  op fed a state by the program itself, or a node outside the stateful ops that mixes positions
  along the sequence (``position_mixing``) — a step derived from such a program would be wrong.
"""

from __future__ import annotations

import dataclasses
import functools
import threading

from torch.export import ExportedProgram

from ssmcc.errors import StreamingError
from ssmcc.ops.contracts import StateSpec, bind_arguments
from ssmcc.passes.locations import location
from ssmcc.passes.manager import run_passes
from ssmcc.passes.pass_base import PassContext
from ssmcc.passes.position_mixing import position_mixing
from ssmcc.passes.scan_to_recurrent_step import op_name, state_specs, stateful_nodes

STATEFUL_GRAPHS = ("prefill", "chunk", "step")
MAX_LISTED = 5


def streaming_refusal(
    program: ExportedProgram, token_model: bool, static_length: int | None
) -> str | None:
    """Why prefill/step/generate cannot be derived for ``program``, or None."""
    if not token_model:
        return (
            "prefill/step/generate need a language model (token ids in, logits out); this "
            "compiled model is a plain module"
        )
    if static_length is not None:
        return (
            f"prefill/step/generate need a program whose length is dynamic; this one was "
            f"captured at a static length of {static_length} tokens (routing off). Compile with "
            "route=True (the default) to stream"
        )
    nodes = stateful_nodes(program)
    if not nodes:
        return (
            "this program has no SSM layer, so it has no recurrent state: prefill, step and "
            "generate need one"
        )
    for node, contract in nodes:
        bound = bind_arguments(node.target, node.args, node.kwargs)
        for slot in contract.slots:
            if bound[slot.arg] is not None:
                return (
                    f"{location(node)}: ssmcc.{op_name(node.target)} already takes its "
                    f"{slot.arg} from the program, so ssmcc cannot carry that state between "
                    "calls; prefill/step/generate need every stateful op to start from its "
                    "argument's default (zeros)"
                )
    mixing = position_mixing(program)
    if mixing:
        listed = "\n  ".join(m.describe() for m in mixing[:MAX_LISTED])
        more = f"\n  ... and {len(mixing) - MAX_LISTED} more" if len(mixing) > MAX_LISTED else ""
        return (
            f"prefill/step/generate cannot be derived for this program: {len(mixing)} node(s) "
            "outside ssmcc's state-carrying ops mix positions along the sequence, so a one-token "
            f"step would compute something else:\n  {listed}{more}\n"
            "Such a computation needs an op with a state contract (ssmcc.ops.contracts). The "
            "full-sequence call (compiled(ids)) is not affected."
        )
    return None


class ProgramSet:
    """``context``: the ``PassContext`` ``forward`` was compiled with (default: the ``default``
    pipeline, no target gates); the stateful programs are derived under it."""

    def __init__(
        self,
        forward: ExportedProgram,
        *,
        token_model: bool,
        static_length: int | None = None,
        context: PassContext | None = None,
    ):
        self.forward: ExportedProgram | None = forward  # None: restored without it
        self.token_model = token_model
        self.static_length = static_length
        self.context = context if context is not None else PassContext()
        self.refusal = streaming_refusal(forward, token_model, static_length)
        self.specs: list[StateSpec] = [] if self.refusal else state_specs(forward)
        self._deriving = threading.RLock()

    @classmethod
    def restored(
        cls,
        programs: dict[str, ExportedProgram],
        specs: list[StateSpec],
        refusal: str | None,
        token_model: bool,
    ) -> ProgramSet:
        """A set read back from an artifact: the programs it holds, nothing derived again."""
        self = cls.__new__(cls)
        self.forward = programs.get("forward")
        self.token_model = token_model
        self.static_length = None
        self.context = PassContext()
        self._deriving = threading.RLock()
        self.refusal = refusal
        self.specs = list(specs)
        self.__dict__["_stateful"] = {k: v for k, v in programs.items() if k != "forward"}
        return self

    @property
    def streaming(self) -> bool:
        return self.refusal is None

    @functools.cached_property
    def _stateful(self) -> dict[str, ExportedProgram]:
        """The stateful programs derived so far, by name (each derived on first use)."""
        if self.refusal is not None:
            raise StreamingError(self.refusal)
        return {}

    def _derive(self, graph: str) -> ExportedProgram:
        from ssmcc.passes.pipelines import derivation  # the pattern passes; not needed to run

        # the compile's options and gates; its report's near misses are not added to
        ctx = dataclasses.replace(self.context, options=dict(self.context.options), diagnostics={})
        source, passes = derivation(graph, ctx.pipeline)
        program, _ = run_passes(self.program(source), passes, ctx)
        return program

    @property
    def graphs(self) -> tuple[str, ...]:
        """The programs this set provides (stateful ones derived on demand)."""
        names = ("forward",) if self.forward is not None else ()
        return names + (STATEFUL_GRAPHS if self.streaming else ())

    def program(self, name: str) -> ExportedProgram:
        """``forward``, ``prefill``, ``chunk`` or ``step`` (deriving the stateful ones once)."""
        if name == "forward" and self.forward is not None:
            return self.forward
        if name not in STATEFUL_GRAPHS:
            raise KeyError(f"no program {name!r}; this set has {', '.join(self.graphs)}")
        with self._deriving:  # torch.export is not thread-safe; chunk derives prefill first
            if name not in self._stateful:
                self._stateful[name] = self._derive(name)
            return self._stateful[name]
