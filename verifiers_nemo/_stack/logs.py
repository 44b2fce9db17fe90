"""Where launches keep their logs, and what a failed start says: the failing server's own last lines."""

from __future__ import annotations

import re
from pathlib import Path

from .._gym import cache_dir
from .procs import sweep_dead_owners

KEEP_FAILED_LOGS = 10
"""Log folders of failed or dead launches kept for their error messages (the newest; others are removed)."""
SERVER_LOGS = "servers"
"""The sub-folder of a launch's log folder where each server writes its own output (``nemo_gym_log_dir``)."""
# Start-up chatter every Gym server prints (Ray's and uvicorn's INFO lines): left out of failure messages.
_ROUTINE = re.compile(r"^(INFO:\s|\S+ \S+\s+INFO \S+\.py:\d+ -- |Connecting to Ray cluster at )")


def logs_dir() -> Path:
    """Where launches keep their logs: ``<cache>/logs/<run id>/`` (ng_run.log, servers/<name>.log)."""
    return cache_dir() / "logs"


def sweep_run_dirs(runs: Path) -> list[Path]:
    """Remove run folders (``<name>-<pid>-<hex>``) whose owner process is gone. Supervisors remove their
    run folder themselves; this catches the rest (a supervisor killed outright, an owner killed between
    creating the folder and starting the supervisor)."""
    return sweep_dead_owners(runs)


def log_tail(log_path: Path, lines: int = 40) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def server_lines(log_path: Path, name: str, lines: int = 25, own_folders: tuple[str, ...] = ()) -> list[str]:
    """The last lines server ``name`` of the launch logging to ``log_path`` (ng_run's log) wrote itself: its
    own log (``nemo_gym_log_dir``: stdout and stderr, the output of its start-up commands included), else
    the lines ng_run's log prefixes with its name. Blank lines and Gym's routine start-up chatter are left out."""
    own = log_path.parent / SERVER_LOGS / f"{name.replace('/', '_')}.log"
    try:
        text = own.read_text(errors="replace").splitlines()
    except OSError:
        try:
            text = [
                line.removeprefix(f"({name}) ")
                for line in log_path.read_text(errors="replace").splitlines()
                if line.startswith(f"({name}) ")
            ]
        except OSError:
            text = []
    text = [line.removeprefix(f"({name}) ").rstrip() for line in text]
    text = [line for line in text if line.strip() and not _ROUTINE.search(line)]
    return _without_traceback_frames(text, own_folders)[-lines:]


def failure_summary(log_path: Path, stack_name: str, own: tuple[str, ...] = ()) -> str:
    """Why a start failed: the crashed server's own last lines when ng_run names one, else the log's tail. ``own``:
    the folders of servers of yours (``StackConfig.server_dirs``), whose failing frame is kept (file and line)."""
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        text = ""
    crashed = re.findall(r"Process `([^`]+)` finished unexpectedly", text)
    lines_of_own = server_lines(log_path, crashed[-1], own_folders=own) if crashed else []
    if crashed and not lines_of_own:
        return f"Gym server {crashed[-1]} exited while the stack started, without any output of its own."
    if not lines_of_own:
        lines = [line for line in text.splitlines() if line.strip() and not _ROUTINE.search(line)]
        tail = "\n".join(_without_traceback_frames(lines, own)[-25:]) or "(no output)"
        return f"Gym stack {stack_name} exited while starting. The launcher's last lines:\n{tail}"
    return f"Gym server {crashed[-1]} exited while the stack started. Its last lines:\n" + "\n".join(
        f"  {line}" for line in lines_of_own
    )


def _without_traceback_frames(lines: list[str], own: tuple[str, ...] = ()) -> list[str]:
    """Python tracebacks without their frames (kept in the full log), but for the innermost frame in a folder of
    ``own`` (a server you wrote), which names the failing file and line; the exception says why."""
    out: list[str] = []
    frames: list[list[str]] = []
    in_traceback = False
    for line in lines:
        if line.lstrip().startswith("Traceback (most recent call last):"):
            in_traceback, frames = True, []
            continue
        if in_traceback and line[:1].isspace():
            if line.lstrip().startswith('File "'):
                frames.append([line])
            elif frames and len(frames[-1]) == 1:
                frames[-1].append(line)
            continue
        yours = [f for f in frames if any(folder in f[0] for folder in own)] if in_traceback else []
        if yours:
            out += yours[-1]
        in_traceback = False
        out.append(line)
    return out


_TAIL_BYTES = 64 << 10


def last_server_error(log_path: Path, skip: tuple[str, ...] = (), own: tuple[str, ...] = ()) -> str | None:
    """The newest Python exception a server of the launch logging to ``log_path`` wrote (its own log), as one
    line: ``server: File "…/app.py", line N, in verify: RuntimeError: …`` (the innermost frame of yours); None
    when none wrote one. Servers named in ``skip`` (the agents, which relay others' errors) are passed over."""
    folder = log_path.parent / SERVER_LOGS
    try:
        logs = sorted(folder.glob("*.log"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
    except OSError:
        return None
    for log in logs:
        name = log.stem
        if name in skip:
            continue
        try:
            with log.open("rb") as handle:
                handle.seek(max(0, handle.seek(0, 2) - _TAIL_BYTES))
                lines = [
                    line.removeprefix(f"({name}) ") for line in handle.read().decode(errors="replace").splitlines()
                ]
        except OSError:
            continue
        starts = [i for i, line in enumerate(lines) if line.lstrip().startswith("Traceback (most recent call last):")]
        if not starts:
            continue
        block = _without_traceback_frames([line.rstrip() for line in lines[starts[-1] :] if line.strip()], own)
        frame = next((line.strip() for line in block if line.lstrip().startswith('File "')), None)
        error = next((line.strip() for line in block if not line[:1].isspace() and ":" in line), None)
        if error is not None:
            return f"{name}: " + ": ".join(part for part in (frame, error) if part)
    return None
