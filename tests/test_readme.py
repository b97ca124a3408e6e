"""Every command and Python snippet in README.md runs as written in a fresh folder, and those
that write files (``--out``, ``.save(``) run a second time over what the first run wrote: the
blocks in document order, each ``ssmcc ...`` line of a plain block through the installed command,
each ``python`` block as a script. Lines marked ``# needs ...`` (network, or
what a networked line fetched) are exempt, and so is the test command itself."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
COMMAND = re.compile(r"ssmcc (inspect|compile|run|presets|coverage)\b")  # not an output line


def blocks() -> list[tuple[str, str]]:
    """(kind, text) of every runnable block: ("python", source) or ("ssmcc", one command)."""
    found = []
    for language, body in FENCE.findall(README.read_text()):
        if language == "python":
            found.append(("python", body))
        elif language == "":
            for line in body.splitlines():
                if COMMAND.match(line) and "# needs" not in line:
                    found.append(("ssmcc", line.split("  #")[0].strip()))
    return found


def test_the_readme_has_the_blocks_this_test_runs():
    kinds = [kind for kind, _ in blocks()]
    assert kinds.count("python") >= 3 and kinds.count("ssmcc") >= 4


@pytest.mark.slow
def test_every_readme_command_and_snippet_runs_and_reruns_over_its_output(tmp_path):
    ssmcc = shutil.which("ssmcc") or pytest.fail("the ssmcc command is not installed")
    for attempt in (1, 2):
        for index, (kind, text) in enumerate(blocks()):
            if attempt == 2 and not _writes(text):
                continue
            if kind == "python":
                script = tmp_path / f"snippet_{index}.py"
                script.write_text(text)
                command = [sys.executable, str(script)]
            else:
                command = [ssmcc, *_split(text)]
            done = subprocess.run(
                command, cwd=tmp_path, capture_output=True, text=True, timeout=900
            )
            assert done.returncode == 0, f"run {attempt}, {text[:200]!r}:\n{done.stderr[-3000:]}"
            assert "Traceback" not in done.stderr, text


def _writes(text: str) -> bool:
    return "--out" in text or ".save(" in text


def _split(command: str) -> list[str]:
    import shlex

    return shlex.split(command)[1:]
