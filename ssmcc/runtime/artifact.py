"""Artifact directories: model files plus ``manifest.json``, written atomically, verified on load.

Writing goes to a temporary sibling directory that is renamed into place only when every file and
the manifest are complete, so a failure leaves nothing half-written. An existing directory is
replaced only when ``overwrite`` is set. Loading checks that the manifest parses and that every
file it lists exists with the recorded size and SHA-256; any mismatch names the file.

The manifest is the target-independent description of a compiled model (target, model, vocab
size, states, whether it streams, versions) plus what the target's ``save`` recorded (its graphs).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable

from ssmcc.errors import ArtifactError

MANIFEST = "manifest.json"
FORMAT = "ssmcc-artifact"
FORMAT_VERSION = 2


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_artifact(
    out_dir: str,
    write_files: Callable[[str], dict | None],
    manifest: dict,
    overwrite: bool = False,
) -> dict:
    """Create ``out_dir`` holding what ``write_files(tmp)`` writes plus the manifest (``manifest``
    updated with the entries ``write_files`` returns); returns the manifest written."""
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not overwrite:
        raise ArtifactError(
            f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it"
        )
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.tmp-", dir=parent)
    try:
        entries = write_files(tmp) or {}
        files = {}
        for name in sorted(os.listdir(tmp)):
            path = os.path.join(tmp, name)
            files[name] = {"bytes": os.path.getsize(path), "sha256": sha256_of(path)}
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            **manifest,
            **entries,
            "files": files,
        }
        with open(os.path.join(tmp, MANIFEST), "w") as f:
            json.dump(manifest, f, indent=2)
        if os.path.exists(out_dir):
            old = tempfile.mkdtemp(prefix=f".{os.path.basename(out_dir)}.old-", dir=parent)
            os.rename(out_dir, os.path.join(old, "previous"))
            os.rename(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def artifact_file(artifact_dir: str, name) -> str:
    """The path of the file ``name`` of an artifact: a plain name inside the directory (no
    folder, no ``..``, not absolute), else ``ArtifactError`` naming it."""
    if (
        not isinstance(name, str)
        or not name
        or name in (".", "..")
        or os.path.basename(name) != name
        or "/" in name
        or "\\" in name
    ):
        raise ArtifactError(
            f"{os.path.join(artifact_dir, MANIFEST)} names the file {name!r}, which is not a "
            "plain file name inside the artifact directory"
        )
    return os.path.join(artifact_dir, name)


def read_manifest(artifact_dir: str, verify_hashes: bool = True) -> dict:
    """The manifest of ``artifact_dir``, after checking every listed file."""
    path = os.path.join(artifact_dir, MANIFEST)
    if not os.path.isdir(artifact_dir):
        raise ArtifactError(f"{artifact_dir} is not a directory (expected an ssmcc artifact)")
    if not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing: {artifact_dir} is not an ssmcc artifact")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"{path} is corrupt (not valid JSON: {error})") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArtifactError(f"{path} is not an ssmcc manifest (no 'format': '{FORMAT}')")
    if manifest.get("format_version") != FORMAT_VERSION:
        raise ArtifactError(
            f"{path} has format version {manifest.get('format_version')!r}; this ssmcc reads "
            f"version {FORMAT_VERSION}: compile the model again"
        )
    for key in ("target", "files", "graphs"):
        if key not in manifest:
            raise ArtifactError(f"{path} is incomplete: no '{key}' entry")
    for name, entry in manifest["files"].items():
        file_path = artifact_file(artifact_dir, name)
        if not os.path.isfile(file_path):
            raise ArtifactError(f"{file_path} is missing (listed in {MANIFEST})")
        if os.path.getsize(file_path) != entry["bytes"]:
            raise ArtifactError(
                f"{file_path} has {os.path.getsize(file_path)} bytes, the manifest says "
                f"{entry['bytes']}: the file is truncated or was changed"
            )
        if verify_hashes and sha256_of(file_path) != entry["sha256"]:
            raise ArtifactError(
                f"{file_path} does not match its SHA-256 in {MANIFEST}: the file "
                "is corrupt or was changed"
            )
    for graph, entry in manifest["graphs"].items():
        if entry.get("file") not in manifest["files"]:
            raise ArtifactError(
                f"{path}: graph {graph!r} names {entry.get('file')!r}, which is not among the "
                "artifact's listed files"
            )
        artifact_file(artifact_dir, entry["file"])
    return manifest
