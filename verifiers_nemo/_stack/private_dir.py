"""The user's own folder for what this package shares between processes on a machine (the Gym stacks' Ray head
and warm parents: their locks, leases, state files and sockets), checked as ssh-agent and ``$XDG_RUNTIME_DIR``
are: never used unless it is a real folder (``lstat``: no symlink) owned by this user with mode 0700, and every
folder above it is owned by this user or root and writable by no one else (or sticky, as ``/tmp``), so that no
other local user can have prepared it, put files in it, or swap it for another.

Where: ``VERIFIERS_NEMO_RAY_DIR`` when set (refused in one line when it fails a check); else
``$XDG_RUNTIME_DIR/verifiers-nemo`` when ``$XDG_RUNTIME_DIR`` passes the same checks; else ``<tmp>/vnr-ray-<uid>``.
When that last one was made by someone else (or is open to others), it is not used: this process keeps its helpers
in a fresh private folder of its own (``mkdtemp``) and says so once; its helpers are then not shared with the
user's other processes. A folder of ours left readable by others (``mkdir(parents=True)`` made it 0755 before) but
writable by no one else is tightened to 0700: nobody else can have written in it.

Standard library only: tests run it as another user with the system's Python.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

logger = logging.getLogger(__name__)

RAY_DIR_ENV_VAR = "VERIFIERS_NEMO_RAY_DIR"
XDG_SUBFOLDER = "verifiers-nemo"


class UnsafeFolder(ValueError):
    """A folder failed a check: the one-line message names it, why, and the fix."""


def private_root() -> Path:
    """The checked folder of this user's shared helpers on this machine (see the module docstring)."""
    explicit = os.environ.get(RAY_DIR_ENV_VAR)
    if explicit:
        return ensure_private(Path(explicit), fix=f"remove it, or set {RAY_DIR_ENV_VAR} to a folder of your own")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg and Path(xdg).is_absolute():
        try:
            check_private(Path(xdg), fix="", tighten=False)
        except UnsafeFolder as exc:
            _say_once(f"XDG_RUNTIME_DIR is not used for the shared Gym helpers: {exc}")
        else:
            return ensure_private(Path(xdg) / XDG_SUBFOLDER, fix="remove it")
    default = Path(tempfile.gettempdir()) / f"vnr-ray-{os.getuid()}"
    try:
        return ensure_private(default, fix="")
    except UnsafeFolder as exc:
        return _fallback(default, str(exc))


def ensure_private(folder: Path, fix: str) -> Path:
    """``folder``, created (mode 0700, each missing parent too) if missing, once it passes the checks; else
    ``UnsafeFolder`` (its message ends with ``fix``)."""
    folder = Path(os.path.abspath(folder))
    missing = []
    probe = folder
    while not os.path.lexists(probe):
        missing.append(probe)
        probe = probe.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process of ours made it at the same time: checked below
            os.mkdir(path, 0o700)
            os.chmod(path, 0o700)  # whatever the umask left
    return check_private(folder, fix)


def ensure_child(parent: Path, name: str) -> Path:
    """The subfolder ``name`` of a checked folder, created 0700 if missing, and checked itself."""
    folder = parent / name
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
        os.chmod(folder, 0o700)
    return check_private(folder, fix="remove it")


def check_private(folder: Path, fix: str, tighten: bool = True) -> Path:
    """``folder`` when it is a folder of this user's alone, under folders no one else may change; else
    ``UnsafeFolder``. Mode bits that only let others read (no write) are removed (``tighten``; else refused)."""
    uid = os.getuid()
    try:
        st = os.lstat(folder)
    except OSError as exc:
        raise _unsafe(folder, f"it cannot be read ({exc.strerror})", fix) from None
    if stat.S_ISLNK(st.st_mode):
        raise _unsafe(folder, "it is a symbolic link", fix)
    if not stat.S_ISDIR(st.st_mode):
        raise _unsafe(folder, "it is not a folder", fix)
    if st.st_uid != uid:
        raise _unsafe(folder, f"it belongs to uid {st.st_uid}, not to you (uid {uid})", fix)
    if st.st_mode & 0o022:
        raise _unsafe(folder, f"others may write in it (mode {stat.S_IMODE(st.st_mode):o})", fix)
    if st.st_mode & 0o077:
        if not tighten:
            raise _unsafe(folder, f"others may enter it (mode {stat.S_IMODE(st.st_mode):o})", fix)
        os.chmod(folder, 0o700)
    for above in folder.parents:
        st = os.stat(above)
        if st.st_uid not in (0, uid):
            raise _unsafe(folder, f"the folder above it, {above}, belongs to uid {st.st_uid}", fix)
        if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            raise _unsafe(folder, f"others may write in the folder above it, {above}", fix)
    return folder


def owned_by_me(path: str | Path) -> bool:
    """Whether ``path`` (not followed if a link) is a file or folder of this user."""
    try:
        return os.lstat(path).st_uid == os.getuid()
    except OSError:
        return False


def process_is_mine(pid: int) -> bool:
    """Whether process ``pid`` runs as this user (its ``/proc`` entry's owner)."""
    return pid > 0 and owned_by_me(f"/proc/{pid}")


_fallbacks: dict[Path, Path] = {}
_said: set[str] = set()


def _fallback(default: Path, why: str) -> Path:
    """A fresh private folder for this process's helpers in place of ``default``, made once per process."""
    folder = _fallbacks.get(default)
    if folder is None or not os.path.isdir(folder):
        folder = _fallbacks[default] = Path(tempfile.mkdtemp(prefix=f"vnr-private-{os.getuid()}-"))
        _say_once(
            f"{why}: this process keeps its Ray head and warm parent in {folder} and shares them with no other"
            f" process; to share them again, remove {default} (another user made it) or set {RAY_DIR_ENV_VAR} to"
            " a folder of your own"
        )
    return folder


def _say_once(line: str) -> None:
    if line not in _said:
        _said.add(line)
        logger.warning("%s", line)


def _unsafe(folder: Path, why: str, fix: str) -> UnsafeFolder:
    said = f"The folder for the shared Gym helpers {folder} is not safe to use: {why}"
    return UnsafeFolder(f"{said}; {fix}." if fix else said)
