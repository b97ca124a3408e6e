"""Recurrent state as a first-class object: named per layer, batch-first, each tensor in its own
dtype.

``State`` maps names such as ``layers.3.conv_state`` (b, d, k-1) and ``layers.3.ssm_state``
(b, d, n) to tensors, in the order the programs take them; the names, shapes and dtypes come from
the ops' state contracts (``StateSpec``). It is what ``prefill`` returns and ``step`` consumes; it
can be saved, loaded, and checked against the model's specs (an error names the state tensor and
what is wrong with it). Axes a contract declares growing (a K/V cache's positions) start empty
and may have any size.
"""

from __future__ import annotations

import collections.abc
import os

import torch

from ssmcc.errors import InputError
from ssmcc.ops.contracts import StateSpec

STATE_FORMAT = "ssmcc-state"


class State(collections.abc.Mapping):
    def __init__(self, tensors: dict[str, torch.Tensor]):
        self._tensors = dict(tensors)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._tensors[name]

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    @property
    def batch(self) -> int:
        return next(iter(self._tensors.values())).shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors.values())

    @classmethod
    def zeros(cls, specs: list[StateSpec], batch: int) -> State:
        """The state before any token: zeros, growing axes empty."""
        tensors = {}
        for spec in specs:
            shape = [0 if axis in spec.grows else size for axis, size in enumerate(spec.shape)]
            tensors[spec.name] = torch.zeros(batch, *shape, dtype=spec.torch_dtype)
        return cls(tensors)

    def tensors(self, specs: list[StateSpec]) -> list[torch.Tensor]:
        return [self._tensors[s.name] for s in specs]

    def save(self, path: str) -> None:
        """Write the state to ``path`` (a torch file; written atomically)."""
        tmp = f"{path}.tmp-{os.getpid()}"
        torch.save({"format": STATE_FORMAT, "tensors": self._tensors}, tmp)
        os.replace(tmp, path)

    @classmethod
    def load(cls, path: str) -> State:
        try:
            data = torch.load(path, weights_only=True)
        except Exception as error:
            raise InputError(f"{path} is not a readable ssmcc state file: {error}") from error
        if not isinstance(data, dict) or data.get("format") != STATE_FORMAT:
            raise InputError(f"{path} is not an ssmcc state file")
        return cls(data["tensors"])

    def __repr__(self) -> str:
        return f"State(batch={self.batch}, tensors={len(self)}, {self.nbytes / 1e6:.2f} MB)"


def check_state(state, specs: list[StateSpec], batch: int) -> list[torch.Tensor]:
    """The state's tensors in program order, after checking names, shapes, dtypes and batch."""
    if not isinstance(state, collections.abc.Mapping):
        raise InputError(
            f"state must be an ssmcc.State (a mapping of name -> tensor), got "
            f"{type(state).__name__}"
        )
    expected = [s.name for s in specs]
    missing = [n for n in expected if n not in state]
    extra = [n for n in state if n not in expected]
    if missing or extra:
        raise InputError(
            f"state does not fit this model: missing {missing or 'none'}, "
            f"unexpected {extra or 'none'}"
        )
    tensors = []
    for spec in specs:
        name, tensor = spec.name, state[spec.name]
        if not isinstance(tensor, torch.Tensor):
            raise InputError(f"state tensor {name} is a {type(tensor).__name__}, not a tensor")
        if tensor.dtype != spec.torch_dtype:
            raise InputError(
                f"state tensor {name} has dtype {tensor.dtype}, expected {spec.torch_dtype}"
            )
        have = tuple(tensor.shape)
        want = (batch, *spec.shape)
        fits = len(have) == len(want) and all(
            h == w or axis - 1 in spec.grows
            for axis, (h, w) in enumerate(zip(have, want, strict=True))
        )
        if not fits:
            what = "batch" if have[1:] == want[1:] else "shape"
            raise InputError(
                f"state tensor {name} has {what} {have}, expected {want} (batch {batch} from the "
                "token ids)"
            )
        tensors.append(tensor.contiguous())
    return tensors
