"""Linux process-session helpers: which processes a stack owns, their memory, and killing them."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
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
    processes using this package skip them until ``release()`` or this process's exit."""

    def __init__(self, ports: list[int], locks: list[int]) -> None:
        self.ports = ports
        self._locks = locks

    def release(self) -> None:
        for fd in self._locks:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._locks = []


def reserve_ports(count: int, lock_dir: Path, host: str = "127.0.0.1") -> PortReservation:
    """``count`` distinct free ports from ``SERVER_PORT_RANGE``, reserved across processes."""
    low, high = SERVER_PORT_RANGE
    eph_low, eph_high = _ephemeral_range()
    candidates = [p for p in range(low, high + 1) if not eph_low <= p <= eph_high]
    random.SystemRandom().shuffle(candidates)
    lock_dir.mkdir(parents=True, exist_ok=True)
    ports: list[int] = []
    locks: list[int] = []
    for port in candidates:
        if len(ports) == count:
            break
        fd = os.open(lock_dir / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                os.close(fd)
                continue
        ports.append(port)
        locks.append(fd)
    if len(ports) < count:
        PortReservation(ports, locks).release()
        raise OSError(f"no {count} free ports in {low}-{high} on {host}")
    return PortReservation(ports, locks)


def stop_supervised(supervisor: subprocess.Popen[bytes], label: str, timeout: float) -> None:
    """Stop a process started under ``_gym_side/supervisor.py`` and everything of its session.

    Tells it we stop it on purpose (one byte, so it leaves our files to us), closes its pipe (EOF: it tears
    its session down), waits up to ``timeout``, then SIGKILLs whatever of the session is left."""
    if supervisor.stdin:
        with contextlib.suppress(OSError):
            supervisor.stdin.write(b"s")
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
