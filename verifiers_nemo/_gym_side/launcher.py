"""A Gym server's interpreter, as a fork of its stack's warm supervisor: ``python app.py`` without a start-up.

nemo-gym starts every server as ``cd DIR && source VENV/bin/activate && ... python app.py`` (0.4: ``python`` from
``PATH``; 0.7: ``VENV/bin/python``), where ``VENV`` is the server's venv under ``+uv_venv_dir``, which the harness
links (``+skip_venv_if_present``). For a stack started warm that venv is a launcher venv: its ``bin/activate``
sources the Gym runtime's own ``activate`` and puts this launcher first on ``PATH``, and its ``bin/python`` is this
file, run by the runtime's interpreter. It does not start the server itself: it asks the stack's warm supervisor
(``warm_supervisor.py``: the leader of this process's session, listening on an abstract socket named after the
session, once ``SO_PEERCRED`` says the listener is this session's leader and this user's: such a name has no
permissions, and anyone may bind it first) to fork a process that becomes ``python ARGS`` here (``warm_child.py``),
handing over its argv, environment (``PATH`` without this launcher), working directory, umask, resource limits,
signal state and every descriptor it inherited (``SCM_RIGHTS``). Then it stands for that process: every signal it
gets is relayed to it (a pidfd, so never to a reused pid), and it exits as that process exits, with the same code
or by the same signal. If it is killed outright (SIGKILL), the supervisor kills that process the same way.

Where the warm path cannot serve (no warm supervisor in the session, a refusal, interpreter options in the
command), it becomes the plain interpreter: ``exec`` of the runtime's Python with the same arguments and
environment. Standard library only; its own cost is measured by ``bench/bench_warm_start.py``.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import sys
from typing import Any

_HERE = os.path.dirname(os.path.realpath(__file__))
_NOT_RELAYED = {signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGSEGV, signal.SIGBUS, signal.SIGILL}
"""Uncatchable, about this process's own children (it has none), or faults of this process itself."""


def _load(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"_vnr_{name}", os.path.join(_HERE, "..", "lib", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


def socket_name(sid: int) -> str:
    """The abstract socket a session's warm supervisor listens on."""
    return f"\0verifiers-nemo-warm-{os.getuid()}-{sid}"


def main() -> None:
    inherited = sorted(int(n) for n in os.listdir("/proc/self/fd"))
    inherited = [fd for fd in inherited if _is_open(fd)]
    path = os.environ.get("PATH", "").split(os.pathsep)
    if path and os.path.realpath(path[0]) == _HERE:  # there for nemo-gym 0.4's bare `python`: not the server's
        os.environ["PATH"] = os.pathsep.join(path[1:])
    if os.path.realpath(os.environ.get("_", "")) == os.path.realpath(__file__):
        os.environ["_"] = sys.executable  # bash's "command being run": the interpreter, as without a launcher
    argv = sys.argv[1:]
    if not argv or argv[0].startswith("-") or argv[0] == "" or not os.path.isfile(argv[0]):
        _plain(argv)  # interpreter options, -c, -m, a REPL, a missing script: the plain interpreter says it
    warm_child = _load("warm_child")
    ignored, blocked = warm_child.signal_state()
    relay = _Relay()
    relay.install()
    wire = _load("wire")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.connect(socket_name(os.getsid(0)))
        if not _is_the_warm_supervisor(wire.peer(sock)):
            raise PermissionError("another process holds the warm supervisor's socket name")
    except OSError:
        sock.close()
        relay.uninstall()
        _plain(argv)
    channel = wire.Channel(sock)
    request = {
        "argv": argv,
        "executable": sys.executable,
        "orig_argv0": sys.orig_argv[0],
        "interpreter": warm_child.interpreter(),
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "path": sys.path[1:],
        "fds": inherited,
        "ignored": ignored,
        "blocked": blocked,
        "umask": _umask(),
        "rlimits": warm_child.rlimits(),
    }
    try:
        channel.send(request, inherited)
        reply, fds = channel.recv()
    except OSError:
        reply, fds = None, []
    if not reply or "pid" not in reply or not fds:
        for fd in fds:
            os.close(fd)
        channel.close()
        relay.uninstall()
        _plain(argv)
    relay.attach(fds[0])
    for fd in inherited:  # the server holds them now, as it would have alone
        if fd > 2:
            os.close(fd)
    _devnull_stdio()
    try:
        status, _ = channel.recv()
    except (OSError, EOFError):
        status = None
    _mirror(status["status"] if status else None)


class _Relay:
    """Every catchable signal this process gets, sent on to the server process (queued until it exists)."""

    def __init__(self) -> None:
        self.pidfd: int | None = None
        self.pending: list[int] = []
        self.previous: dict[int, object] = {}

    def install(self) -> None:
        for sig in signal.valid_signals():
            if sig in _NOT_RELAYED:
                continue
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except (OSError, ValueError):
                continue

    def uninstall(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        for sig in self.pending:  # what it would have done to the interpreter that now starts in its place
            if self.previous.get(sig) == signal.SIG_DFL:
                os.kill(os.getpid(), sig)

    def attach(self, pidfd: int) -> None:
        self.pidfd = pidfd
        pending, self.pending = self.pending, []
        for sig in pending:
            self._send(sig)

    def _handle(self, sig: int, _frame: object) -> None:
        if self.pidfd is None:
            self.pending.append(sig)
        else:
            self._send(sig)

    def _send(self, sig: int) -> None:
        try:
            signal.pidfd_send_signal(self.pidfd, sig)  # type: ignore[arg-type]
        except ProcessLookupError:
            pass  # it has exited: its status is on the way


def _is_the_warm_supervisor(peer: tuple[int, int, int]) -> bool:
    """Whether the listener (``SO_PEERCRED``: the process that listened) is this session's leader, of this user:
    abstract socket names have no permissions, so another user may have bound it first; nothing is sent then."""
    pid, uid, _gid = peer
    return uid == os.getuid() and pid == os.getsid(0)


def _mirror(status: int | None) -> None:
    """Exit as the server process did: the same code, or the same signal (SIGKILL when the supervisor is gone
    without telling: the stack is being torn down)."""
    if status is not None and os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    sig = os.WTERMSIG(status) if status is not None and os.WIFSIGNALED(status) else signal.SIGKILL
    if sig not in (signal.SIGKILL, signal.SIGSTOP):
        signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default is to be ignored


def _plain(argv: list[str]) -> None:
    """Become the runtime's plain interpreter, with the same arguments and environment."""
    os.execv(sys.executable, [sys.orig_argv[0], *argv])


def _devnull_stdio() -> None:
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


if __name__ == "__main__":
    main()
