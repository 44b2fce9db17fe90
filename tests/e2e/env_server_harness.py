"""Drive verifiers' env server the way prime-rl does, from the test (or bench) process: the server and the
orchestrator-side client are separate processes of the verifiers venv (`env_server_driver.py`); this
module starts them, reads their output and inspects their process trees through /proc."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.e2e.conftest import wait_until
from tests.e2e.test_verifiers_env import VF_PYTHON, _environ

DRIVER = Path(__file__).with_name("env_server_driver.py")
MARK_VAR = "VFNEMO_ENV_SERVER_MARK"


def env_config(nemo_env: str, *, recorded: bool = False, api: str | None = None, **taskset: Any) -> dict[str, Any]:
    harness: dict[str, Any] = {"id": "nemo-gym-env"}
    if api is not None:
        harness["api"] = api
    return {
        "taskset": {"id": "nemo-gym-env", "nemo_env": nemo_env, "recorded": recorded, **taskset},
        "agent": {"harness": harness},
    }


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.2) -> Any:
    """The suite's one poller (``conftest.wait_until``), at this module's interval."""
    return wait_until(predicate, timeout, what, interval)


# -- /proc --------------------------------------------------------------------------------------------


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, ppid, session) of a process, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    fields = raw[raw.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[3])


def live_pids() -> dict[int, tuple[int, int]]:
    """Every live (non-zombie) process: pid -> (ppid, session)."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (stat := _stat(int(name))) is not None and stat[0] != "Z":
            out[int(name)] = (stat[1], stat[2])
    return out


def descendants(pid: int) -> list[int]:
    table = live_pids()
    children: dict[int, list[int]] = {}
    for child, (parent, _) in table.items():
        children.setdefault(parent, []).append(child)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def in_sessions(sessions: set[int]) -> list[int]:
    return [pid for pid, (_, session) in live_pids().items() if session in sessions]


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        return ""


