"""The artifact manifest's schema, checked field by field before anything in it is used.

``manifest.json`` describes a compiled model independently of its target::

    format          "ssmcc-artifact"           format_version   2
    target          a registered target name   model            the model's class name
    vocab_size      int >= 1 (a model that streams has one), or null for a plain module
    chunk_size      int >= 1                   static_length    int >= 1 or null
    streaming       bool                       streaming_refusal  null when streaming, else why
    ssmcc_ops       {op name: count}           versions         {package: version}
    states          [{name, kind, shape ["batch", int...], dtype, grows [axis...]}], names unique;
                    at least one when streaming
    graphs          {graph: {file, inputs, outputs, ...}}: prefill, chunk and step when streaming,
                    forward otherwise; each file one of ``files``
    files           {name: {bytes: int >= 0, sha256: 64 hex digits}}: every name a plain file
                    name inside the artifact directory (no folder, no "..", not absolute, not the
                    manifest itself)

    tokenizer       optional {files, class, eos_token_id}: the model's tokenizer, as its files
    input_dims      optional, a plain module's [{name, dims: [int or null]}] (the sizes its program
                    fixes; checked by ``runtime/input_dims.py``)

plus what the target's ``save`` adds (its ``load`` checks those). ``check_manifest`` raises an
``ArtifactError`` naming the first field that does not fit (``states[1].shape``, ...).
"""

from __future__ import annotations

import os
import re

from ssmcc.errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT = "ssmcc-artifact"
FORMAT_VERSION = 2
STATE_DTYPES = ("float32", "bfloat16", "float16", "float64", "int64")  # int64: a counter
STREAMING_GRAPHS = ("prefill", "chunk", "step")
_SHA256 = re.compile(r"[0-9a-f]{64}")


class _Fields:
    """Checks of one manifest, each failure naming the field and what it holds."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, expected: str, value) -> None:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        raise ArtifactError(f"{self.where}: {field} must be {expected}, got {shown}")

    def integer(self, field: str, value, minimum: int, nullable: bool = False) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            self.fail(field, f"an integer >= {minimum}" + (" or null" if nullable else ""), value)

    def of_type(self, field: str, value, kind: type, what: str) -> None:
        if not isinstance(value, kind):
            self.fail(field, what, value)


def is_plain_file_name(name) -> bool:
    """A name that can only mean a file directly inside the artifact directory."""
    return (
        isinstance(name, str)
        and name not in ("", ".", "..", MANIFEST)
        and "/" not in name
        and "\\" not in name
        and "\0" not in name
        and os.path.basename(name) == name
        and not os.path.isabs(name)
    )


def _check_files(fields: _Fields, files) -> None:
    fields.of_type("files", files, dict, "an object {file name: {bytes, sha256}}")
    for name, entry in files.items():
        if not is_plain_file_name(name):
            fields.fail(f"files[{name!r}]", "a plain file name inside the artifact directory", name)
        fields.of_type(f"files[{name!r}]", entry, dict, "an object {bytes, sha256}")
        fields.integer(f"files[{name!r}].bytes", entry.get("bytes"), 0)
        digest = entry.get("sha256")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            fields.fail(f"files[{name!r}].sha256", "64 lowercase hex digits", digest)


def _check_states(fields: _Fields, states) -> None:
    fields.of_type("states", states, list, "a list of state entries")
    seen = set()
    for i, entry in enumerate(states):
        field = f"states[{i}]"
        fields.of_type(field, entry, dict, "an object {name, kind, shape, dtype, grows}")
        for key in ("name", "kind"):
            fields.of_type(f"{field}.{key}", entry.get(key), str, "a string")
        if entry["name"] in seen:
            fields.fail(f"{field}.name", "unique among the states", entry["name"])
        seen.add(entry["name"])
        shape = entry.get("shape")
        if (
            not isinstance(shape, list)
            or not shape
            or shape[0] != "batch"
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape[1:])
        ):
            fields.fail(f"{field}.shape", '["batch", sizes >= 0 ...]', shape)
        if entry.get("dtype", "float32") not in STATE_DTYPES:
            fields.fail(f"{field}.dtype", f"one of {', '.join(STATE_DTYPES)}", entry.get("dtype"))
        grows = entry.get("grows", [])
        axes = range(len(shape) - 1)
        if not isinstance(grows, list) or not all(isinstance(a, int) and a in axes for a in grows):
            fields.fail(f"{field}.grows", f"a list of state axes in [0, {len(axes)})", grows)


def _check_graphs(fields: _Fields, graphs, files: dict, streaming: bool) -> None:
    fields.of_type("graphs", graphs, dict, "an object {graph name: entry}")
    needed = STREAMING_GRAPHS if streaming else ("forward",)
    missing = [g for g in needed if g not in graphs]
    if missing:
        what = "a streaming model's" if streaming else "a model's"
        fields.fail("graphs", f"{what} graphs {', '.join(needed)} (missing {missing})", graphs)
    for name, entry in graphs.items():
        fields.of_type(f"graphs[{name!r}]", entry, dict, "an object {file, inputs, outputs}")
        if entry.get("file") not in files:
            fields.fail(
                f"graphs[{name!r}].file", "one of the artifact's listed files", entry.get("file")
            )
        fields.of_type(f"graphs[{name!r}].inputs", entry.get("inputs"), list, "a list of inputs")


def check_manifest(manifest, where: str) -> dict:
    """``manifest`` if it fits the schema above, else ``ArtifactError`` naming the field."""
    fields = _Fields(where)
    fields.of_type("the manifest", manifest, dict, "a JSON object")
    if manifest.get("format") != FORMAT:
        fields.fail(
            "format", repr(FORMAT) + " (this is not an ssmcc manifest)", manifest.get("format")
        )
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{where} has format version {manifest.get('format_version')!r}; this ssmcc reads "
            f"version {FORMAT_VERSION}: compile the model again"
        )
    for key in ("target", "files", "graphs", "states", "streaming", "chunk_size", "vocab_size"):
        if key not in manifest:
            raise ArtifactError(f"{where} is incomplete: no {key!r} entry")
    fields.of_type("target", manifest["target"], str, "a target name")
    fields.of_type("streaming", manifest["streaming"], bool, "true or false")
    streaming = manifest["streaming"]
    refusal = manifest.get("streaming_refusal")
    if (streaming and refusal is not None) or (not streaming and not isinstance(refusal, str)):
        fields.fail("streaming_refusal", "null when streaming, else the reason", refusal)
    fields.integer("vocab_size", manifest["vocab_size"], 1, nullable=not streaming)
    fields.integer("chunk_size", manifest["chunk_size"], 1)
    fields.integer("static_length", manifest.get("static_length"), 1, nullable=True)
    _check_files(fields, manifest["files"])
    _check_states(fields, manifest["states"])
    if streaming and not manifest["states"]:
        fields.fail("states", "at least one state for a streaming model", manifest["states"])
    _check_graphs(fields, manifest["graphs"], manifest["files"], streaming)
    _check_tokenizer(fields, manifest.get("tokenizer"), manifest["files"])
    return manifest


def _check_tokenizer(fields: _Fields, entry, files: dict) -> None:
    if entry is None:
        return
    fields.of_type("tokenizer", entry, dict, "an object {files, class, eos_token_id} or null")
    names = entry.get("files")
    if not isinstance(names, list) or not names or not all(n in files for n in names):
        fields.fail("tokenizer.files", "a non-empty list of the artifact's listed files", names)
