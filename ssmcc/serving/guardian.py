"""Run tritonserver so that neither it nor its Python backend stubs outlive their owner.

``python guardian.py FD SHM_PREFIX -- tritonserver ARGS...`` (started by ``TritonServer``; the
standard library only, so it starts in ~20 ms). FD is the read end of a pipe whose write end only
the owner holds: when the owner exits, however it exits (``kill -9`` included), the kernel closes
that end and FD reads end-of-file. No race: a pipe whose writer died before the guardian looked
reads end-of-file all the same. (A parent-death signal, ``PR_SET_PDEATHSIG``, fires when the
*thread* that started the child exits: a server started from a worker thread would die with it.)

The process tree::

    owner (ssmcc serve, a test, ...)
      guardian            a session of its own: a terminal's Ctrl-C reaches the owner only
        tritonserver      a process group of its own, PR_SET_PDEATHSIG = SIGKILL: it dies with
                          the guardian (single-threaded, so its thread is the process; a
                          guardian gone before the signal was set shows as a new parent pid)
          stubs           in tritonserver's process group (they exit by themselves ~0.3 s after
                          tritonserver is reaped, but not while it is an unreaped zombie)

The guardian stops the server when

- the owner asks (SIGTERM): SIGTERM to tritonserver, SIGKILL after ``STOP_GRACE_S``;
- the owner is gone (FD at end-of-file): the same with ``ORPHAN_GRACE_S``;
- tritonserver exits by itself.

Then it sends SIGKILL to tritonserver's whole process group while tritonserver is still an unreaped
zombie (the group's id, its pid, cannot be reused yet), so that no stub survives, reaps it, removes
the shared-memory regions named with SHM_PREFIX that a killed stub could not unlink, and exits with
tritonserver's exit code (128 + N for a signal N).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import sys
import time

STOP_GRACE_S = 30.0  # the owner stops the server: in-flight requests may finish
ORPHAN_GRACE_S = 3.0  # the owner is gone: a clean exit takes ~2 s, nobody waits longer
PR_SET_PDEATHSIG = 1


def _start(command: list[str]) -> int:
    """Fork and exec ``command`` as the leader of a new process group that gets SIGKILL when
    this process dies. Forking is safe here: the guardian runs no other thread."""
    prctl = getattr(ctypes.CDLL(None), "prctl", None)  # Linux only
    guardian = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:
        os.setpgid(0, 0)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != guardian:  # the guardian died before the signal was set
            os._exit(1)
        os.execv(command[0], command)
    except OSError as error:
        os.write(2, f"E ssmcc guardian: cannot run {command[0]}: {error}\n".encode())
    finally:
        os._exit(127)


def _exited(pid: int) -> bool:
    """Whether ``pid`` has exited; it stays an unreaped zombie (``WNOWAIT``)."""
    return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None


def _wait_exit(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _exited(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _stop(pid: int, grace_s: float) -> None:
    """SIGTERM, then SIGKILL after ``grace_s``; returns once ``pid`` has exited (unreaped)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    if not _wait_exit(pid, grace_s):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        _wait_exit(pid, 60.0)


def _remove_shared_memory(prefix: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/dev/shm"):
            if name.startswith(prefix):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", name))


def main(argv: list[str]) -> int:
    owner, prefix, command = int(argv[1]), argv[2], argv[4:]
    os.set_inheritable(owner, False)  # tritonserver must not hold the owner's pipe open
    asked = []
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGTERM, lambda *_: asked.append(STOP_GRACE_S))
    signal.signal(signal.SIGINT, lambda *_: asked.append(STOP_GRACE_S))
    server = _start(command)
    try:
        while not asked and not _exited(server):
            readable, _, _ = select.select([owner, wake_r], [], [], 0.25)
            if owner in readable and not os.read(owner, 1):
                asked.append(ORPHAN_GRACE_S)
            if wake_r in readable:
                os.read(wake_r, 64)
        if asked:
            _stop(server, asked[0])
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(server, signal.SIGKILL)  # its stubs: tritonserver is still a zombie
        _, status = os.waitpid(server, 0)
        _remove_shared_memory(prefix)
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