def cwd(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return ""


def stdin_writers(pid: int) -> set[int]:
    """The other processes that hold the pipe a process reads as its stdin (a stack supervisor's: its owner's)."""
    try:
        pipe = os.readlink(f"/proc/{pid}/fd/0")
    except OSError:
        return set()
    if not pipe.startswith("pipe:"):
        return set()
    holders = set()
    for other in live_pids():
        if other == pid:
            continue
        try:
            fds = os.listdir(f"/proc/{other}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                if os.readlink(f"/proc/{other}/fd/{fd}") == pipe:
                    holders.add(other)
                    break
            except OSError:
                continue
    return holders


def listening_ports(pids: list[int]) -> set[int]:
    from tests.faults.helpers import listening_sockets_of

    return {sock.port for _, _, sock in listening_sockets_of(pids)}


# -- the server ---------------------------------------------------------------------------------------


class ServedEnv:
    """`env_server_driver.py serve`: verifiers' `serve_env` as prime-rl's env-server runs it, in its own
    process session, with its own verifiers-nemo cache folder and a marker in its environment (so every
    process it leaves, Gym's and Ray's included, can be found)."""

    def __init__(
        self,
        tmp: Path,
        config: dict[str, Any],
        *,
        pool: str,
        workers: int | None,
        multiplex: int = 128,
        environ: dict[str, str] | None = None,
    ):
        tmp.mkdir(parents=True, exist_ok=True)
        self.tmp = tmp
        self.config = config
        self.log_dir = tmp / "logs"
        self.log_dir.mkdir(exist_ok=True)
        self.cache = tmp / "cache"
        self.marker = f"{MARK_VAR}={uuid.uuid4().hex}"
        address_file = tmp / "address"
        argv = [str(VF_PYTHON), str(DRIVER), "serve", json.dumps(config), "--address-file", str(address_file)]
        argv += ["--log-dir", str(self.log_dir), "--pool", pool, "--multiplex", str(multiplex)]
        if workers is not None:
            argv += ["--workers", str(workers)]
        marked = {"VERIFIERS_NEMO_CACHE_DIR": str(self.cache), MARK_VAR: self.marker.split("=", 1)[1]}
        environ = _environ({**(environ or {}), **marked})
        self.output = (tmp / "serve.out").open("wb")
        self.proc = subprocess.Popen(  # stdin: held open while we live (the server stops at its EOF)
            argv,
            env=environ,
            stdin=subprocess.PIPE,
            stdout=self.output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()
        wait_for(lambda: address_file.exists() or self.proc.poll() is not None, 300, "the env server's address")
        assert self.proc.poll() is None, self.tail()
        self.address = address_file.read_text()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def tail(self, chars: int = 3000) -> str:
        logs = "".join(path.read_text(errors="replace") for path in sorted(self.log_dir.glob("*.log")))
        return ((self.tmp / "serve.out").read_text(errors="replace") + logs)[-chars:]

    def workers(self) -> list[int]:
        """The pool's worker processes (spawned `EnvServer`s), oldest first; [] for a lone server."""
        table = live_pids()
        return sorted(p for p, (parent, _) in table.items() if parent == self.pid and "spawn_main" in cmdline(p))

    def log(self, pid: int) -> str:
        path = self.log_dir / f"{pid}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def trace_ids(self, pid: int) -> set[str]:
        """Trace ids of the rollouts the process finished (verifiers' `rollout done` lines)."""
        return set(re.findall(r"rollout done: id=(\w+)", self.log(pid)))

    def stack_sessions(self, worker: int) -> set[int]:
        """The process sessions of a worker's Gym stacks: each runs under a supervisor that leads its own session
        and works in the launch's run folder, ``<cache>/runs/<name>-<owner pid>-<token>`` (``plan.run_id``). Found
        by that folder, not by descent: a supervisor started plain is the worker's child, one started warm a fork
        of the machine's warm parent (no descendant of the worker). The Ray head the stacks join is the
        machine's, none of these."""
        owned = re.compile(re.escape(f"{self.cache}/runs/") + r"[^/]+-" + str(worker) + r"-[0-9a-f]+")
        return {pid for pid, (_, session) in live_pids().items() if pid == session and owned.fullmatch(cwd(pid))}

    def stack_pids(self, worker: int) -> list[int]:
        """Every process of a worker's Gym stacks (their sessions)."""
        return in_sessions(self.stack_sessions(worker))

    def footprint(self, worker: int) -> dict[str, set]:
        """What a worker's Gym stack holds that must not collide with another worker's."""
        tree = self.stack_pids(worker)
        commands = [cmdline(p) for p in tree]
        cache = str(self.cache)
        return {
            "ports": listening_ports(tree),
            "ray_heads": {m for c in commands for m in re.findall(r"\+ray_head_node_address=([\d.]+:\d+)", c)},
            "run_dirs": {d for d in map(cwd, tree) if d.startswith(f"{cache}/runs/")},
            "log_dirs": {m for c in commands for m in re.findall(re.escape(cache) + r"/logs/[^/\s]+", c)},
        }

    def agent_pid(self, worker: int) -> int | None:
        """The Gym agent server of a worker's stack (``app.py`` run from a ``responses_api_agents/`` folder): the
        process that listens (started warm, its launcher runs there too, with the same command line)."""
        found = [
            pid
            for pid in self.stack_pids(worker)
            if "/responses_api_agents/" in cwd(pid) and cmdline(pid).endswith("app.py")
        ]
        return next((pid for pid in found if listening_ports([pid])), found[0] if found else None)

    def left_behind(self) -> list[str]:
        """Processes still alive that were started with this server's marker in their environment."""
        from tests.faults.helpers import pids_with_env

        return [f"{pid} {cmdline(pid)[:120]}" for pid in pids_with_env(self.marker)]

    def stop(self, timeout: float = 120) -> float:
        """SIGTERM the server (prime-rl's launcher stops it so); the seconds it took to exit."""
        started = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
                raise AssertionError(f"the env server did not exit within {timeout:g}s of SIGTERM") from None
        self.output.close()
        return time.monotonic() - started

    def kill(self) -> None:
        """Last resort (a failed test's teardown): the whole session of the server."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.output.close()


# -- the orchestrator side ------------------------------------------------------------------------------


class EpisodeClient:
    """`env_server_driver.py client`: loads the taskset itself and sends batches of episodes."""

    def __init__(
        self,
        tmp: Path,
        address: str,
        config: dict[str, Any],
        base_url: str,
        name: str = "client",
        environ: dict[str, str] | None = None,
    ):
        argv = [str(VF_PYTHON), str(DRIVER), "client", address, json.dumps(config), "--base-url", base_url]
        self.stderr = (tmp / f"{name}.err").open("wb")
        self.proc = subprocess.Popen(
            argv,
            env=_environ(environ),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            start_new_session=True,
        )
        self.err_path = tmp / f"{name}.err"
        self.lines: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.ready = wait_for(self._ready, 600, "the client's taskset")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                with self._lock:
                    self.lines.append(json.loads(line))

    def _ready(self) -> dict[str, Any] | None:
        if self.proc.poll() is not None:
            raise AssertionError(f"the client exited: {self.err_path.read_text(errors='replace')[-3000:]}")
        return next((line for line in list(self.lines) if line["event"] == "ready"), None)

    def send(self, batch: str, count: int, timeout: float | None = None, **options: Any) -> float:
        """Start ``count`` episodes at once; the monotonic time they were all handed to the client. ``options``:
        the batch's own ``client``, ``model``, ``sampling`` and ``traces`` file (see ``env_server_driver``)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"batch": batch, "count": count, "timeout": timeout, **options}) + "\n")
        self.proc.stdin.flush()
        wait_for(lambda: any(x["event"] == "sent" and x["batch"] == batch for x in list(self.lines)), 60, "sent")
        return time.monotonic()

    def episodes(self, batch: str) -> list[dict[str, Any]]:
        return [x for x in list(self.lines) if x["event"] == "episode" and x["batch"] == batch]

    def wait_episodes(self, batch: str, count: int, timeout: float) -> list[dict[str, Any]]:
        def enough() -> list[dict[str, Any]] | None:
            if self.proc.poll() is not None:
                raise AssertionError(f"the client exited: {self.err_path.read_text(errors='replace')[-3000:]}")
            done = self.episodes(batch)
            return done if len(done) >= count else None

        return wait_for(enough, timeout, f"{count} episodes of {batch!r}")

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.stderr.close()
