"""Supervise one launcher (``ng_run``, or ``ray start`` for the shared Ray head) and take its whole
session down when told to, or when the owner dies.

Run by the harness process as ``python supervisor.py SPEC_JSON`` in a new session (so it is the
session leader and every process ``ng_run`` starts, Ray's included, shares its session id). Its
stdin is a pipe from the owner: EOF means the owner is gone (even after SIGKILL), which is how a
stack never outlives the process that started it. An owner that stops the supervisor on purpose
writes a byte before closing the pipe; a bare EOF means the owner died, and the supervisor then also
removes the paths in the spec's ``remove_if_owner_dies`` (the run folder, the Ray head's files).

Teardown: SIGINT to every process of the session (servers shut down gracefully on it), wait
until the servers' ports are closed or ``grace_s`` passed, then SIGKILL every process left
in the session. Standard library only: this file runs in the Gym interpreter, which need not have
verifiers_nemo installed.
"""

from __future__ import annotations

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


def _port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.2):
            return True
    except OSError:
        return False


def main() -> int:
    spec = json.loads(sys.argv[1])
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    with open(spec["log"], "ab", buffering=0) as log:
        ng_run = subprocess.Popen(spec["argv"], cwd=spec["cwd"], stdin=subprocess.DEVNULL, stdout=log, stderr=log)

        owner_stopping = threading.Event()

        def watch_owner() -> None:
            while sys.stdin.buffer.read(1):
                owner_stopping.set()  # the owner says it stops us, and tidies up itself
            stop.set()

        threading.Thread(target=watch_owner, daemon=True).start()
        while not stop.is_set() and ng_run.poll() is None:
            stop.wait(0.2)

        # SIGINT to everyone at once: ng_run may be mid start-up (where it does not forward it),
        # and each server's uvicorn shuts down gracefully on it.
        for pid in _session_pids(os.getsid(0)):
            try:
                os.kill(pid, signal.SIGINT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + float(spec.get("grace_s", 5.0))
        ports = [tuple(hp) for hp in spec.get("ports", [])]
        while time.monotonic() < deadline and any(_port_open(h, p) for h, p in ports):
            time.sleep(0.05)
        for pid in _session_pids(os.getsid(0)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        code = ng_run.wait()
        log.write(f"[verifiers_nemo supervisor] stopped (launcher exit {code})\n".encode())
    if stop.is_set() and not owner_stopping.is_set():
        # The owner died without a word (SIGKILL, crash): nobody else will remove its files.
        for path in spec.get("remove_if_owner_dies", []):
            shutil.rmtree(path, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
