"""Supervise one launcher (``ng_run``, or ``ray start`` for the shared Ray head) and take its whole
session down when told to, or when the owner dies.

Run by the harness process as ``python supervisor.py SPEC_JSON`` in a new session (so it is the
session leader and every process ``ng_run`` starts, Ray's included, shares its session id). Its
stdin is a pipe from the owner: EOF means the owner is gone (even after SIGKILL), which is how a
stack never outlives the process that started it.

Leases (the machine's shared Ray head, ``spec["leases"]``): the launch has no single owner, so stdin
is not watched. Every process that holds the head keeps a file in the leases folder locked (``flock``,
released by the kernel however the holder dies). The supervisor checks them every ``poll_s``: a lease
whose lock it can take is a dead holder's and is removed; once no live lease has been seen for
``linger_s``, it takes the state lock, looks once more, removes the state file (so no process joins a
head that is stopping) and tears the session down.

Files: once its session is down, the supervisor itself removes the spec's ``remove`` paths (the run
folder, the Ray head's temporary folder), whoever stopped it, so they never outlive it even when the
owner dies halfway through its own clean-up. The spec's ``logs`` are kept when the launch failed (the
launcher exited on its own, or the owner wrote ``k`` before closing the pipe: it wants them for an
error message) and removed otherwise (the owner wrote ``s``, a stop on purpose, or died without a word).

Teardown: SIGINT to every process of the session (servers shut down gracefully on it), wait
until the servers' ports are closed or ``grace_s`` passed, then SIGKILL every process left
in the session. Standard library only: this file runs in the Gym interpreter, which need not have
verifiers_nemo installed.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time


def _session_pids(sid: int) -> list[int]:
    me = os.getpid()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if int(fields[3]) == sid:  # fields after "pid (comm)": state ppid pgrp session ...
            pids.append(int(entry))
    return pids


def _signal_session(sig: signal.Signals, spare: frozenset[int] = frozenset()) -> None:
    """Send ``sig`` to every other process of this session but ``spare``."""
    for pid in _session_pids(os.getsid(0)):
        if pid in spare:
            continue
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            pass


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def _teardown(spec: dict, spare: frozenset[int] = frozenset()) -> None:
    """SIGINT to the session, wait for its ports to close (at most ``grace_s``), SIGKILL what is left.

    ``spare``: processes the SIGINT is not sent to (a warm supervisor's forked servers, which get it from their
    launcher, as any signal: sent to both, they would get it twice); the SIGKILL reaches every process."""
    _signal_session(signal.SIGINT, spare)
    deadline = time.monotonic() + float(spec.get("grace_s", 5.0))
    ports = [tuple(hp) for hp in spec.get("ports", [])]
    while time.monotonic() < deadline and any(_port_open(h, p) for h, p in ports):
        time.sleep(0.05)
    _signal_session(signal.SIGKILL)


def _start_rearguard(spec: dict) -> None:
    """Fork a process that tears the session down if this supervisor is killed before it could.

    Ray kills a dead worker's direct children with SIGKILL (its ``kill_child_processes_on_worker_exit``):
    when the owner is a Ray actor, that is this supervisor, which then cannot take its session down. The
    rearguard, a grandchild of the owner, holds the read end of a pipe whose write end only this
    supervisor holds: EOF means the supervisor is gone. After a normal stop the supervisor's own teardown
    has killed the rearguard already (it is in the session); otherwise it does the teardown itself."""
    read_end, write_end = os.pipe()
    if os.fork() != 0:
        os.close(read_end)  # the write end stays open, unused, for as long as this supervisor lives
        return
    os.close(write_end)
    try:
        os.close(0)  # the owner's pipe: the supervisor reads it (its bytes are not for us)
        while os.read(read_end, 1):
            pass
        _teardown(spec)
        for path in spec.get("remove", []):
            _remove(path)
    finally:
        os._exit(0)


def _live_leases(folder: str) -> int:
    """How many leases of ``folder`` a live holder keeps locked; the others (dead holders') are removed."""
    live = 0
    try:
        names = os.listdir(folder)
    except OSError:
        return 0
    for name in names:
        path = os.path.join(folder, name)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            live += 1  # its holder keeps it locked
        else:
            if os.path.exists(path) and os.path.samestat(os.fstat(fd), os.stat(path)):
                os.unlink(path)  # a holder that died without letting go
        finally:
            os.close(fd)
    return live


def _watch_leases(leases: dict, stop: threading.Event, launcher: subprocess.Popen) -> bool:
    """Return once the head has had no live holder for ``linger_s`` (the state file removed under the
    state lock, so that no process joins it meanwhile), or the launcher exited, or ``stop`` is set;
    True unless the launcher exited on its own (a failure: its logs are kept)."""
    idle_since = time.monotonic()
    while not stop.is_set() and launcher.poll() is None:
        if _live_leases(leases["dir"]):
            idle_since = time.monotonic()
        elif time.monotonic() - idle_since >= float(leases.get("linger_s", 0.0)):
            with open(leases["lock"], "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if not _live_leases(leases["dir"]):
                    _remove_state(leases["state"])
                    return True
            idle_since = time.monotonic()
        stop.wait(float(leases.get("poll_s", 0.5)))
    return stop.is_set()


def _remove_state(path: str) -> None:
    """Remove the head's state file if it names this supervisor (a newer head's is left alone)."""
    try:
        with open(path) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return
    if state.get("pid") == os.getpid():
        _remove(path)


def _detach() -> None:
    """Become a grandchild of the process that started us, leading a session of our own, and tell it our
    pid on stdout. A leased launch belongs to no process: Ray SIGKILLs a dead actor's direct children,
    which must not take down a head that other processes hold."""
    pid = os.fork()
    if pid != 0:
        os.write(1, f"{pid}\n".encode())
        os._exit(0)
    os.setsid()
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.close(devnull)


def main() -> int:
    spec = json.loads(sys.argv[1])
    if spec.get("leases"):
        _detach()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    _start_rearguard(spec)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with open(spec["log"], "ab", buffering=0) as log:
        # title_room: blank room after the arguments, which a warm parent's forks write their own command lines into
        argv = [*spec["argv"], *([" " * spec["title_room"]] if spec.get("title_room") else [])]
        ng_run = subprocess.Popen(argv, cwd=spec["cwd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        owner_said: list[bytes] = []

        def watch_owner() -> None:
            while byte := sys.stdin.buffer.read(1):
                owner_said.append(byte)  # s: a stop on purpose; k: the same, keeping the logs
            stop.set()

        leases = spec.get("leases")
        on_purpose = True
        if leases:
            on_purpose = _watch_leases(leases, stop, ng_run)
        else:
            threading.Thread(target=watch_owner, daemon=True).start()
            while not stop.is_set() and ng_run.poll() is None:
                stop.wait(0.2)

        if leases:  # stopping, or the launcher died: no process may join it from now on
            with open(leases["lock"], "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                _remove_state(leases["state"])
        # SIGINT to everyone at once: ng_run may be mid start-up (where it does not forward it),
        # and each server's uvicorn shuts down gracefully on it.
        _teardown(spec)
        code = ng_run.wait()
        log.write(f"[verifiers_nemo supervisor] stopped (launcher exit {code})\n".encode())
    # A failure: the launcher exited on its own, or the owner keeps the logs.
    failed = not on_purpose if leases else (not stop.is_set() or b"k" in owner_said)
    for path in [*spec.get("remove", []), *([] if failed else spec.get("logs", []))]:
        _remove(path)
    return 0


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            os.unlink(path)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())
