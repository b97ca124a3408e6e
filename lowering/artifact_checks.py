"""Checks a target's ``load`` makes of its graph files against the manifest that names them.

The runtime has already checked the manifest's schema and every file's size and SHA-256, but the
manifest itself is not hashed: what it says about the states must agree with what the graph files
(hashed) actually take, or a state shaped after the manifest would reach a runtime that expects
another. ``check_state_inputs`` compares them and names the first state that differs;
``check_vocab_size`` compares the manifest's vocabulary with the width of the logits a graph
returns.
"""

from __future__ import annotations

from ssmcc.errors import ArtifactError
from ssmcc.ops.contracts import StateSpec


def check_state_inputs(path: str, specs: list[StateSpec], inputs: list[tuple]) -> None:
    """``inputs``: the graph's own (name, dtype, dims without batch) after ``input_ids``, in order.

    Names are compared where the graph keeps them (``name`` None: a positional input), dtypes and
    every non-growing size always.
    """
    if len(inputs) != len(specs):
        raise ArtifactError(
            f"{path} takes {len(inputs)} state input(s), the manifest lists {len(specs)} states"
        )
    for spec, (name, dtype, dims) in zip(specs, inputs, strict=True):
        if name is not None and name != spec.name:
            raise ArtifactError(
                f"{path}: state input {name!r} where the manifest has {spec.name!r}"
            )
        fixed = [axis for axis in range(len(spec.shape)) if axis not in spec.grows]
        fits = len(dims) == len(spec.shape) and all(dims[a] == spec.shape[a] for a in fixed)
        if not fits or dtype != spec.dtype:
            raise ArtifactError(
                f"{path}: state {spec.name} is {dtype} {['batch', *dims]} in the graph, the "
                f"manifest says {spec.dtype} {['batch', *spec.shape]}: the manifest was edited "
                "or does not belong to these files"
            )


def check_vocab_size(path: str, manifest: dict, logits_width: int | None) -> None:
    """A language model's graph returns logits as wide as the manifest's ``vocab_size`` (which
    the runtime checks token ids against and sizes its outputs by)."""
    vocab = manifest.get("vocab_size")
    if vocab is not None and logits_width is not None and logits_width != vocab:
        raise ArtifactError(
            f"{path} returns logits over {logits_width} tokens, the manifest's vocab_size is "
            f"{vocab}: the manifest was edited or does not belong to these files"
        )
