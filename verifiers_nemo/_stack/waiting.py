"""How long a stack's start may wait, and what it says while it waits.

A stack's start waits for the machine's Ray head, its warm parent and its servers. On a busy machine each may
take minutes, and a fixed deadline per part failed starts that were progressing (issue 50: 8 busy loops on 2
cores, the Ray head alone over 120 s). So: one limit on the whole start (``StackConfig.start_timeout``, else
``VERIFIERS_NEMO_START_TIMEOUT``, else 600 s); within it, a part that is alive is waited for as long as its
processes use CPU or write to their log, and one that makes no progress for ``STALL_S`` is given up. Every 30 s
of waiting the log says what is waited for, and why it may be slow (the machine's load).
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import ConfigurationError, StackStartError
from .procs import session_pids

logger = logging.getLogger(__name__)

START_TIMEOUT_ENV_VAR = "VERIFIERS_NEMO_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 600.0
STALL_S = 120.0
"""A part that used no CPU and wrote nothing for this long is not coming up (stopped, deadlocked)."""
SAY_EVERY_S = 30.0


def start_timeout(asked: float | None = None) -> float:
    """The limit on one stack's whole start, in seconds: ``asked`` when given, else ``VERIFIERS_NEMO_START_TIMEOUT``,
    else 600."""
    if asked is not None:
        return float(asked)
    raw = os.environ.get(START_TIMEOUT_ENV_VAR, "").strip()
    if not raw:
        return DEFAULT_START_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigurationError(f"{START_TIMEOUT_ENV_VAR}={raw!r} must be a positive number of seconds.")
    return value


@dataclass(frozen=True)
class Deadline:
    """When (``at``, ``time.monotonic()``) a start must be done, and its limit in seconds."""

    at: float
    limit: float


def deadline(asked: float | None = None) -> Deadline:
    """The deadline of a start beginning now (``asked``: see ``start_timeout``)."""
    limit = start_timeout(asked)
    return Deadline(time.monotonic() + limit, limit)


class Waiting:
    """One wait of a start for ``what`` (``"the Ray head"``): ``check()`` on every poll says, every 30 s, what is
    waited for, and raises ``StackStartError`` once the start's ``deadline`` passes or, when the part's session
    ``sid`` is known, once its processes made no progress (no CPU, no log growth) for ``stall_s``."""

    def __init__(
        self, what: str, deadline: Deadline, sid: int | None = None, log: Path | None = None, stall_s: float = STALL_S
    ) -> None:
        self.what = what
        self.deadline = deadline
        self.sid = sid
        self.log = log
        self.stall_s = stall_s
        self.started = time.monotonic()
        self._said_at = self.started
        self._progress: tuple[int, int] | None = None
        self._progress_at = self._looked_at = self.started

    @property
    def waited(self) -> float:
        return time.monotonic() - self.started

    def check(self) -> None:
        now = time.monotonic()
        if now > self.deadline.at:
            raise StackStartError(
                f"{_capital(self.what)} was not ready within the start's limit of {self.deadline.limit:.0f}s "
                f"({START_TIMEOUT_ENV_VAR} or start_timeout= sets it){self._tail()}"
            )
        if self.sid is not None and now - self._looked_at >= 1.0:
            self._looked_at = now
            progress = (_session_cpu_ticks(self.sid), _size(self.log))
            if progress != self._progress:
                self._progress, self._progress_at = progress, now
            elif now - self._progress_at > self.stall_s:
                raise StackStartError(
                    f"{_capital(self.what)} made no progress for {self.stall_s:.0f}s (its processes used no CPU and "
                    f"wrote nothing){self._tail()}"
                )
        if now - self._said_at >= SAY_EVERY_S:
            self._said_at = now
            logger.warning(
                "%s is still starting after %.0fs: %s; waiting while it makes progress, up to %.0fs more (%s)",
                _capital(self.what),
                now - self.started,
                machine_load(),
                max(0.0, self.deadline.at - now),
                START_TIMEOUT_ENV_VAR,
            )

    def _tail(self) -> str:
        if self.log is None:
            return "."
        try:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            tail = "(no log)"
        return f":\n{tail}\n(full log: {self.log})"


def machine_load() -> str:
    """The machine's load, in words: ``the machine is busy (load 9.8 on 2 CPUs)``."""
    try:
        load = os.getloadavg()[0]
    except OSError:
        return "the machine's load is unknown"
    cpus = len(os.sched_getaffinity(0))
    state = "busy" if load > cpus else "not busy"
    return f"the machine is {state} (load {load:.1f} on {cpus} CPUs)"


def _session_cpu_ticks(sid: int) -> int:
    total = 0
    for pid in session_pids(sid):
        try:
            stat = Path(f"/proc/{pid}/stat").read_bytes()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
