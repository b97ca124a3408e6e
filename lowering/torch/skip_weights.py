"""The Mamba-2 mixers' skip weight bound per channel at lowering.

The fused Mamba-2 mixer computes ``y = ... + D x`` with ``D`` per channel, (heads, head_dim): a
per-head ``D`` (heads,), as Hugging Face and mamba_ssm store it, reaches the kernel broadcast
over ``head_dim``, which the binding did by an ``expand`` and a contiguous copy on every call (24
small allocations and copies per decoded token for mamba2-130m). Here each per-head ``D`` that
is a module attribute is replaced, once, by its per-channel copy (heads x head_dim float32,
6 KB per layer for mamba2-130m), so a call passes only memory the module holds: nothing is
copied per call, and the step's kernel calls can be replayed (``replay.py``).
"""

from __future__ import annotations

import torch
from torch import fx

from ssmcc.kernels.cpu.mixer_binding import _ssd_mixer, _ssd_mixer_step
from ssmcc.lowering.torch.freeze import _fetch
from ssmcc.ops.ssd_mixer import mixer_sizes

_MIXERS = (_ssd_mixer, _ssd_mixer_step)
_A, _D, _CONV_WEIGHT, _NORM_WEIGHT, _GROUPS = 3, 4, 1, 6, 7


def _attribute(module: fx.GraphModule, node):
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    value = _fetch(module, node.target)
    return value if isinstance(value, torch.Tensor) else None


def bind_per_channel_skips(module: fx.GraphModule) -> int:
    """Give every fused Mamba-2 mixer whose ``D`` is a per-head attribute its per-channel copy;
    returns how many."""
    bound = 0
    for node in module.graph.nodes:
        if node.op != "call_function" or node.target not in _MIXERS or len(node.args) <= _GROUPS:
            continue
        D, A = _attribute(module, node.args[_D]), _attribute(module, node.args[_A])
        conv_weight = _attribute(module, node.args[_CONV_WEIGHT])
        norm_weight = _attribute(module, node.args[_NORM_WEIGHT])
        if D is None or D.dim() != 1 or A is None or conv_weight is None or norm_weight is None:
            continue
        sizes = mixer_sizes(conv_weight, A, norm_weight, node.args[_GROUPS])
        per_channel = D.float()[:, None].expand(sizes["heads"], sizes["head_dim"]).contiguous()
        name = f"_per_channel_D_{bound}"
        module.register_buffer(name, per_channel, persistent=False)
        with module.graph.inserting_before(node):
            constant = module.graph.get_attr(name)
        node.update_arg(_D, constant)
        bound += 1
    module.graph.eliminate_dead_code()
    module.recompile()
    return bound
