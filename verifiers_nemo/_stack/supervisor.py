"""Running a launcher under ``_gym_side/supervisor.py``: the one way the stack and the Ray head start processes.

The supervisor leads its own session and reads a pipe from this process: closing the pipe (a stop, or this
process's death by any signal) takes down every process of its session and removes the spec's files. That
pipe is why no signal handler of ours has to tear anything down.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import select
import signal
import subprocess
from pathlib import Path
from typing import Any

from .procs import kill_session

logger = logging.getLogger(__name__)

GYM_SIDE = Path(__file__).parent.parent / "_gym_side"


def start_supervised(python: Path, spec: dict[str, Any], *, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """Start ``spec["argv"]`` under the supervisor, run by the Gym interpreter ``python`` in a new session.

    ``spec``: ``argv``, ``cwd``, ``log`` (the launcher's output), ``grace_s`` (SIGINT to SIGKILL), ``ports``
    (``[host, port]`` pairs whose closing ends the grace early), ``remove`` (paths removed once the session is
    down), ``logs`` (removed too, unless the launch failed) and ``title_room`` (bytes of blank argument after
    ``argv``: a warm parent's room for its forks' command lines). With ``leases`` (``dir``, ``lock``, ``state``,
    ``linger_s``, ``poll_s``) the launch is not this process's: use ``start_detached``."""
    return _popen(python, spec, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)


def start_detached(python: Path, spec: dict[str, Any], *, cwd: Path, env: dict[str, str]) -> int:
    """Start a leased launch (``spec["leases"]``, see ``start_supervised``) under a supervisor that is no
    child of this process and leads a session of its own; returns its pid (also its session id). It lives
    while a process holds a lease: no death of this process, SIGKILL included, takes it down."""
    with _popen(python, spec, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE) as starter:
        assert starter.stdout is not None
        line = starter.stdout.readline()
    try:
        return int(line)
    except ValueError:
        raise OSError(f"the supervisor of {spec['argv'][0]} did not start (exit {starter.returncode})") from None


def _popen(
    python: Path, spec: dict[str, Any], *, cwd: Path, env: dict[str, str], stdin: int, stdout: int
) -> subprocess.Popen[bytes]:
    """The supervisor process for ``spec``, in a session of its own."""
    return subprocess.Popen(
        [str(python), str(GYM_SIDE / "supervisor.py"), json.dumps(spec)],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
        env=env,
        start_new_session=True,
    )


class WarmSupervisor:
    """A stack's supervisor forked by the machine's warm parent (``warm_parent.py``), not by this process: what
    ``subprocess.Popen`` is for the plain one, as far as the stack uses it (``pid``, ``stdin``, ``poll``,
    ``wait``, ``kill``). Held by a pidfd (never a reused pid). Its exit status is its parent's to read, not
    ours: ``returncode`` is 0 once it has exited."""

    def __init__(self, pid: int, pidfd: int, stdin: int) -> None:
        self.pid = pid
        self._pidfd: int | None = pidfd
        self.stdin = open(stdin, "wb", buffering=0)  # noqa: SIM115 - the pipe it reads: closed to stop it
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None and (self._pidfd is None or select.select([self._pidfd], [], [], 0)[0]):
            self.returncode = 0
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        exited = self.returncode is not None or self._pidfd is None
        if not exited and not select.select([self._pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(f"supervisor {self.pid}", timeout or 0.0)
        self.returncode = 0
        return 0

    def kill(self) -> None:
        if self._pidfd is not None and self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)

    def close(self) -> None:
        """Let go of the pidfd and the pipe (idempotent)."""
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)
        with contextlib.suppress(OSError):
            self.stdin.close()


Supervised = subprocess.Popen[bytes] | WarmSupervisor
"""A stack's supervisor, started plain (``start_supervised``) or forked warm (``WarmParent.supervise``)."""


def stop_supervised(supervisor: Supervised, label: str, timeout: float, *, keep_logs: bool = False) -> None:
    """Stop a process started by ``start_supervised`` and everything of its session.

    Tells it we stop it on purpose (one byte: ``k`` when its logs are to be kept for an error message, else
    ``s``; it removes its files itself either way, even if we die next), closes its pipe (EOF: it tears its
    session down), waits up to ``timeout``, then SIGKILLs whatever of the session is left."""
    if supervisor.stdin:
        with contextlib.suppress(OSError):
            supervisor.stdin.write(b"k" if keep_logs else b"s")
        with contextlib.suppress(OSError):
            supervisor.stdin.close()
    try:
        supervisor.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        logger.warning("%s did not stop in %.0fs; killing it", label, timeout)
    survivors = kill_session(supervisor.pid, timeout=5.0)
    if supervisor.poll() is None:
        supervisor.kill()
        supervisor.wait(timeout=5)
    if isinstance(supervisor, WarmSupervisor):
        supervisor.close()
    if survivors:
        logger.error("%s: processes %s survived SIGKILL", label, survivors)
