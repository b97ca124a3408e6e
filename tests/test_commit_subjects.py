"""Commit subjects are one line of at most 72 characters (the project's standard), for every
commit after 88670a9 (where the rule began to be checked). Four commits landed over it before
this check existed; they are named here and cannot be rewritten, any other fails."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
SINCE = "88670a9cde505cdf284702d0e8d3b96f242fa42d"
LIMIT = 72
LANDED_BEFORE_THE_CHECK = {"5e1b4eb", "6261ad1", "a55731e", "564f47e"}


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True)


def test_commit_subjects_fit_72_characters():
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: no history to check")
    if _git("cat-file", "-e", f"{SINCE}^{{commit}}").returncode != 0:
        pytest.skip(f"history before {SINCE[:7]} is not in this clone (shallow)")
    log = _git("log", "--format=%h%x00%s", f"{SINCE}..HEAD")
    assert log.returncode == 0, log.stderr
    too_long = []
    for line in log.stdout.splitlines():
        short, subject = line.split("\0", 1)
        if len(subject) > LIMIT and not any(short.startswith(h) for h in LANDED_BEFORE_THE_CHECK):
            too_long.append(f"{short} ({len(subject)} characters): {subject}")
    assert not too_long, (
        f"commit subjects over {LIMIT} characters (one line; details go in the body):\n"
        + "\n".join(too_long)
    )
