"""Linux process-session helpers: which processes a stack owns, their memory, and killing them."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Literal

logger = logging.getLogger(__name__)


def _stat_fields(pid: int) -> list[bytes] | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return stat[stat.rfind(b")") + 2 :].split()


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes whose session id is ``sid``."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        fields = _stat_fields(int(entry))
        if fields and int(fields[3]) == sid and fields[0] != b"Z":
            pids.append(int(entry))
    return pids


def rss_bytes(pids: list[int]) -> int:
    """Sum of resident memory of ``pids`` (those still alive)."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/statm") as f:
                total += int(f.read().split()[1]) * page
        except OSError:
            continue
    return total


def kill_session(sid: int, timeout: float = 5.0) -> list[int]:
    """SIGKILL every process of session ``sid`` until none is left or ``timeout``; returns survivors."""
    deadline = time.monotonic() + timeout
    while True:
        pids = session_pids(sid)
        if not pids or time.monotonic() >= deadline:
            return pids
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def port_accepts(host: str, port: int, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    return port_state(host, port, timeout) == "open"


def port_state(host: str, port: int, timeout: float = 0.5) -> Literal["open", "refused", "timeout"]:
    """Connect to ``host:port``: ``open``, ``refused`` (nothing listens there) or ``timeout`` (something
    listens but did not accept in time, e.g. a busy server whose listen queue is full)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return "open"
    except TimeoutError:
        return "timeout"
    except OSError:
        return "refused"


def _ephemeral_range() -> tuple[int, int]:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


# Below the kernel's ephemeral range (outgoing connections, e.g. Ray's many, take ports from it) and
# above Ray's worker ports (10002-19999).
SERVER_PORT_RANGE = (20000, 32767)


class PortReservation:
    """Ports held for one stack: free when chosen, and locked (a lock file per port) so that other
    processes using this package skip them until ``release()`` or this process's exit. A lock file
    lives only while its port is held: ``release()`` removes it, and ``reserve_ports`` sweeps those a
    dead process left behind."""

    def __init__(self, ports: list[int], locks: list[tuple[Path, int]]) -> None:
        self.ports = ports
        self._locks = locks

    @property
    def lock_paths(self) -> list[str]:
        """The lock files, for a supervisor to remove once nobody holds them (its owner died)."""
        return [str(path) for path, _ in self._locks]

    def release(self) -> None:
        locks, self._locks = self._locks, []
        for path, fd in locks:
            _unlock_and_remove(path, fd)


def _lock(path: Path) -> int | None:
    """An exclusive lock on the lock file ``path`` (created if need be), or None when another process
    holds it. The file may be removed by its holder between our open and our lock: then the lock is on
    a file nobody else will find, so it is retried on the file now at ``path``."""
    for _ in range(10):
        fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return None
        try:
            same = os.path.samestat(os.fstat(fd), os.stat(path))
        except OSError:
            same = False
        if same:
            return fd
        os.close(fd)
    return None


def _unlock_and_remove(path: Path, fd: int) -> None:
    """Remove a lock file while holding its lock (whoever opens it next finds it gone, see ``_lock``)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
    with contextlib.suppress(OSError):
        os.close(fd)


def sweep_port_locks(lock_dir: Path) -> int:
    """Remove the lock files no process holds (left by a process that died); returns how many."""
    removed = 0
    try:
        paths = [p for p in lock_dir.iterdir() if p.suffix == ".lock"]
    except OSError:
        return 0
    for path in paths:
        fd = _lock(path)
        if fd is not None:
            _unlock_and_remove(path, fd)
            removed += 1
    return removed


def reserve_ports(count: int, lock_dir: Path, host: str = "127.0.0.1") -> PortReservation:
    """``count`` distinct free ports from ``SERVER_PORT_RANGE``, reserved across processes."""
    low, high = SERVER_PORT_RANGE
    eph_low, eph_high = _ephemeral_range()
    candidates = [p for p in range(low, high + 1) if not eph_low <= p <= eph_high]
    random.SystemRandom().shuffle(candidates)
    lock_dir.mkdir(parents=True, exist_ok=True)
    sweep_port_locks(lock_dir)
    ports: list[int] = []
    locks: list[tuple[Path, int]] = []
    for port in candidates:
        if len(ports) == count:
            break
        path = lock_dir / f"{port}.lock"
        fd = _lock(path)
        if fd is None:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                _unlock_and_remove(path, fd)
                continue
        ports.append(port)
        locks.append((path, fd))
    if len(ports) < count:
        PortReservation(ports, locks).release()
        raise OSError(f"no {count} free ports in {low}-{high} on {host}")
    return PortReservation(ports, locks)


def stop_supervised(
    supervisor: subprocess.Popen[bytes], label: str, timeout: float, *, keep_logs: bool = False
) -> None:
    """Stop a process started under ``_gym_side/supervisor.py`` and everything of its session.

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
    if survivors:
        logger.error("%s: processes %s survived SIGKILL", label, survivors)


# -- files named after the process that owns them: ``<label>-<pid>-<hex>[.ext]`` ----------------------


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def owner_pid(path: Path) -> int | None:
    """The owner's pid in a name ``<label>-<pid>-<hex>`` (a suffix such as ``.log`` is ignored)."""
    parts = path.name.split(".", 1)[0].rsplit("-", 2)
    return int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None


def sweep_dead_owners(directory: Path, *, keep_newest: int = 0, prefix: str = "") -> list[Path]:
    """Remove the entries of ``directory`` (named ``<prefix><label>-<pid>-<hex>``) whose owner process is
    gone, except the ``keep_newest`` most recently modified of them; returns what was removed."""
    dead: list[tuple[float, Path]] = []
    try:
        entries = [p for p in directory.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return []
    for path in entries:
        pid = owner_pid(path)
        if pid is None or pid_alive(pid):
            continue
        try:
            dead.append((path.lstat().st_mtime, path))
        except OSError:
            continue
    dead.sort(reverse=True)
    removed = []
    for _, path in dead[keep_newest:]:
        remove_path(path)
        removed.append(path)
    return removed


def remove_path(path: Path) -> None:
    """Remove a file or a folder tree; no error when it is already gone."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()
