"""A stack's warm supervisor: the supervisor's job (``supervisor.py``), done by a fork of the machine's warm
parent, which also forks the stack's Gym processes from itself.

The warm parent (``zygote.py``) forks this process for an owner and it leads a new session, as the plain
supervisor does: its stdin is the owner's pipe (EOF: the owner is gone, however it died), a rearguard tears the
session down if this process is killed, and stopping means SIGINT to the session, a grace until the servers'
ports close, SIGKILL to what is left, then the spec's files removed. Everything of the stack lives in this
session, as before: ``ng_run``, its shells, each server, and each server's launcher.

What differs is how the stack's interpreters come to exist. ``ng_run`` is a fork of this process that becomes
``python ng_run ARGS`` (``warm_child.py``). Each Gym server's command runs ``launcher.py`` (the server venv's
``bin/python``, see there), which connects to this process's abstract socket (named after the session: only a
process of this session and this user is served, checked with ``SO_PEERCRED``) and hands over everything a
fresh interpreter would have; this process forks a child that becomes the server, sends the launcher a pidfd
of it, reaps it and sends its wait status back, and SIGKILLs it if the launcher dies first. A request that
cannot be served warm (``warm_child.refusal``) is refused and the launcher starts the plain interpreter; the
stack's log says so once per reason.

Single-threaded throughout (signals arrive through a wakeup pipe; everything waits in one ``poll``): a fork of
a process with other threads may copy a lock some thread held. Standard library only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import socket
import subprocess
import sys
from typing import Any

_REQUEST_TIMEOUT_S = 10.0
SERVER_STARTS_PLAIN = "server {server} starts the plain way: {reason}"
"""The stack log's line (after ``[verifiers_nemo] ``) for a server this supervisor did not fork, and why."""
_RESET_FOR_NG_RUN = {signal.SIGPIPE, signal.SIGXFSZ, signal.SIGINT, signal.SIGTERM}


