"""Linux process-session helpers: which processes a stack owns, their memory, and killing them."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import http.client
import logging
import os
import random
import shutil
import signal
import socket
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


def process_sid(pid: int) -> int | None:
    """The session id of ``pid``, None when it is gone."""
    fields = _stat_fields(pid)
    return int(fields[3]) if fields else None


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != b"Z"


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


def http_ok(port: int, host: str = "127.0.0.1", timeout: float = 1.0) -> bool:
    """Whether an HTTP server on ``host:port`` answers ``GET /`` (any status)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


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
    """Ports held for one stack: free when chosen, and held across processes until ``release()`` or this
    process's end. A hold is an abstract Unix socket bound to a name per port (Linux): the kernel drops it
    the moment its holder exits, however it exits, and nothing is ever written to disk."""

    def __init__(self, ports: list[int], holds: list[socket.socket]) -> None:
        self.ports = ports
        self._holds = holds

    def release(self) -> None:
        holds, self._holds = self._holds, []
        for hold in holds:
            hold.close()


def _hold(name: str) -> socket.socket | None:
    """Bind the abstract socket ``name`` (not inherited by children), or None when another process holds it."""
    hold = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        hold.bind("\0" + name)
    except OSError:
        hold.close()
        return None
    return hold


def port_hold_name(port: int, scope: str | os.PathLike[str] | None = None) -> str:
    """The abstract socket name that holds ``port``: machine-wide, or within ``scope`` when one is given."""
    if scope is None:
        return f"verifiers-nemo/port/{port}"
    digest = hashlib.sha256(os.fsencode(os.path.abspath(scope))).hexdigest()[:16]
    return f"verifiers-nemo/port/{digest}/{port}"


def reserve_ports(count: int, scope: str | os.PathLike[str] | None = None, host: str = "127.0.0.1") -> PortReservation:
    """``count`` distinct free ports from ``SERVER_PORT_RANGE``, held across the processes of this machine
    (or only among those that name the same ``scope``) until released."""
    low, high = SERVER_PORT_RANGE
    eph_low, eph_high = _ephemeral_range()
    candidates = [p for p in range(low, high + 1) if not eph_low <= p <= eph_high]
    random.SystemRandom().shuffle(candidates)
    ports: list[int] = []
    holds: list[socket.socket] = []
    for port in candidates:
        if len(ports) == count:
            break
        hold = _hold(port_hold_name(port, scope))
        if hold is None:
            continue
        with socket.socket() as probe:
            try:
                probe.bind((host, port))
            except OSError:
                hold.close()
                continue
        ports.append(port)
        holds.append(hold)
    if len(ports) < count:
        PortReservation(ports, holds).release()
        raise OSError(f"no {count} free ports in {low}-{high} on {host}")
    return PortReservation(ports, holds)


def remove_legacy_port_locks(lock_dir: Path) -> None:
    """Remove the ``<port>.lock`` files earlier versions kept (one per port ever tried) that no process
    holds any more, and their folder once it is empty."""
    try:
        paths = [p for p in lock_dir.iterdir() if p.suffix == ".lock"]
    except OSError:
        return
    for path in paths:
        try:
            fd = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                path.unlink()
        except OSError:
            pass
        finally:
            os.close(fd)
    with contextlib.suppress(OSError):
        lock_dir.rmdir()


def _listening_sockets() -> list[list[str]]:
    """The rows of ``/proc/net/tcp`` and ``tcp6`` of listening sockets (their fields)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                rows = f.readlines()[1:]
        except OSError:
            continue
        found.extend(fields for fields in map(str.split, rows) if len(fields) > 9 and fields[3] == "0A")
    return found


def _port(fields: list[str]) -> int:
    return int(fields[1].rsplit(":", 1)[1], 16)


def _listening_rows(port: int) -> list[list[str]]:
    """The listening sockets' rows (``_listening_sockets``) of TCP ``port``."""
    return [fields for fields in _listening_sockets() if _port(fields) == port]


def listening_ports(pids: list[int]) -> dict[int, list[int]]:
    """The TCP ports (IPv4 or IPv6) each of ``pids`` holds a listening socket on (those that hold one)."""
    by_inode = {f"socket:[{fields[9]}]": _port(fields) for fields in _listening_sockets()}
    found: dict[int, list[int]] = {}
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                port = by_inode.get(os.readlink(f"/proc/{pid}/fd/{fd}"))
                if port is not None:
                    found.setdefault(pid, []).append(port)
    return found


def listener_uids(port: int) -> set[int]:
    """The users whose sockets listen on TCP ``port`` of this machine (IPv4 or IPv6; ``/proc/net/tcp``)."""
    return {int(fields[7]) for fields in _listening_rows(port)}


def listening_pids(port: int, sid: int) -> list[int]:
    """The processes of session ``sid`` that hold a socket listening on TCP ``port`` (IPv4 or IPv6)."""
    inodes = {f"socket:[{fields[9]}]" for fields in _listening_rows(port)}
    holders = []
    for pid in session_pids(sid) if inodes else []:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}") in inodes:
                    holders.append(pid)
                    break
            except OSError:
                continue
    return holders


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
