"""Machine-wide helpers held by leases (the shared Ray head, the warm parents): a folder per helper with a
``lock`` (``flock``), a state file (0600, replaced atomically) and ``leases/``, a file per holding process that
it keeps ``flock``-ed: the kernel releases the lock however the holder dies, and the helper's supervisor
(``_gym_side/supervisor.py``, lease mode) stops the helper once no lease is live."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .private_dir import ensure_child


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold the ``flock`` of ``path`` (created 0600) for the block."""
    with open(path, "a") as lock:
        os.chmod(path, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def take_lease(folder: Path) -> tuple[Path, int]:
    """A lease file of this process, created and locked: its path and fd (close the fd to let go). It is locked
    before it appears in ``folder`` (made beside it, then renamed in): a supervisor scanning the folder would take
    an unlocked lease for a dead holder's and remove it."""
    ensure_child(folder.parent, folder.name)
    name = f"{os.getpid()}-{secrets.token_hex(4)}"
    staged = folder.parent / f".lease-{name}"
    fd = os.open(staged, os.O_CREAT | os.O_EXCL | os.O_RDWR | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.rename(staged, folder / name)
    return folder / name, fd


def give_up_lease(lease: tuple[Path, int]) -> None:
    """Let go of a lease taken with ``take_lease``."""
    path, fd = lease
    with contextlib.suppress(OSError):
        path.unlink()
    os.close(fd)


def read_state(path: Path) -> dict[str, Any] | None:
    """A helper's state file, or None when there is none, it is unreadable, or it is not a file of this user's
    alone (a link, another owner, open to others: not one ``write_state`` wrote)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(fd) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
            return None
        try:
            state = json.loads(f.read())
        except (OSError, ValueError):
            return None
    return state if isinstance(state, dict) else None


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace a helper's state file atomically (0600)."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def start_time(pid: int) -> str | None:
    """A process's start time in clock ticks since boot (``/proc/PID/stat`` field 22), None when gone: with the
    pid, it names one process (a pid may be reused)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    return None if fields[0] == b"Z" else fields[19].decode()


def lease_spec(folder: Path, state: str, poll_s: float) -> dict[str, Any]:
    """The ``leases`` part of a shared helper's supervisor spec (``_gym_side/supervisor.py``): its holders' leases
    in ``folder/leases``, the start lock ``folder/lock``, its state file ``folder/state``; it stops as soon as the
    last holder is gone (checked every ``poll_s``)."""
    return {
        "dir": str(folder / "leases"),
        "lock": str(folder / "lock"),
        "state": str(folder / state),
        "linger_s": 0.0,
        "poll_s": poll_s,
    }