class WarmSupervisor:
    """A stack's supervisor forked from the warm parent (see the module docstring). ``serve`` returns the exit
    code in this process, and in a process it forked the script that process is to run."""

    def __init__(self, spec: dict[str, Any], owner: dict[str, Any], preload: dict[str, Any], helpers: Any) -> None:
        self.spec = spec
        self.owner = owner
        self.preload = preload
        self.helpers = helpers  # the modules loaded by path: supervisor, warm_child, wire, launcher
        self.sid = os.getsid(0)
        self.stop = False
        self.owner_said = b""
        self.ng_run: subprocess.Popen[bytes] | None = None  # when ng_run was started the plain way
        self.ng_pid = 0
        self.ng_status: int | None = None
        self.served: dict[int, Any] = {}  # server pid -> its launcher's channel (None once the launcher is gone)
        self.by_fd: dict[int, int] = {}  # a launcher channel's fd -> the server pid
        self.said: set[str] = set()
        self.listener: socket.socket | None = None
        self.poller: Any = None
        self.log: Any = None
        self.wake_r, self.wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    # -- in this process ------------------------------------------------------------------------------------

    def serve(self) -> Any:
        supervisor = self.helpers.supervisor
        signal.set_wakeup_fd(self.wake_w)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._stop_signal)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the poll: reaping is done there
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM, signal.SIGCHLD})
        supervisor._start_rearguard(self.spec)
        self.log = open(self.spec["log"], "ab", buffering=0)  # noqa: SIM115 - closed in _finish or the child
        self.listener = self._listen()
        child = self._start_ng_run()
        if child is not None:
            return child
        poller = self.poller = select.poll()
        for fd in (0, self.wake_r, *([self.listener.fileno()] if self.listener else [])):
            poller.register(fd, select.POLLIN)
        while not self.stop and self.ng_status is None:
            for fd, _events in poller.poll():
                if fd == self.wake_r:
                    self._drain_wakeups()
                elif fd == 0:
                    self._read_owner(poller)
                elif self.listener is not None and fd == self.listener.fileno():
                    child = self._accept(poller)
                    if child is not None:
                        return child
                elif fd in self.by_fd:
                    self._launcher_readable(fd, poller)
            self._reap()
        return self._finish()

    def _listen(self) -> socket.socket | None:
        """The launchers' socket (an abstract name after the session); None when another process holds that name
        (abstract names have no permissions): the launchers, which check who listens, then start plain."""
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC | socket.SOCK_NONBLOCK)
        try:
            listener.bind(self.helpers.launcher.socket_name(self.sid))
        except OSError as exc:
            listener.close()
            self._say(f"the servers start the plain way: the launchers' socket name is taken ({exc.strerror})")
            return None
        listener.listen(64)
        return listener

    def _stop_signal(self, *_: object) -> None:
        self.stop = True

    def _drain_wakeups(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self.wake_r, 256):
                pass

    def _read_owner(self, poller: select.poll) -> None:
        data = os.read(0, 64)
        if data:
            self.owner_said += data  # s: a stop on purpose; k: the same, keeping the logs
            return
        poller.unregister(0)
        self.stop = True

    def _say(self, line: str) -> None:
        if line not in self.said:
            self.said.add(line)
            with contextlib.suppress(OSError):
                self.log.write(f"[verifiers_nemo] {line}\n".encode())

    def _start_ng_run(self) -> Any:
        """Fork ``ng_run`` warm (or start it plain: ``_ng_run_refusal``). Returns the script in the child."""
        argv = self.spec["argv"]
        request = {
            "argv": argv,
            "executable": sys.executable,
            "orig_argv0": sys.executable,
            "comm": os.path.basename(argv[0]),  # the kernel names a #! script's process after the script
            "interpreter": self.preload["interpreter"],
            "cwd": self.spec["cwd"],
            "env": dict(os.environ),
            "path": self.preload["startup_path"],
            "fds": [0, 1, 2],
            # as the plain supervisor leaves them to ng_run: it resets SIGINT and SIGTERM, subprocess SIGPIPE, SIGXFSZ
            "ignored": sorted(set(self.owner["ignored"]) - _RESET_FOR_NG_RUN),
            "blocked": sorted(set(self.owner["blocked"]) - {signal.SIGINT, signal.SIGTERM}),
            "umask": self.owner["umask"],
            "rlimits": self.owner["rlimits"],
        }
        reason = self._ng_run_refusal(request)
        if reason is not None:
            self._say(f"ng_run starts the plain way: {reason}")
            self.ng_run = subprocess.Popen(
                argv, cwd=self.spec["cwd"], stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log
            )
            self.ng_pid = self.ng_run.pid
            return None
        self._say(f"Gym processes start warm, forked from the warm parent (pid {os.getppid()})")
        pid = os.fork()
        if pid == 0:
            null = os.open(os.devnull, os.O_RDONLY)
            log = os.open(self.spec["log"], os.O_WRONLY | os.O_APPEND)
            self._forget()
            return self.helpers.warm_child.become(request, [null, log, log], self.preload)
        self.ng_pid = pid
        return None

    def _ng_run_refusal(self, request: dict[str, Any]) -> str | None:
        """ng_run runs warm when it is a Python script of the warm parent's own interpreter (a console script's
        ``#!`` line names it: anything else, a wrapper say, runs as it is) and its ``sys.path`` is the warm
        parent's own (the same interpreter and ``PYTHON*`` variables)."""
        try:
            with open(request["argv"][0], "rb") as f:
                first = f.readline().strip()
        except OSError as exc:
            return f"{request['argv'][0]} cannot be read ({exc.strerror})"
        if first != b"#!" + os.fsencode(sys.executable):
            return f"{request['argv'][0]} is not a script of the warm parent's interpreter {sys.executable}"
        return self.helpers.warm_child.refusal(request, self.preload, own_path=False)

    def _accept(self, poller: select.poll) -> Any:
        """Serve one launcher: fork its server (returned in the child), or refuse it."""
        taken = self._take_request()
        if taken is None:
            return None
        channel, request, fds = taken
        child = os.fork()
        if child == 0:
            self._forget(channel)
            return self.helpers.warm_child.become(request, fds, self.preload)
        for fd in fds:
            os.close(fd)
        try:
            pidfd = os.pidfd_open(child)
            try:
                channel.send({"pid": child}, [pidfd])
            finally:
                os.close(pidfd)
        except OSError:
            pass  # the launcher is gone already: its channel reads as closed below, and the server is killed
        channel.sock.settimeout(None)
        self.served[child] = channel
        self.by_fd[channel.fileno()] = child
        poller.register(channel.fileno(), select.POLLIN)
        return None

    def _take_request(self) -> tuple[Any, dict[str, Any], list[int]] | None:
        """The next launcher's request and descriptors, when it may be served warm; else it is answered (or,
        from a process of another session or user, dropped) here."""
        try:
            sock, _ = self.listener.accept()  # type: ignore[union-attr]
        except (BlockingIOError, InterruptedError):
            return None
        sock.settimeout(_REQUEST_TIMEOUT_S)
        channel = self.helpers.wire.Channel(sock)
        fds: list[int] = []
        try:
            pid, uid, _ = self.helpers.wire.peer(sock)
            if uid != os.getuid() or os.getsid(pid) != self.sid:
                raise PermissionError(f"pid {pid} (uid {uid}) is not a process of this stack")
            request, fds = channel.recv()
            if request is None:
                raise EOFError("the launcher closed its connection")
            reason = self._refusal(request, pid)
            if reason is None and len(fds) != len(request["fds"]):
                reason = "its descriptors did not arrive"
            if reason is None:
                return channel, request, fds
            server = os.path.join(os.path.basename(request["cwd"]), os.path.basename(request["argv"][0]))
            self._say(SERVER_STARTS_PLAIN.format(server=server, reason=reason))
            channel.send({"refused": reason})
        except (OSError, EOFError, ValueError, KeyError) as exc:
            self._say(f"a launcher's request was not served: {exc!r}")
        for fd in fds:
            os.close(fd)
        channel.close()
        return None

    def _refusal(self, request: dict[str, Any], pid: int) -> str | None:
        for what in ("cgroup", "ns/mnt", "ns/net", "ns/pid", "ns/ipc", "ns/uts", "ns/user"):
            if _proc(pid, what) != _proc("self", what):
                return f"its {what} is not the warm supervisor's"
        return self.helpers.warm_child.refusal(request, self.preload)

    def _launcher_readable(self, fd: int, poller: select.poll) -> None:
        """A launcher's connection is readable only when it closes: the launcher died before its server."""
        pid = self.by_fd[fd]
        channel = self.served.get(pid)
        if channel is not None:
            try:
                if channel.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT):
                    return  # a launcher says nothing after its request: not a close
            except (BlockingIOError, InterruptedError):
                return  # an event of an earlier connection that had this descriptor number
            except OSError:
                pass
        del self.by_fd[fd]
        poller.unregister(fd)
        self.served[pid] = None
        if channel is not None:
            channel.close()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)  # not reaped yet: the pid is still this child's

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid == self.ng_pid:
                self.ng_status = status
                if self.ng_run is not None:
                    self.ng_run.returncode = os.waitstatus_to_exitcode(status)
            elif pid in self.served:
                channel = self.served.pop(pid)
                if channel is not None:
                    self.by_fd.pop(channel.fileno(), None)
                    self.poller.unregister(channel.fileno())
                    with contextlib.suppress(OSError):
                        channel.send({"status": status})
                    channel.close()

    def _finish(self) -> int:
        """Tear the session down (as the plain supervisor does) and remove the spec's files; the exit code."""
        supervisor = self.helpers.supervisor
        launcher_exited = self.ng_status is not None and not self.stop
        live = frozenset(pid for pid, channel in self.served.items() if channel is not None)
        supervisor._teardown(self.spec, spare=live)
        while self.ng_status is None:
            try:
                pid, status = os.waitpid(self.ng_pid, 0)
            except ChildProcessError:
                break
            if pid == self.ng_pid:
                self.ng_status = status
        code = os.waitstatus_to_exitcode(self.ng_status) if self.ng_status is not None else -signal.SIGKILL
        with contextlib.suppress(OSError):
            self.log.write(f"[verifiers_nemo supervisor] stopped (launcher exit {code})\n".encode())
            self.log.close()
        failed = launcher_exited or b"k" in self.owner_said
        for path in [*self.spec.get("remove", []), *([] if failed else self.spec.get("logs", []))]:
            supervisor._remove(path)
        return 0

    # -- in a forked child ----------------------------------------------------------------------------------

    def _forget(self, keep: Any = None) -> None:
        """In a child: drop this process's descriptors through the objects that hold them (closing only the raw
        number could let a late finalizer close a number the child reused)."""
        for channel in [*(c for c in self.served.values() if c is not None), keep]:
            if channel is not None:
                with contextlib.suppress(OSError):
                    os.close(channel.sock.detach())
        self.served.clear()
        self.by_fd.clear()
        if self.listener is not None:
            with contextlib.suppress(OSError):
                os.close(self.listener.detach())
        if self.log is not None:
            with contextlib.suppress(OSError):
                self.log.close()
        for fd in (self.wake_r, self.wake_w):
            with contextlib.suppress(OSError):
                os.close(fd)


def _proc(pid: int | str, what: str) -> str | None:
    """A process's cgroup (``/proc/PID/cgroup``) or a namespace (``ns/net``...), to compare with another's."""
    try:
        if what.startswith("ns/"):
            return os.readlink(f"/proc/{pid}/{what}")
        with open(f"/proc/{pid}/{what}") as f:
            return f.read()
    except OSError as exc:
        return None if exc.errno == errno.ENOENT else str(exc)
