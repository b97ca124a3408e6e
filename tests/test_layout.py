"""Packaging: passes/, lowering/, kernels/ import as ssmcc.* and never under bare names."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import ssmcc.kernels
import ssmcc.lowering
import ssmcc.passes

REPO = pathlib.Path(__file__).resolve().parent.parent


def test_subpackages_map_to_top_level_folders():
    for module, folder in (
        (ssmcc.passes, "passes"),
        (ssmcc.lowering, "lowering"),
        (ssmcc.kernels, "kernels"),
    ):
        assert pathlib.Path(module.__file__).resolve().parent == REPO / folder


def test_nothing_installed_under_bare_names(tmp_path):
    """From a neutral directory (no repository on sys.path) only ssmcc.* resolves."""
    probe = (
        "import importlib.util as u; "
        "print([b for b in ('passes', 'lowering', 'kernels') "
        f"if (s := u.find_spec(b)) and s.origin and s.origin.startswith({str(REPO)!r})])"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
