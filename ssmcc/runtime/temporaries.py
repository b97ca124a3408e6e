"""Temporary files and folders named for the process that made them, removed once it is gone.

A writer's tag is ``<host>-<pid>-<start>``: a hash of the host name, the process id and the
process's start time in clock ticks since boot (Linux ``/proc/<pid>/stat``; 0 where unknown). A
temporary is named ``<prefix><tag>-<rest>`` (``rest`` without ``-`` up to the tag's end, e.g.
``tempfile``'s or ``secrets.token_hex``'s characters). ``remove_stale(parent, prefix)`` removes
the entries of ``parent`` so named whose writer has exited: its pid is gone, or alive with another
start time (reused). Another host's entries, entries of live writers and names that are not
tagged are left alone. Artifact saves (``artifact.py``) and local servers
(``ssmcc.serving.server``) name their temporaries this way, so what a killed writer left behind
goes at the next save or start.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import socket


def host() -> str:
    """The first 8 hex digits of the SHA-256 of this machine's host name."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), or None when unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def writer_tag(pid: int | None = None) -> str:
    """``<host>-<pid>-<start>`` of ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{host()}-{pid}-{start_time(pid) or 0}"


def writer_gone(tag: str) -> bool:
    """Whether the writer a temporary's tag (``<host>-<pid>-<start>-...``) names has exited
    (False when unsure: another host's, not a tag, or this process)."""
    parts = tag.split("-")
    if len(parts) < 4 or parts[0] != host() or not parts[1].isdigit():
        return False
    pid, started = int(parts[1]), parts[2]
    if pid == os.getpid():
        return False
    now = start_time(pid)
    if now is not None:
        return now != started  # the pid is alive but was reused by another process
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def remove_stale(parent: str, prefix: str) -> list[str]:
    """Remove the entries ``<prefix><tag>-...`` of ``parent`` whose writer is gone (folders with
    what they hold); returns the removed paths."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(parent):
            if not entry.name.startswith(prefix) or not writer_gone(entry.name[len(prefix) :]):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
            removed.append(entry.path)
    return removed
