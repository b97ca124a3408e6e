"""Source trees of the GPU check's anchors for the tests: mamba_ssm's Triton kernels and fla.

A tree named in the environment (``SSMCC_MAMBA_SSM_SRC``, ``SSMCC_FLA_SRC``) is used as it is;
otherwise the files are extracted (``git archive``) from a bare mirror of the repository under
``SSMCC_ANCHOR_MIRRORS`` (default ``/work/.mirror``: ``<owner>+<name>/repo``). None where neither
exists: the tests then check the "skipped" path instead.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile

TREES = {
    "SSMCC_MAMBA_SSM_SRC": ("state-spaces+mamba", ("mamba_ssm/ops/triton", "mamba_ssm/utils")),
    "SSMCC_FLA_SRC": ("fla-org+flash-linear-attention", ("fla",)),
}


def anchor_tree(variable: str, folder) -> str | None:
    """The tree for ``variable`` (a key of ``TREES``), extracted into ``folder`` if need be."""
    if os.environ.get(variable):
        return os.environ[variable]
    mirror, paths = TREES[variable]
    repo = os.path.join(os.environ.get("SSMCC_ANCHOR_MIRRORS", "/work/.mirror"), mirror, "repo")
    if not os.path.isdir(repo):
        return None
    archive = subprocess.run(
        ["git", "-C", repo, "archive", "HEAD", *paths], capture_output=True, check=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")
    return str(folder)
