"""The ``dtype`` option at capture: the model is captured in the compute dtype asked for.

``model_in_dtype(model, "bfloat16")`` returns the model itself when every floating parameter and
buffer already has that dtype, else a copy cast to it: the caller's model is never changed (a
cast in place and back would lose precision). The copy costs one more set of weights while
compiling.
"""

from __future__ import annotations

import copy

import torch
from torch import nn


def floating_dtypes(model: nn.Module) -> set[torch.dtype]:
    tensors = [*model.parameters(), *model.buffers()]
    return {t.dtype for t in tensors if t.is_floating_point()}


def model_in_dtype(model: nn.Module, dtype: str) -> nn.Module:
    wanted = getattr(torch, dtype)
    if floating_dtypes(model) <= {wanted}:
        return model
    return copy.deepcopy(model).to(wanted)
