"""What ``load`` lets ``torch.export.load`` read: exactly the entries ssmcc's programs hold.

``torch.export.load`` does more than read a graph. It unpickles the payloads an archive marks as
pickled (weights, constants, custom objects, sample inputs), and an archive holding AOTInductor
entries (``data/aotinductor/model/*.so`` with its metadata) goes to AOTInductor's package loader,
which ``dlopen``s the library: its constructor runs while the archive is being opened. A crafted
``.pt2`` could therefore run code at load.

ssmcc's programs are saved without weights (they live in ``weights.safetensors``), custom objects,
sample inputs or compiled code, so ``check_archive`` admits an allow-list, not a deny-list: one
top-level folder holding only

    archive_format  archive_version  byteorder  .data/version  .data/serialization_id
    models/model.json                                  the graph (JSON)
    data/weights/model_weights_config.json             which raw tensor is which weight
    data/constants/model_constants_config.json         ... and constant
    data/weights/weight_<n>  data/constants/tensor_<n> raw tensor bytes (ssmcc's are empty)
    data/sample_inputs/model.pt                        only empty (torch writes it)
    extra/<name>                                       ssmcc's own data files (``EXTRA_FILES``)

every entry stored uncompressed (no decompression bomb), every JSON entry within the size and
depth limits of ``bounded_json`` (torch parses them recursively), and every weight or constant
described as raw tensor data, not a pickle. Anything else is refused, naming the entry, before
torch sees a byte. The graph itself is then checked op by op by the IR verifier after loading.
"""

from __future__ import annotations

import io
import re
import zipfile

from ssmcc.bounded_json import loads_bounded
from ssmcc.errors import ArtifactError

EXTRA_FILES = ("ssmcc_states.json",)  # what ssmcc itself stores in a program's archive
_FIXED = {
    "archive_format",
    "archive_version",
    "byteorder",
    ".data/version",
    ".data/serialization_id",
    "models/model.json",
    "data/weights/model_weights_config.json",
    "data/constants/model_constants_config.json",
    *(f"extra/{name}" for name in EXTRA_FILES),
}
_RAW_TENSOR = re.compile(r"data/(weights/weight|constants/tensor)_[0-9]+")
_SAMPLE_INPUTS = "data/sample_inputs/model.pt"
_ROOT = re.compile(r"[A-Za-z0-9_.-]+")


def _refusal(root: str | None, info: zipfile.ZipInfo) -> str | None:
    """Why the entry is not one ssmcc writes, or None."""
    first, _, rest = info.filename.partition("/")
    if root is None or first != root or not rest:
        return "outside the archive's one top-level folder"
    if info.compress_type != zipfile.ZIP_STORED:
        return "compressed (torch stores every entry as it is)"
    if rest == _SAMPLE_INPUTS:
        return None if info.file_size == 0 else "sample inputs (a pickle)"
    if rest in _FIXED or _RAW_TENSOR.fullmatch(rest):
        return None
    if rest.startswith("data/aotinductor/"):
        return "AOTInductor compiled code (loading would run it)"
    if rest.endswith((".so", ".dll", ".dylib", ".pyd")):
        return "a shared library"
    if rest.endswith((".pt", ".pkl", ".pickle")) or "custom_obj" in rest or "opaque_obj" in rest:
        return "a pickled payload (loading would execute it)"
    return "not an entry ssmcc writes"


def _check_tensor_configs(contents: dict[str, bytes], root: str, where: str) -> list[str]:
    refused = []
    for kind, prefix in (("weights", "weight_"), ("constants", "tensor_")):
        name = f"{root}/data/{kind}/model_{kind}_config.json"
        if name not in contents:
            continue
        config = loads_bounded(contents[name], f"{where}: {name}")
        entries = config.get("config", {}) if isinstance(config, dict) else None
        if not isinstance(entries, dict):
            refused.append(f"{name} (not a {kind} table)")
            continue
        for key, payload in entries.items():
            raw = (
                isinstance(payload, dict)
                and not payload.get("use_pickle", False)
                and str(payload.get("path_name", "")).startswith(prefix)
            )
            if not raw:
                refused.append(f"{name}: {key} (a pickled or non-tensor payload)")
    return refused


def _entries(data: bytes, where: str) -> tuple[list[zipfile.ZipInfo], dict[str, bytes]]:
    """The archive's entries and the content of each, read (CRC-checked) once; an archive
    that is not a readable zip is one ``ArtifactError``."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            infos = archive.infolist()
            return infos, {info.filename: archive.read(info) for info in infos}
    except (OSError, EOFError, zipfile.BadZipFile, ValueError, NotImplementedError) as error:
        raise ArtifactError(f"{where} is not a readable torch.export archive: {error}") from None


def check_archive(data: bytes | memoryview, where: str) -> None:
    """``ArtifactError`` unless ``data`` is a zip holding only what ssmcc's programs hold (see
    the module doc); ``where`` names the archive in messages."""
    infos, contents = _entries(bytes(data), where)
    if not infos:
        raise ArtifactError(f"{where} is an empty archive, not a torch.export program")
    if len(contents) != len(infos):
        raise ArtifactError(f"{where} holds two entries of one name: it was not written by torch")
    root = infos[0].filename.partition("/")[0]
    root = root if _ROOT.fullmatch(root) and root not in (".", "..") else None
    refused = [f"{info.filename} ({why})" for info in infos if (why := _refusal(root, info))]
    if not refused:
        for name, content in contents.items():
            if name.endswith(".json"):
                loads_bounded(content, f"{where}: {name}")
        refused = _check_tensor_configs(contents, root, where)
    if refused:
        more = f"; and {len(refused) - 3} more" if len(refused) > 3 else ""
        listed = "; ".join(refused[:3]) + more
        raise ArtifactError(
            f"{where} holds entries ssmcc never writes, refused before torch read it: {listed}. "
            "This archive was not written by ssmcc or was changed"
        )
