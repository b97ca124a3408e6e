"""The memory a compiled model's states take, per layer kind, and what a paged hybrid cache
(vLLM's) would take for the same sequences.

From the state specs (``StateSpec``, one per state tensor, grouped by layer ``layers.<i>``):

- an **SSM layer** holds its conv and SSM states: ``ssm_bytes`` per sequence, whatever its length;
- an **attention layer** holds K and V: ``kv_bytes_per_token`` per sequence and token (the specs'
  growing axis);
- ssmcc keeps both unpadded: at context ``n`` and batch ``b``::

      ssmcc_bytes = b * (sum over SSM layers of ssm_bytes + n * sum over attention layers of kv)
                    (+ 8 bytes per sequence for the position counter, when the model has one)

- vLLM's hybrid allocator gives every layer one page size. An attention page holds ``block``
  tokens of one layer (``block * kv``), and it must be at least the largest SSM layer's state::

      block      = align * ceil(max ssm_bytes / (align * kv_per_layer))      align = 16
      page       = block * kv_per_layer                 (each SSM layer's state padded to it)
      vllm_bytes = b * (attention layers * ceil(n / block) * page + SSM layers * page)

  (``vllm.platforms.interface``: the attention block size is raised until one attention page is
  at least one Mamba page, then the Mamba page is padded to the attention page; 16 is the
  FlashAttention backend's kernel block alignment and vLLM's default block size). With layers of
  different K/V widths vLLM uses the model's (one) head count; the plan takes the widest layer.

Everything is counted in the dtypes ssmcc stores (the specs' own): SSM states in float32.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections import defaultdict

from ssmcc.ops.contracts import StateSpec

KV_KINDS = ("key", "value")
VLLM_BLOCK_ALIGN = 16


def _per_token_bytes(spec: StateSpec) -> int:
    """Bytes of one cached position (a growing spec's shape with the growing axes at 1)."""
    shape = tuple(1 if axis in spec.grows else size for axis, size in enumerate(spec.shape))
    return dataclasses.replace(spec, shape=shape).nbytes_per_row


def _layer(name: str) -> str:
    found = re.match(r"(layers\.\d+)\.", name)
    return found.group(1) if found else name


@dataclasses.dataclass(frozen=True)
class MemoryPlan:
    context: int
    batch: int
    ssm_layers: dict[str, int]  # layer -> conv + SSM state bytes per sequence
    attention_layers: dict[str, int]  # layer -> K + V bytes per token per sequence
    other_bytes: int  # per sequence: states of no layer kind above (the position counter)

    @classmethod
    def of(cls, specs: list[StateSpec], context: int, batch: int) -> MemoryPlan:
        ssm: defaultdict[str, int] = defaultdict(int)
        attention: defaultdict[str, int] = defaultdict(int)
        other = 0
        for spec in specs:
            if spec.kind in KV_KINDS:
                attention[_layer(spec.name)] += _per_token_bytes(spec)
            elif spec.grows or not spec.name.startswith("layers."):
                other += spec.nbytes_per_row
            else:
                ssm[_layer(spec.name)] += spec.nbytes_per_row
        return cls(context, batch, dict(ssm), dict(attention), other)

    @property
    def ssm_bytes(self) -> int:
        return sum(self.ssm_layers.values())

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(self.attention_layers.values())

    @property
    def ssmcc_bytes(self) -> int:
        per_sequence = self.ssm_bytes + self.context * self.kv_bytes_per_token + self.other_bytes
        return self.batch * per_sequence

    @property
    def vllm_block_size(self) -> int | None:
        """The attention block size vLLM's rule forces (None without both layer kinds)."""
        if not self.ssm_layers or not self.attention_layers:
            return None
        kv = max(self.attention_layers.values())
        state = max(self.ssm_layers.values())
        return VLLM_BLOCK_ALIGN * max(1, math.ceil(state / (VLLM_BLOCK_ALIGN * kv)))

    @property
    def vllm_page_bytes(self) -> int | None:
        block = self.vllm_block_size
        return None if block is None else block * max(self.attention_layers.values())

    @property
    def vllm_bytes(self) -> int | None:
        block, page = self.vllm_block_size, self.vllm_page_bytes
        if block is None or page is None:
            return None
        pages = len(self.attention_layers) * math.ceil(self.context / block) + len(self.ssm_layers)
        return self.batch * pages * page

    def lines(self) -> list[str]:
        mb = 1e6
        out = [f"memory plan:    context {self.context:,} tokens, batch {self.batch}"]
        if self.ssm_layers:
            each = sorted(set(self.ssm_layers.values()))
            out.append(
                f"  SSM layers:   {len(self.ssm_layers)} x "
                f"{'/'.join(f'{b:,}' for b in each)} B state per sequence "
                f"(conv + SSM, any length) = {self.ssm_bytes * self.batch / mb:,.3f} MB"
            )
        if self.attention_layers:
            each = sorted(set(self.attention_layers.values()))
            out.append(
                f"  attention:    {len(self.attention_layers)} x "
                f"{'/'.join(f'{b:,}' for b in each)} B K/V per token = "
                f"{self.context * self.kv_bytes_per_token * self.batch / mb:,.3f} MB at "
                f"{self.context:,} tokens"
            )
        if self.other_bytes:
            out.append(f"  other:        {self.other_bytes} B per sequence (position counter)")
        out.append(f"  ssmcc:        {self.ssmcc_bytes / mb:,.3f} MB (states unpadded)")
        if self.vllm_bytes is not None:
            wasted = self.vllm_bytes - self.ssmcc_bytes + self.batch * self.other_bytes
            out.append(
                f"  paged (vLLM): attention block {self.vllm_block_size:,} tokens (a page of "
                f"{self.vllm_page_bytes:,} B must hold one SSM layer's state), "
                f"{self.vllm_bytes / mb:,.3f} MB, {wasted / mb:,.3f} MB of it padding"
            )
        return out
