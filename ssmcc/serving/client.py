"""Stream a generation from an ssmcc model served by Triton Inference Server (``tritonclient``).

The prompt goes in one request that starts the sequence (``sequence_start``), then one request
per new token; the last one ends it (``sequence_end``). Greedy asks for the server's
``next_token`` only (the argmax of the logits, computed there); sampling draws from ``logits``
with ``ssmcc``'s own sampler and a generator seeded per sequence, so a sequence's tokens are those
``compiled.generate(prompt, n, do_sample=True, seed=s, ...)`` gives for one prompt.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from ssmcc.errors import ServingError
from ssmcc.runtime.generation import Sampling, choose

PROTOCOLS = ("http", "grpc")


class Client:
    """``Client(url, model, protocol="http")``: ``url`` is the server's HTTP endpoint
    (``host:port``), or its gRPC one with ``protocol="grpc"``. One client per thread:
    tritonclient's HTTP client is not safe to share between threads (it deadlocks)."""

    def __init__(
        self, url: str, model: str = "ssmcc", *, protocol: str = "http", timeout_s: float = 120.0
    ):
        if protocol not in PROTOCOLS:
            raise ServingError(f"protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        try:
            if protocol == "http":
                import tritonclient.http as library
            else:
                import tritonclient.grpc as library
        except ImportError as error:
            raise ServingError(
                f"tritonclient ({protocol}) is not installed: pip install 'ssmcc[serving]'"
            ) from error
        self._library = library
        self.model = model
        if protocol == "http":
            self.client = library.InferenceServerClient(
                url, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        else:
            self.client = library.InferenceServerClient(url)
        self.timeout_s = timeout_s

    def infer(
        self,
        ids,
        sequence_id: int,
        *,
        start: bool = False,
        end: bool = False,
        output: str = "logits",
    ) -> np.ndarray:
        """One request: ``ids`` (tokens of one sequence) -> the last position's ``logits``
        (vocab,), or with ``output="next_token"`` the server's greedy choice (1,) alone (8 bytes
        instead of the vocabulary's logits on the wire)."""
        row = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        tensor = self._library.InferInput("input_ids", list(row.shape), "INT64")
        tensor.set_data_from_numpy(row)
        try:
            result = self.client.infer(
                self.model,
                [tensor],
                outputs=[self._library.InferRequestedOutput(output)],
                sequence_id=int(sequence_id),
                sequence_start=start,
                sequence_end=end,
            )
        except Exception as error:  # tritonclient's InferenceServerException
            raise ServingError(f"sequence {sequence_id}: {error}") from error
        return result.as_numpy(output).reshape(-1)

    def stream(self, prompt, max_new_tokens: int, *, sequence_id: int, **sampling) -> Iterator[int]:
        """Yield each new token as soon as the server answers. Keywords: ``do_sample``,
        ``temperature``, ``top_k``, ``top_p``, ``seed`` (as for ``compiled.generate``)."""
        if max_new_tokens < 1:
            raise ServingError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        config = Sampling(**sampling)
        config.check()
        generator = None
        if config.do_sample:
            generator = torch.Generator()
            generator.manual_seed(config.seed if config.seed is not None else torch.seed() % 2**63)
        ids = np.asarray(prompt, dtype=np.int64).reshape(-1)
        # greedy: the server's choice alone; sampling: the logits, drawn from here
        output = "logits" if config.do_sample else "next_token"
        answer = self.infer(ids, sequence_id, start=True, end=max_new_tokens == 1, output=output)
        for produced in range(max_new_tokens):
            if config.do_sample:
                scores = torch.from_numpy(answer.copy())[None]
                token = int(choose(scores, config, generator)[0])
            else:
                token = int(answer[0])
            yield token
            if produced + 1 < max_new_tokens:
                last = produced + 2 == max_new_tokens
                answer = self.infer([token], sequence_id, end=last, output=output)

    def generate(self, prompt, max_new_tokens: int, *, sequence_id: int, **sampling) -> list[int]:
        """The new tokens of one sequence (``stream`` collected)."""
        return list(self.stream(prompt, max_new_tokens, sequence_id=sequence_id, **sampling))
