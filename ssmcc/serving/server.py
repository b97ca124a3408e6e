"""Start and stop a local Triton Inference Server on a model repository (``ssmcc serve``, tests).

The server is the ``tritonserver`` binary that PyPI's ``nvidia-pytriton`` wheel ships, with its
Python backend (the only backend in that wheel). Starting it needs three things the wheel leaves
to its own launcher, done here:

- a backend folder holding the Python backend and the stub built for this Python version
  (``python_backend_stubs/3.X/triton_python_backend_stub``), made in a temporary folder;
- ``LD_LIBRARY_PATH`` with the wheel's bundled libraries and this Python's ``LIBDIR`` (the stub
  links ``libpython3.X.so``);
- ``PYTHONPATH`` with this interpreter's ``sys.path``, so the stub's ``model.py`` imports ssmcc,
  torch and onnxruntime from the environment that exported the repository.

It listens on 127.0.0.1 only, on free ports unless given, and is stopped (then killed) on exit.
It never outlives its owner: it runs under ``guardian.py``, which stops it, and kills its Python
backend stubs, when the owning process exits in any way (``kill -9`` included). Its temporary
folder (``ssmcc-tritonserver-<writer tag>-...``, ``ssmcc.runtime.temporaries``) goes when it
stops; one a killed owner left behind, with its server log, goes at the next start.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref

from ssmcc.errors import ServingError
from ssmcc.runtime.temporaries import remove_stale, writer_tag

TEMPORARY_PREFIX = "ssmcc-tritonserver-"  # the temporary folder's; the shared memory's too
_GUARDIAN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "guardian.py")


def pytriton_root() -> str:
    """The folder of the installed ``pytriton`` package (it holds ``tritonserver/``)."""
    try:
        import pytriton
    except ImportError as error:
        raise ServingError(
            "Triton Inference Server is not installed: pip install 'ssmcc[serving]' (it brings "
            "nvidia-pytriton, whose wheel ships the tritonserver binary, and tritonclient)"
        ) from error
    return os.path.dirname(pytriton.__file__)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _backend_folder(root: str, into: str) -> str:
    """``into/python``: the wheel's Python backend plus this Python version's stub."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    stub = os.path.join(root, "tritonserver", "python_backend_stubs", version)
    stub = os.path.join(stub, "triton_python_backend_stub")
    if not os.path.exists(stub):
        raise ServingError(f"nvidia-pytriton has no Python backend stub for Python {version}")
    backend = os.path.join(into, "python")
    shutil.copytree(os.path.join(root, "tritonserver", "backends", "python"), backend)
    shutil.copy2(stub, backend)
    return into


