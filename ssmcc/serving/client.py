"""Stream a generation from an ssmcc model served by Triton Inference Server (``tritonclient``).

The prompt goes in one request that starts the sequence (``sequence_start``; in pieces of the
model's ``max_request_tokens`` where it is longer, the later pieces continuing the sequence), then
one request per new token; the last one ends it (``sequence_end``). Greedy asks for the server's
``next_token`` only (the argmax of the logits, computed there); sampling draws from ``logits``
with ``ssmcc``'s own sampler and a generator seeded per sequence, so a sequence's tokens are those
``compiled.generate(prompt, n, do_sample=True, seed=s, ...)`` gives for one prompt.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np
import torch

from ssmcc.errors import ServingError
from ssmcc.runtime.generation import Sampling, choose

PROTOCOLS = ("http", "grpc")
_UNREAD = object()
_CLIENT_NAMES = {"http": "an HTTP", "grpc": "a gRPC"}


def server_address(url: str, protocol: str = "http") -> tuple[str, bool]:
    """``(host:port, ssl)`` from what a user has: ``host:port`` as tritonclient takes it, or a URL
    as ``ssmcc serve`` prints it (``http://host:port``; ``https://`` for TLS over HTTP;
    ``grpc://host:port`` for gRPC). Anything else is a ``ServingError`` saying what is taken."""
    from urllib.parse import urlsplit

    if not isinstance(url, str) or not url.strip():
        raise ServingError(f"url must be 'host:port' or 'http://host:port', got {url!r}")
    url = url.strip()
    if "://" not in url:
        return url, False
    parts = urlsplit(url)
    schemes = {"http": ("http", "https"), "grpc": ("grpc",)}[protocol]
    if parts.scheme not in schemes:
        raise ServingError(
            f"url {url!r}: {_CLIENT_NAMES[protocol]} client takes "
            f"{' or '.join(s + '://' for s in schemes)}"
            f"host:port (or host:port alone), not {parts.scheme}://"
        )
    if not parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ServingError(
            f"url {url!r}: give the server's address only, e.g. {parts.scheme}://127.0.0.1:8000 "
            "(no path or query: the client adds the endpoints)"
        )
    return parts.netloc, parts.scheme == "https"


def token_row(ids, what: str = "input_ids") -> np.ndarray:
    """``ids`` (a sequence, array or tensor of shape (L,) or (1, L)) as an int64 row, or
    ``ServingError``: token ids are integers (a float is refused, never truncated)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    row = np.asarray(ids)
    if (row.ndim == 2 and row.shape[0] == 1) or row.ndim == 0:
        row = row.reshape(-1)
    if row.ndim != 1:
        raise ServingError(f"{what} must be one sequence's ids, (L,) or (1, L); got {row.shape}")
    if row.size == 0:
        raise ServingError(f"{what} holds no token: pass at least one token id")
    if row.dtype.kind not in "iu":
        raise ServingError(
            f"{what} must hold integer token ids, got dtype {row.dtype}: tokenize the text "
            "first, or convert ids stored as floats with .astype(np.int64) / .long()"
        )
    if row.dtype.kind == "u" and int(row.max()) > np.iinfo(np.int64).max:
        raise ServingError(f"{what} holds token id {int(row.max())}, beyond INT64")
    return row.astype(np.int64)


class Client:
    """``Client(url, model, protocol="http")``: ``url`` is the server's HTTP endpoint
    (``host:port``, or ``http://host:port`` as ``ssmcc serve`` prints it), or its gRPC one with
    ``protocol="grpc"``. One client per thread:
    tritonclient's HTTP client is not safe to share between threads (it deadlocks). ``close()``
    (or a ``with`` block) closes its connections."""

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
        address, ssl = server_address(url, protocol)
        self._library = library
        self.model = model
        if protocol == "http":
            self.client = library.InferenceServerClient(
                address, ssl=ssl, connection_timeout=timeout_s, network_timeout=timeout_s
            )
        else:
            self.client = library.InferenceServerClient(address)
        self.timeout_s = timeout_s
        self._max_request_tokens = _UNREAD

    def close(self) -> None:
        """Close the connections (a server waits up to 30 s for open ones when it stops)."""
        self.client.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def max_request_tokens(self) -> int | None:
        """The model's ``max_request_tokens`` parameter (read once from its config; None where
        it has none)."""
        if self._max_request_tokens is _UNREAD:
            self._max_request_tokens = None
            # gRPC: {"config": {...}} with as_json; HTTP: the config as JSON, no as_json
            as_json = {"as_json": True} if self._library.__name__.endswith("grpc") else {}
            try:
                config = self.client.get_model_config(self.model, **as_json)
            except Exception:  # no such model: the requests will say so
                return None
            value = config.get("config", config).get("parameters", {}).get("max_request_tokens")
            if value and int(value.get("string_value") or 0) > 0:
                self._max_request_tokens = int(value["string_value"])
        return self._max_request_tokens

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
        row = token_row(ids)[None]
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
        ``temperature``, ``top_k``, ``top_p``, ``seed`` (as for ``compiled.generate``). A stream
        closed early (a ``break`` out of the loop) or failed midway ends its sequence on the
        server with one more request, so that its state and batcher slot are freed now rather
        than after the idle timeout."""
        if max_new_tokens < 1:
            raise ServingError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        config = Sampling(**sampling)
        config.check()
        generator = None
        if config.do_sample:
            generator = torch.Generator()
            generator.manual_seed(config.seed if config.seed is not None else torch.seed() % 2**63)
        ids = token_row(prompt, "prompt")
        limit = self.max_request_tokens() or ids.size
        pieces = [ids[i : i + limit] for i in range(0, ids.size, limit)]
        # greedy: the server's choice alone; sampling: the logits, drawn from here
        output = "logits" if config.do_sample else "next_token"
        ended = False
        try:
            for i, piece in enumerate(pieces[:-1]):  # a long prompt: all but its last piece
                self.infer(piece, sequence_id, start=i == 0, output="next_token")
            ended = max_new_tokens == 1
            answer = self.infer(
                pieces[-1], sequence_id, start=len(pieces) == 1, end=ended, output=output
            )
            for produced in range(max_new_tokens):
                if config.do_sample:
                    scores = torch.from_numpy(answer.copy())[None]
                    token = int(choose(scores, config, generator)[0])
                else:
                    token = int(answer[0])
                yield token
                if produced + 1 < max_new_tokens:
                    ended = produced + 2 == max_new_tokens
                    answer = self.infer([token], sequence_id, end=ended, output=output)
        finally:
            if not ended:
                with contextlib.suppress(ServingError):
                    self.infer([0], sequence_id, end=True, output="next_token")

    def generate(self, prompt, max_new_tokens: int, *, sequence_id: int, **sampling) -> list[int]:
        """The new tokens of one sequence (``stream`` collected)."""
        return list(self.stream(prompt, max_new_tokens, sequence_id=sequence_id, **sampling))
