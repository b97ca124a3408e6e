"""What ``load`` lets ``torch.export.load`` read: a program archive that holds no pickle.

``torch.export.load`` unpickles (``torch.load(weights_only=False)``, ``pickle.loads``) the
payloads an archive marks as pickled, legacy ``.pt`` weight files, custom objects, and sample
inputs it cannot read otherwise: a crafted ``.pt2`` could run code while loading. ssmcc's own
programs are saved without weights (they live in ``weights.safetensors``), without custom objects
and without sample inputs, so ``check_archive`` refuses any archive that holds one of those
before torch reads it. The graph itself is JSON; the IR verifier checks its ops after loading.
"""

from __future__ import annotations

import json
import zipfile

from torch.export.pt2_archive.constants import (
    TENSOR_CONSTANT_FILENAME_PREFIX,
    WEIGHT_FILENAME_PREFIX,
)

from ssmcc.errors import ArtifactError

_RAW_TENSOR_PREFIXES = (WEIGHT_FILENAME_PREFIX, TENSOR_CONSTANT_FILENAME_PREFIX)


def _configs(archive: zipfile.ZipFile, names: list[str], suffix: str) -> list[tuple[str, dict]]:
    found = []
    for name in names:
        if name.endswith(suffix):
            try:
                found.append((name, json.loads(archive.read(name)).get("config", {})))
            except (ValueError, AttributeError) as error:
                raise ArtifactError(f"{name} in the archive is not valid JSON: {error}") from error
    return found


def check_archive(path: str) -> None:
    """``ArtifactError`` unless ``path`` is a zip whose payloads are all raw tensor data."""
    try:
        archive = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as error:
        raise ArtifactError(f"{path} is not a torch.export archive: {error}") from error
    with archive:
        names = archive.namelist()
        refused = [
            name
            for name in names
            if (name.endswith(".pt") and "/data/sample_inputs/" not in name)
            or ("/data/sample_inputs/" in name and archive.getinfo(name).file_size > 0)
        ]
        for config_name, config in [
            *_configs(archive, names, "model_weights_config.json"),
            *_configs(archive, names, "model_constants_config.json"),
        ]:
            for key, payload in config.items():
                pickled = payload.get("use_pickle", False)
                tensor = str(payload.get("path_name", "")).startswith(_RAW_TENSOR_PREFIXES)
                if pickled or not tensor:
                    refused.append(f"{config_name}: {key}")
    if refused:
        listed = ", ".join(refused[:3]) + (" ..." if len(refused) > 3 else "")
        raise ArtifactError(
            f"{path} holds pickled payloads ({listed}), which loading would execute; ssmcc "
            "writes none, so this archive was not written by ssmcc or was changed"
        )
