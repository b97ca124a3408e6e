"""``load_program``: ``torch.export.load`` of one saved ssmcc program, without the tracer's imports.

Reading a program with dynamic dims makes torch's deserializer constrain each symbol's range in a
``ShapeEnv``, and the ``ShapeEnv`` records where in user code each range came from
(``_get_sloc``), for the messages of guards that tracing might later raise. Finding that frame
calls ``uninteresting_files()``, which imports torch's whole tracing stack (``torch.export._trace``,
AOTAutograd's partitioner, inductor's code cache, networkx): measured on an AMD EPYC, the first
program read in a process took 18 MB more resident memory and 0.3-0.5 s longer (2.5-2.9 s
instead of 2.8-3.2 s, mamba-130m's chunk program), for a location nobody reads. A loaded ssmcc
program is run, never traced again, so no guard is raised on it. While ``load_program`` reads,
the location of a range is the archive's path instead. The lookup is replaced on the class, so a
trace running in another thread during the read would record that path too; reads themselves are
serialised by a lock.

If the installed torch has no ``ShapeEnv._get_sloc`` (it is private), the program is read the
ordinary way.
"""

from __future__ import annotations

import contextlib
import io
import threading

import torch
from torch.export import ExportedProgram

_LOCK = threading.Lock()


@contextlib.contextmanager
def _source_locations_named(path: str):
    from torch.fx.experimental import symbolic_shapes

    shape_env = symbolic_shapes.ShapeEnv
    original = shape_env.__dict__.get("_get_sloc")
    sloc = getattr(symbolic_shapes, "SLoc", None)
    if original is None or sloc is None:
        yield
        return

    def archive_location(self, framework_loc=None):
        return sloc(framework_loc or path, None)

    with _LOCK:
        shape_env._get_sloc = archive_location
        try:
            yield
        finally:
            shape_env._get_sloc = original


def load_program(
    data: bytes | memoryview, where: str, extra_files: tuple[str, ...] = ()
) -> tuple[ExportedProgram, dict[str, str]]:
    """``torch.export.load`` of the archive bytes ``data`` (ranges' source locations name
    ``where``, see the module doc) and the archive's ``extra_files`` (absent ones ``""``)."""
    extra = dict.fromkeys(extra_files, "")
    with _source_locations_named(where):
        program = torch.export.load(io.BytesIO(bytes(data)), extra_files=extra)
    return program, extra
