"""An artifact's files as a target reads them: verified once, then immune to changes on disk.

A loaded model must compute with the bytes whose SHA-256 its manifest lists, whatever happens to
the files afterwards. Reading the directory again (a session opened on first use) sees later
edits, and a memory map does not help: a private mapping (``mmap.ACCESS_COPY``,
``np.memmap(mode="r")``) still shows writes to the pages it has not copied, and its process dies
of SIGBUS when the file is truncated under it.

``VerifiedFiles.read(folder, listed)`` therefore opens each listed file once (``O_NOFOLLOW``: a
symbolic link is refused; the type and size checks and the read are on that one descriptor, so a
swap between check and read changes nothing), checks that it is a regular file of the recorded
size, and copies it into anonymous memory in 1 MiB blocks, hashing each block as it is copied.
The hash compared with the manifest is the hash of exactly the bytes the runtime then uses, and
nothing reads the directory again. The cost: the files are resident once in this process (a
130M-parameter fp32 model: 0.5 GB) and read in full at load, where a shared file mapping read
pages on first use and shared them between processes.

``FolderFiles(folder)`` is the same interface over a private working directory that this process
wrote while compiling (``mkdtemp``, mode 0700): read on demand.

Both give a file's bytes as a read-only ``memoryview`` (``data``), a read-only uint8 array
(``array``: what ONNX Runtime sessions take their weights from), a writable buffer private to
this process (``buffer``: what ``torch.frombuffer`` views), or a copy written elsewhere
(``copy_to``: saving a loaded model writes the verified bytes, not the directory's).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import shutil
import stat

import numpy as np

from ssmcc.errors import ArtifactError

BLOCK = 1 << 20


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(BLOCK), b""):
            digest.update(block)
    return digest.hexdigest()


def _open_regular(path: str, listed_in: str) -> int:
    """A read-only descriptor of the regular file ``path`` (never through a symbolic link)."""
    flags = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ArtifactError(f"{path} is missing (listed in {listed_in})") from None
    except OSError as error:
        if os.path.islink(path):
            raise ArtifactError(
                f"{path} is a symbolic link: an artifact's files must be regular files inside "
                "its directory"
            ) from None
        raise ArtifactError(f"{path} cannot be read: {error.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ArtifactError(
            f"{path} is not a regular file: an artifact's files must be regular files inside "
            "its directory"
        )
    return fd


def _read_verified(path: str, size: int, sha256: str | None, listed_in: str):
    """``path``'s ``size`` bytes copied into anonymous memory, hashed as they are copied."""
    fd = _open_regular(path, listed_in)
    with os.fdopen(fd, "rb", buffering=0) as f:
        actual = os.fstat(f.fileno()).st_size
        if actual != size:
            raise ArtifactError(
                f"{path} has {actual} bytes, {listed_in} says {size}: the file is truncated or "
                "was changed"
            )
        memory = mmap.mmap(-1, size) if size else bytearray()
        view = memoryview(memory)
        digest = hashlib.sha256()
        done = 0
        while done < size:
            count = f.readinto(view[done : done + BLOCK])
            if not count:
                raise ArtifactError(
                    f"{path} became shorter while it was read: the file is being changed"
                )
            digest.update(view[done : done + count])
            done += count
        view.release()
    if sha256 is not None and digest.hexdigest() != sha256:
        raise ArtifactError(
            f"{path} does not match its SHA-256 in {listed_in}: the file is corrupt or was "
            "changed"
        )
    return memory


class ArtifactFiles:
    """The files of one model, by name (see the module doc); ``where(name)`` names one in
    messages."""

    folder: str

    def names(self) -> list[str]:
        raise NotImplementedError

    def has(self, name: str) -> bool:
        return name in self.names()

    def where(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def data(self, name: str) -> memoryview:
        raise NotImplementedError

    def array(self, name: str) -> np.ndarray:
        raise NotImplementedError

    def buffer(self, name: str):
        raise NotImplementedError

    def copy_to(self, name: str, path: str) -> None:
        raise NotImplementedError

    def _known(self, name: str) -> None:
        if not self.has(name):
            raise ArtifactError(f"{self.where(name)} is not one of the model's files")


class VerifiedFiles(ArtifactFiles):
    """Every file a manifest lists, copied into memory and checked (``read``)."""

    def __init__(self, folder: str, memory: dict):
        self.folder = folder
        self._memory = memory

    @classmethod
    def read(
        cls, folder: str, listed: dict[str, dict], verify: bool = True, listed_in: str = ""
    ) -> VerifiedFiles:
        """``listed``: {name: {"bytes", "sha256"}}, as the manifest's ``files``; ``verify``
        False skips the hash (the size is always checked)."""
        listed_in = listed_in or os.path.join(folder, "manifest.json")
        memory = {
            name: _read_verified(
                os.path.join(folder, name),
                entry["bytes"],
                entry["sha256"] if verify else None,
                listed_in,
            )
            for name, entry in listed.items()
        }
        return cls(folder, memory)

    def names(self) -> list[str]:
        return list(self._memory)

    def data(self, name: str) -> memoryview:
        self._known(name)
        return memoryview(self._memory[name]).toreadonly()

    def array(self, name: str) -> np.ndarray:
        self._known(name)
        array = np.frombuffer(self._memory[name], dtype=np.uint8)
        array.flags.writeable = False
        return array

    def buffer(self, name: str):
        self._known(name)
        return self._memory[name]

    def copy_to(self, name: str, path: str) -> None:
        with open(path, "wb") as f:
            f.write(self.data(name))


class FolderFiles(ArtifactFiles):
    """The files of a private working directory this process wrote, read when asked."""

    def __init__(self, folder: str):
        self.folder = folder

    def names(self) -> list[str]:
        return sorted(os.listdir(self.folder))

    def has(self, name: str) -> bool:
        return os.path.isfile(self.where(name))

    def data(self, name: str) -> memoryview:
        self._known(name)
        with open(self.where(name), "rb") as f:
            return memoryview(f.read()).toreadonly()

    def array(self, name: str) -> np.ndarray:
        self._known(name)
        if os.path.getsize(self.where(name)) == 0:
            return np.zeros(0, dtype=np.uint8)
        return np.memmap(self.where(name), dtype=np.uint8, mode="r")

    def buffer(self, name: str):
        self._known(name)
        with open(self.where(name), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) if size else bytearray()

    def copy_to(self, name: str, path: str) -> None:
        self._known(name)
        shutil.copy2(self.where(name), path)