def server_environment(root: str) -> dict[str, str]:
    env = dict(os.environ)
    libs = os.path.join(os.path.dirname(root), "nvidia_pytriton.libs")
    library_path = [libs, sysconfig.get_config_var("LIBDIR") or "", env.get("LD_LIBRARY_PATH", "")]
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in library_path if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def _stop_process(process: subprocess.Popen, folder: str, owner_pipe: int) -> None:
    """SIGTERM to the guardian (it stops the server, killing it after 30 s); SIGKILL to the
    guardian if that takes longer (the server gets SIGKILL by its parent-death signal); then
    close the pipe that tells the guardian its owner is alive, and remove the folder."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=45)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    os.close(owner_pipe)
    shutil.rmtree(folder, ignore_errors=True)


class TritonServer:
    """A running ``tritonserver`` on ``repository``; use as a context manager.

    ``url`` is its HTTP endpoint (``127.0.0.1:PORT``). ``log`` keeps what the server printed (the
    first place to look when a model does not load)."""

    def __init__(
        self,
        repository: str,
        *,
        http_port: int | None = None,
        grpc_port: int | None = None,
        ready_timeout_s: float = 120.0,
        verbose: bool = False,
    ):
        self.repository = os.path.abspath(repository)
        self.http_port = http_port or _free_port()
        self.grpc_port = grpc_port or _free_port()
        self.ready_timeout_s = ready_timeout_s
        self.verbose = verbose
        self.process: subprocess.Popen | None = None
        self.log_path: str | None = None

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def command(self, backends: str, shared_memory_prefix: str) -> list[str]:
        binary = os.path.join(pytriton_root(), "tritonserver", "bin", "tritonserver")
        if not os.access(binary, os.X_OK):
            raise ServingError(f"{binary} is missing or not executable: reinstall nvidia-pytriton")
        return [
            binary,
            f"--model-repository={self.repository}",
            f"--backend-directory={backends}",
            f"--backend-config=python,shm-region-prefix-name={shared_memory_prefix}",
            "--http-address=127.0.0.1",
            f"--http-port={self.http_port}",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={self.grpc_port}",
            "--allow-metrics=false",
            "--log-verbose=1" if self.verbose else "--log-verbose=0",
        ]

    def start(self, interrupt: threading.Event | None = None) -> TritonServer:
        """Start the server and wait until it is ready, or until ``interrupt`` is set (then the
        server is stopped again and ``start`` returns; ``ssmcc serve`` sets it from its signal
        handlers)."""
        root = pytriton_root()
        remove_stale(tempfile.gettempdir(), TEMPORARY_PREFIX)  # what killed owners left
        remove_stale("/dev/shm", TEMPORARY_PREFIX)
        folder = tempfile.mkdtemp(prefix=f"{TEMPORARY_PREFIX}{writer_tag()}-")  # backends, log
        prefix = os.path.basename(folder)
        self.log_path = os.path.join(folder, "server.log")
        owner_read, owner_write = os.pipe()
        try:
            command = self.command(_backend_folder(root, os.path.join(folder, "backends")), prefix)
            guardian = [sys.executable, "-I", "-S", _GUARDIAN, str(owner_read), prefix, "--"]
            with open(self.log_path, "wb") as log:
                self.process = subprocess.Popen(
                    guardian + command,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=server_environment(root),
                    start_new_session=True,
                    pass_fds=(owner_read,),
                )
        except BaseException as error:
            os.close(owner_write)
            shutil.rmtree(folder, ignore_errors=True)
            if isinstance(error, OSError):
                raise ServingError(f"tritonserver could not be started: {error}") from error
            raise
        finally:
            os.close(owner_read)
        # a server the caller forgets (or a process that exits early) is stopped all the same
        self._finalizer = weakref.finalize(self, _stop_process, self.process, folder, owner_write)
        self._wait_ready(interrupt)
        return self

    def log(self) -> str:
        if self.log_path is None or not os.path.exists(self.log_path):
            return ""
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def _failure(self, what: str) -> ServingError:
        """``what`` happened: stop the server and say why, with the log's error lines (a model
        that failed to load says why there) or else its end."""
        log = self.log()
        self.stop()
        errors = [line[:1000] for line in log.splitlines() if line.startswith("E")]
        detail = "\n".join(errors[-8:]) if errors else log[-3000:]
        return ServingError(f"{what}; the server log says:\n{detail}")

    def _wait_ready(self, interrupt: threading.Event | None) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        ready = f"http://{self.url}/v2/health/ready"
        while time.monotonic() < deadline:
            if interrupt is not None and interrupt.is_set():
                self.stop()
                return
            if self.process.poll() is not None:
                raise self._failure(
                    f"tritonserver exited with code {self.process.returncode} before it was ready"
                )
            with contextlib.suppress(urllib.error.URLError, ConnectionError, OSError):
                with urllib.request.urlopen(ready, timeout=2) as answer:
                    if answer.status == 200:
                        return
            time.sleep(0.25)
        raise self._failure(f"tritonserver was not ready within {self.ready_timeout_s:.0f} s")

    def stop(self) -> None:
        """Terminate the server and its Python backend stubs; kill them after 30 s."""
        if self.process is not None:
            self._finalizer()

    def __enter__(self) -> TritonServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
