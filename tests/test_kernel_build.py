"""The C++ kernel build (``kernels/cpu/build.py``) on a small library of its own: sources compile
in parallel and link into one cached library; processes that need the same library at once build
it once (the others wait on its lock); a compiler error leaves no library and no temporary file,
and says what the compiler said."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from ssmcc.kernels.cpu import build

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="needs a C++ compiler"
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SOURCES = {
    "one.cpp": 'extern "C" __attribute__((visibility("default"))) int one() { return 1; }\n',
    "two.cpp": 'extern "C" __attribute__((visibility("default"))) int two() { return 2; }\n',
    "bad.cpp": "int broken( {\n",
}

# Loads build.py (the standard library only: no torch to import) and builds the small library
# (argv: build.py, source folder, sources...) once the file "go" beside the sources exists, then
# prints its path: processes started together build at the same moment.
_BUILD = """
import importlib.util, os, sys, time
spec = importlib.util.spec_from_file_location("build", sys.argv[1])
build = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build)
build.SOURCE_DIR, build.KERNEL_HEADERS = sys.argv[2], []
print("ready", flush=True)
while not os.path.exists(os.path.join(sys.argv[2], "go")):
    time.sleep(0.001)
print("built:", build._build("small", sys.argv[3:], []))
"""
BUILD_PY = os.path.join(REPO, "kernels", "cpu", "build.py")


@pytest.fixture
def sources(tmp_path, monkeypatch):
    folder = tmp_path / "src"
    folder.mkdir()
    for name, text in SOURCES.items():
        (folder / name).write_text(text)
    monkeypatch.setenv("SSMCC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("SSMCC_SANITIZE", raising=False)
    return folder


def _start(folder, *names):
    return subprocess.Popen(
        [sys.executable, "-c", _BUILD, BUILD_PY, str(folder), *names],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_processes_needing_one_library_build_it_once(sources, tmp_path):
    processes = [_start(sources, "one.cpp", "two.cpp") for _ in range(3)]
    for process in processes:
        assert process.stdout.readline() == "ready\n"
    (sources / "go").touch()
    results = [process.communicate(timeout=300) for process in processes]
    assert all(process.returncode == 0 for process in processes), results
    paths = {out.split("built:")[1].strip() for out, _ in results}
    assert len(paths) == 1
    (path,) = paths
    assert sum("building libsmall.so" in err for _, err in results) == 1, results
    import ctypes

    library = ctypes.CDLL(path)
    assert (library.one(), library.two()) == (1, 2)  # both sources linked in
    folder = os.path.dirname(path)
    assert sorted(os.listdir(folder)) == [".lock", "libsmall.so"]  # no objects, no temporaries


def test_a_compiler_error_leaves_nothing_and_is_said(sources, monkeypatch, capsys):
    monkeypatch.setattr(build, "SOURCE_DIR", str(sources))
    monkeypatch.setattr(build, "KERNEL_HEADERS", [])
    build._say_once.cache_clear()
    assert build._build("small", ["one.cpp", "bad.cpp"], []) is None
    err = capsys.readouterr().err
    assert "building libsmall.so failed; using the slower path" in err
    assert "bad.cpp" in err and "error" in err
    (folder,) = os.listdir(build.cache_dir())
    assert os.listdir(os.path.join(build.cache_dir(), folder)) == [".lock"]
