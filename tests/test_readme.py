"""Every command and Python snippet in README.md and docs/ runs as written, each document in a
fresh folder of its own, and those that write files (``--out``, ``.save(``) run a second time over
what the first run wrote: a document's blocks in order, each ``ssmcc ...`` line of a plain block
through the installed command, each ``python`` block as a script. Lines marked ``# needs ...``
(network, or what a networked line fetched) are exempt, and so is the test command itself."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCUMENTS = [README, *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.M | re.S)
COMMAND = re.compile(r"ssmcc (inspect|compile|run|presets|coverage)\b")  # not an output line
LINK = re.compile(r"\]\(([^)#:]+?\.(?:md|py))(?:#[^)]*)?\)")  # relative links to files
SITTING = re.compile(r"`(?:history/)?(\d{4}-\d\d-\d\d-[\w.-]+\.(?:md|json))`")  # a dated result
NAMED_FILE = re.compile(r"`((?:docs|benchmarks|examples)/[\w./-]+\.(?:md|py))`")  # from the root


def blocks(document: pathlib.Path = README) -> list[tuple[str, str]]:
    """(kind, text) of every runnable block: ("python", source) or ("ssmcc", one command)."""
    found = []
    for language, body in FENCE.findall(document.read_text()):
        if language == "python":
            found.append(("python", body))
        elif language == "":
            for line in body.splitlines():
                if COMMAND.match(line) and "# needs" not in line:
                    found.append(("ssmcc", line.split("  #")[0].strip()))
    return found


RUNNABLE = [document for document in DOCUMENTS if blocks(document)]


def test_the_documents_have_the_blocks_this_test_runs():
    readme = [kind for kind, _ in blocks()]
    assert readme.count("python") >= 1 and readme.count("ssmcc") >= 4
    every = [kind for document in DOCUMENTS for kind, _ in blocks(document)]
    assert every.count("python") >= 6 and every.count("ssmcc") >= 10


def test_the_readme_is_a_guide_not_a_notebook():
    """The front page stays short; the details live in docs/ and every link there resolves."""
    assert len(README.read_text().splitlines()) <= 200
    assert len((ROOT / "benchmarks" / "README.md").read_text().splitlines()) <= 150
    for document in [*DOCUMENTS, ROOT / "benchmarks" / "README.md"]:
        for target in LINK.findall(document.read_text()):
            path = (document.parent / target.split("#")[0]).resolve()
            assert path.exists(), f"{document.relative_to(ROOT)} links to missing {target}"
        for named in NAMED_FILE.findall(document.read_text()):
            assert (ROOT / named).exists(), f"{document.relative_to(ROOT)} names missing {named}"
        for sitting in SITTING.findall(document.read_text()):
            assert (ROOT / "benchmarks" / "history" / sitting).exists(), sitting


def test_the_benchmarks_latest_tables_are_generated_from_the_recorded_sittings():
    from benchmarks.latest import README as BENCHMARKS
    from benchmarks.latest import latest_section, rewrite

    text = BENCHMARKS.read_text()
    assert rewrite(text, latest_section()) == text, "stale: run python -m benchmarks.latest"


@pytest.mark.slow
@pytest.mark.parametrize("document", RUNNABLE, ids=lambda d: str(d.relative_to(ROOT)))
def test_every_command_and_snippet_runs_and_reruns_over_its_output(document, tmp_path):
    ssmcc = shutil.which("ssmcc") or pytest.fail("the ssmcc command is not installed")
    for attempt in (1, 2):
        for index, (kind, text) in enumerate(blocks(document)):
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
