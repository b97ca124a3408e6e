"""mypy, at its default strictness, finds no error in ``ssmcc.ops``, ``ssmcc.passes``,
``ssmcc.lowering.registry`` and ``ssmcc.runtime`` (pyproject.toml's ``[tool.mypy]``: the rest of
the package is read for its types, its own errors ignored).

Why a shadow tree: pyproject.toml installs the top-level ``passes/``, ``lowering/`` and
``kernels/`` as ``ssmcc.passes``, ``ssmcc.lowering`` and ``ssmcc.kernels`` (setuptools
``package-dir``), and the editable install finds them through an import hook; mypy follows
neither. So the test lays out, in a temporary folder, an ``ssmcc/`` whose entries are links to
the repository's ``ssmcc/`` entries plus ``passes``, ``lowering`` and ``kernels`` linked to the
top-level folders, and runs mypy there. Its cache is kept in the system's temporary folder (a
cold run reads torch's annotations: about 35 s on 2 cores; a warm one a few seconds).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = ("passes", "lowering", "kernels")  # top-level folders installed as ssmcc.<name>
TARGETS = ("ssmcc/ops", "ssmcc/passes", "ssmcc/lowering/registry.py", "ssmcc/runtime")
CACHE = Path(tempfile.gettempdir()) / "ssmcc-mypy-cache"


def shadow_tree(where: Path) -> Path:
    """``where``/ssmcc laid out as the installed package, of links into the repository."""
    package = where / "ssmcc"
    package.mkdir(parents=True)
    for entry in (ROOT / "ssmcc").iterdir():
        if entry.name != "__pycache__":
            (package / entry.name).symlink_to(entry)
    for name in MAPPED:
        (package / name).symlink_to(ROOT / name)
    return where


@pytest.mark.slow
def test_mypy_finds_no_error(tmp_path):
    tree = shadow_tree(tmp_path / "tree")
    options = ["--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(CACHE)]
    result = subprocess.run(
        [sys.executable, "-m", "mypy", *options, *TARGETS],
        cwd=tree,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"
