"""JSON read from files ssmcc did not necessarily write, within limits checked before parsing.

``json.loads`` recurses once per nesting level: a manifest nested 100,000 deep raises
``RecursionError`` (a traceback, not an answer), and a file of gigabytes is read whole before a
field is looked at. ``loads_bounded(data, what)`` first checks the size (``max_bytes``) and the
nesting depth (``max_depth``, counted over brackets outside strings in one linear scan), then
parses; any failure is one ``ArtifactError`` naming ``what`` and the limit or the syntax error.
The limits are far above what ssmcc writes (a mamba2-2.7b manifest: ~0.3 MB, depth 6).
"""

from __future__ import annotations

import json
import re

from ssmcc.errors import ArtifactError

MAX_BYTES = 64 << 20
MAX_DEPTH = 64
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKETS = re.compile(r"[\[\]{}]")


def nesting_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` in JSON text, ignoring brackets inside strings."""
    depth = deepest = 0
    for bracket in _BRACKETS.findall(_STRING.sub("", text)):
        if bracket in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def _fast_depth(text: str, max_depth: int) -> bool:
    """Whether the text certainly nests no deeper than ``max_depth``: no more opening brackets
    than that in all (the common case, decided without stripping strings)."""
    return text.count("[") + text.count("{") <= max_depth


def loads_bounded(
    data: bytes | str,
    what: str,
    max_bytes: int = MAX_BYTES,
    max_depth: int = MAX_DEPTH,
    error: type[Exception] = ArtifactError,
):
    """``json.loads(data)`` after the size and depth checks above; ``error`` (an
    ``ArtifactError`` unless told) naming ``what`` otherwise."""
    if len(data) > max_bytes:
        raise error(
            f"{what} has {len(data):,} bytes, over the {max_bytes:,} ssmcc reads: it was not "
            "written by ssmcc or was changed"
        )
    try:
        text = bytes(data).decode("utf-8") if not isinstance(data, str) else data
    except UnicodeDecodeError as problem:
        raise error(f"{what} is not UTF-8 text: {problem}") from None
    if not _fast_depth(text, max_depth):
        depth = nesting_depth(text)
        if depth > max_depth:
            raise error(
                f"{what} nests {depth} levels deep, over the {max_depth} ssmcc reads: it was "
                "not written by ssmcc or was changed"
            )
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as problem:
        raise error(f"{what} is not valid JSON: {problem}") from None
