"""Death detection for a running launch: from process exit, not from probes.

Every process the monitor watches is held by a pidfd (``os.pidfd_open``, Linux 5.3+), which becomes readable
the moment the process exits, so one ``poll()`` wakes on the first death: the launcher's supervisor, the Ray
head's, and each Gym server (the processes of the launch's session that hold its listening socket; a server is
dead once all of them are gone). A server whose process cannot be found or held is probed instead, as before:
two refused connections in a row (a connect that only times out is a busy server, not a dead one).
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Mapping
from typing import Literal

from .config import HOST
from .procs import listening_pids, port_state, process_alive

Probe = Callable[[str, int], Literal["open", "refused", "timeout"]]
PROBE_INTERVAL = 0.5
"""Seconds between probes of the servers without a pidfd (and the longest a stop waits for the thread)."""


class Monitor:
    """Watches one launch from a daemon thread; calls ``on_death(reason)`` once, at the first death.

    ``processes`` maps a pid (a child of this process or any other) to the reason its exit gives; ``servers``
    maps each Gym server's name to its port, its processes found among session ``sid``. ``probe`` is how a
    server without a pidfd is checked (``port_state``; tests pass their own)."""

    def __init__(
        self,
        name: str,
        *,
        processes: Mapping[int, str],
        servers: Mapping[str, int],
        sid: int | None,
        on_death: Callable[[str], None],
        probe: Probe = port_state,
    ) -> None:
        self._on_death = on_death
        self._probe = probe
        self._stop_r, self._stop_w = os.pipe()
        self._stopped = threading.Event()
        self._fds: dict[int, str | tuple[str, int]] = {}  # pidfd -> a process's reason, or (server, pid)
        self._holders: dict[str, set[int]] = {}
        self.probed: dict[str, int] = {}
        """The servers watched by probes (no pidfd could be had for them), with their ports."""
        self._polled: dict[int, str] = {}  # processes without a pidfd: their /proc entry is checked instead
        for pid, reason in processes.items():
            fd = _pidfd(pid)
            if fd is not None:
                self._fds[fd] = reason
            else:
                self._polled[pid] = reason
        for server, port in servers.items():
            pids = listening_pids(port, sid) if sid is not None else []
            fds = [fd for fd in map(_pidfd, pids) if fd is not None]
            if fds:
                self._holders[server] = set(fds)
                self._fds.update({fd: (server, pid) for fd, pid in zip(fds, pids, strict=False)})
            else:
                self.probed[server] = port
        self._thread = threading.Thread(target=self._run, name=f"gym-stack-{name}", daemon=True)

    @property
    def watched_pids(self) -> int:
        """How many processes are held by a pidfd."""
        return len(self._fds)

    def start(self) -> Monitor:
        self._thread.start()
        return self

    def join(self, timeout: float | None = None) -> None:
        """Wait until the monitor has reported a death or been stopped."""
        self._thread.join(timeout)

    def stop(self) -> None:
        """Stop watching (idempotent); waits for the thread unless called from it."""
        if not self._stopped.is_set():
            self._stopped.set()
            with contextlib.suppress(OSError):
                os.write(self._stop_w, b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        try:
            reason = self._watch()
            if reason is not None and not self._stopped.is_set():
                self._on_death(reason)
        finally:
            for fd in [*self._fds, self._stop_r, self._stop_w]:
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._fds.clear()

    def _watch(self) -> str | None:
        poller = select.poll()
        poller.register(self._stop_r, select.POLLIN)
        for fd in self._fds:
            poller.register(fd, select.POLLIN)
        strikes: dict[str, int] = {}
        timeout = PROBE_INTERVAL * 1000 if self.probed or self._polled else None
        while not self._stopped.is_set():
            for fd, _ in poller.poll(timeout):
                if fd == self._stop_r:
                    return None
                poller.unregister(fd)
                what = self._fds[fd]
                if isinstance(what, str):
                    return what
                server, pid = what
                self._holders[server].discard(fd)
                if not self._holders[server]:
                    return f"Gym server {server} exited (pid {pid})"
            for pid, reason in self._polled.items():
                if not process_alive(pid):
                    return reason
            for server, port in self.probed.items():
                # Only a refused connection (nothing listening) is a strike: a connect that times out means
                # a busy server whose listen queue is full under load, not a dead one.
                if self._probe(HOST, port) != "refused":
                    strikes[server] = 0
                    continue
                strikes[server] = strikes.get(server, 0) + 1
                if strikes[server] >= 2:
                    return f"Gym server {server} stopped answering on port {port}"
        return None


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone already, not permitted, or no pidfd on this system
        return None
