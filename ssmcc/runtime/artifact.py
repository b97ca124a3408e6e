"""Artifact directories: model files plus ``manifest.json``, written atomically, verified on load.

Writing: every file and the manifest go to a temporary sibling ``.<name>.tmp-<writer>-<random>``
(``<writer>`` = host, process id and process start time), which then takes the destination's
place in one atomic exchange (``renameat2(RENAME_EXCHANGE)`` where the system has it; else two
renames). A failure or a kill therefore never leaves a half-written artifact at the destination,
and what it leaves beside it is removed by the next save to the same place once its writer is gone
(a concurrent save's directory is never touched). ``overwrite=True`` replaces only a directory
that holds exactly an intact ssmcc artifact: its manifest, which fits the schema, and the files
it lists, each of the recorded size and SHA-256. Anything else at the destination (a user's file
beside the manifest, a missing or changed file, a directory that is not an artifact) is left
untouched and named in the error.

Reading: the manifest is parsed within size and depth limits (``bounded_json``) and checked
against its schema (``manifest.py``); ``read_artifact`` then reads every file it lists into memory
the file cannot change, checking each one's type, size and SHA-256 as it is read
(``ssmcc.artifact_files``). Any mismatch names the file or the field.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import secrets
import shutil
from collections.abc import Callable

from ssmcc.artifact_files import VerifiedFiles, sha256_of
from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError
from ssmcc.runtime.manifest import FORMAT, FORMAT_VERSION, MANIFEST, check_manifest
from ssmcc.runtime.temporaries import remove_stale, writer_tag


# -- what killed saves left ----------------------------------------------------------------
def _temporary_prefix(out_dir: str) -> str:
    return f".{os.path.basename(out_dir)}.tmp-"


def remove_stale_temporaries(out_dir: str) -> list[str]:
    """Remove what killed saves to ``out_dir`` left beside it; returns the removed paths."""
    return remove_stale(os.path.dirname(out_dir), _temporary_prefix(out_dir))


# -- writing --------------------------------------------------------------------------------
def is_artifact(path: str) -> bool:
    """A directory (not a symlink) whose manifest says it is an ssmcc artifact, of any format
    version (what ``intact_artifact_problem`` then checks in full)."""
    if os.path.islink(path) or not os.path.isdir(path):
        return False
    try:
        with open(os.path.join(path, MANIFEST), "rb") as f:
            manifest = loads_bounded(f.read(), MANIFEST)
    except (OSError, ArtifactError):
        return False
    return isinstance(manifest, dict) and manifest.get("format") == FORMAT


def intact_artifact_problem(path: str) -> str | None:
    """Why the directory ``path`` is not exactly an intact artifact (None when it is): files
    beside the ones its manifest lists, or a listed file missing, of another size or hash."""
    try:
        manifest = read_manifest(path)
    except ArtifactError as error:
        return str(error)
    present = set(os.listdir(path)) - {MANIFEST}
    extra = sorted(present - set(manifest["files"]))
    if extra:
        shown = ", ".join(extra[:5]) + (f" and {len(extra) - 5} more" if len(extra) > 5 else "")
        return f"it holds files its manifest does not list ({shown})"
    for name, entry in manifest["files"].items():
        file = os.path.join(path, name)
        if not os.path.isfile(file) or os.path.islink(file):
            return f"{name}, listed in its manifest, is missing or not a regular file"
        if os.path.getsize(file) != entry["bytes"] or sha256_of(file) != entry["sha256"]:
            return f"{name} differs from what its manifest records (size or SHA-256)"
    return None


def _exchange(a: str, b: str) -> bool:
    """Atomically swap two paths (Linux ``renameat2``); False where the system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except AttributeError:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
        return False
    raise OSError(code, os.strerror(code), b)


def _replace(tmp: str, out_dir: str) -> None:
    """Put ``tmp`` at ``out_dir``; an existing artifact there ends up in a stale temporary."""
    if not os.path.lexists(out_dir):
        os.rename(tmp, out_dir)
        return
    if not _exchange(tmp, out_dir):
        parked = tmp + "-previous"
        os.rename(out_dir, parked)
        os.rename(tmp, out_dir)
        tmp = parked
    shutil.rmtree(tmp, ignore_errors=True)


def _check_destination(out_dir: str, overwrite: bool) -> None:
    if not os.path.lexists(out_dir):
        return
    if not overwrite:
        raise ArtifactError(
            f"{out_dir} already exists; pass overwrite=True (--overwrite) to replace it"
        )
    if not is_artifact(out_dir):
        kind = "a file" if not os.path.isdir(out_dir) or os.path.islink(out_dir) else "a directory"
        raise ArtifactError(
            f"{out_dir} is {kind} that is not an ssmcc artifact (no {MANIFEST} of format "
            f"{FORMAT!r}); overwrite=True replaces only ssmcc artifacts, so nothing was deleted. "
            "Choose another path, or remove it yourself"
        )
    problem = intact_artifact_problem(out_dir)
    if problem is not None:
        raise ArtifactError(
            f"{out_dir} is not an intact ssmcc artifact: {problem}. overwrite=True replaces "
            "only a directory holding exactly the files its manifest lists, so nothing was "
            "deleted: move those files away, or choose another path"
        )


def write_artifact(
    out_dir: str,
    write_files: Callable[[str], dict | None],
    manifest: dict,
    overwrite: bool = False,
) -> dict:
    """Create ``out_dir`` holding what ``write_files(tmp)`` writes plus the manifest (``manifest``
    updated with the entries ``write_files`` returns); returns the manifest written."""
    out_dir = os.path.abspath(out_dir)
    _check_destination(out_dir, overwrite)
    parent = os.path.dirname(out_dir)
    os.makedirs(parent, exist_ok=True)
    remove_stale_temporaries(out_dir)
    tmp = os.path.join(
        parent, f"{_temporary_prefix(out_dir)}{writer_tag()}-{secrets.token_hex(4)}"
    )
    os.mkdir(tmp, 0o700)
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
            f.flush()
            os.fsync(f.fileno())
        _check_destination(out_dir, overwrite)  # still true after the (long) write
        _replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


# -- reading --------------------------------------------------------------------------------
def read_manifest(artifact_dir: str) -> dict:
    """The manifest of ``artifact_dir``, after the size, depth and schema checks."""
    path = os.path.join(artifact_dir, MANIFEST)
    if not os.path.isdir(artifact_dir):
        raise ArtifactError(f"{artifact_dir} is not a directory (expected an ssmcc artifact)")
    if os.path.islink(path) or not os.path.isfile(path):
        raise ArtifactError(f"{path} is missing: {artifact_dir} is not an ssmcc artifact")
    with open(path, "rb") as f:
        data = f.read()
    try:
        manifest = loads_bounded(data, path)
    except ArtifactError as error:
        problem = str(error).removeprefix(path).strip()
        raise ArtifactError(f"{path} is corrupt: it {problem}") from None
    return check_manifest(manifest, path)


def read_artifact(artifact_dir: str, verify_hashes: bool = True) -> tuple[dict, VerifiedFiles]:
    """The manifest of ``artifact_dir`` and every file it lists, read into memory and checked
    (``ssmcc.artifact_files``: what the target loads from, never the directory again)."""
    manifest = read_manifest(artifact_dir)
    files = VerifiedFiles.read(
        artifact_dir,
        manifest["files"],
        verify=verify_hashes,
        listed_in=os.path.join(artifact_dir, MANIFEST),
    )
    return manifest, files
