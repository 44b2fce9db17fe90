"""The machine's warm parents of Gym runtimes, held by leases as the shared Ray head is, and this process's
requests to them: a stack's supervisor forked warm (``supervise``).

A warm parent (``_gym_side/zygote.py``) has imported Gym's third-party modules once; a stack started through it
forks its supervisor, ``ng_run`` and every server instead of starting interpreters (see there and
``_gym_side/warm_supervisor.py``). Here: which warm parent a process may use, starting it, holding it, asking it.

Which: one per user, Gym runtime, and the state the preloaded modules saw when they were imported, since a fork
keeps it: the values of the environment variables they read (the probe's list: ``probe``), of the variables
native libraries and the interpreter read at start (``PYTHON*``, locale, ``LD_*``, ``RAY_*``, thread and
allocator settings...: ``warm_child.NATIVE``), and the process's cgroup, namespaces, resource limits, priority and
CPU affinity. Two
processes that agree on all of that (two evals from one shell, a trainer's env-server workers) share one; the
others get their own. Everything else of a stack (its own variables, the Ray head's token, the requester's
umask and signal state) is given per request and set in the fork.

Held: ``ray_dir()/warm-<key>/`` holds ``lock``, ``state.json`` (its supervisor's pid and start time, its socket,
its log) and ``leases/``; the warm parent runs under the plain supervisor in lease mode (``start_detached``),
which stops it as soon as no process holds a lease, SIGKILLed holders included. Stacks already forked from it
do not depend on it: each leads its own session under its own owner.

Where the warm start cannot serve (no launcher venv for this runtime, the warm parent could not prepare: threads,
descriptors, signal handlers left by the preload...), ``WarmStartUnavailable`` says why, and the stack starts
the plain way (said once per process and reason). ``VERIFIERS_NEMO_WARM_START=0`` (or
``StackConfig.warm_start=False``) turns the warm start off.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .._exceptions import StackStartError
from .._gym import GymRuntime, cache_dir
from .._gym.runtime import site_packages
from .._gym_side import wire
from .._gym_side.warm_child import (
    ENV_ROOM,
    NATIVE,
    READ_LATE,
    TITLE_ROOM,
    rlimits,
    signal_state,
)
from .._gym_side.warm_supervisor import SERVER_STARTS_PLAIN
from . import waiting
from .leases import give_up_lease, lease_spec, locked, read_state, start_time, take_lease, write_state
from .logs import logs_dir
from .private_dir import process_is_mine
from .procs import kill_session, remove_path
from .ray_head import helper_folder
from .registry import Registry
from .supervisor import GYM_SIDE, WarmSupervisor, start_detached

logger = logging.getLogger(__name__)

WARM_START_ENV_VAR = "VERIFIERS_NEMO_WARM_START"
_SOURCES = ("zygote", "warm_supervisor", "warm_child", "supervisor", "wire", "launcher")
_JEMALLOC_CONF = "JE_ARROW_MALLOC_CONF"
_POLL_S = 0.5
_PROBE_TIMEOUT_S = 300.0


class WarmStartUnavailable(Exception):
    """The warm start cannot serve this stack: why (the stack starts the plain way). ``broken``: the warm parent
    itself cannot serve anyone (it could not prepare), not merely this stack. ``transient``: it did not answer
    (stopping, or killed): the stack's next start asks again, a warm parent that lives."""

    def __init__(self, reason: str, broken: bool = False, transient: bool = False) -> None:
        super().__init__(reason)
        self.broken = broken
        self.transient = transient


def warm_start_wanted(asked: bool | None) -> bool:
    """``asked`` (``StackConfig.warm_start``) when set, else ``VERIFIERS_NEMO_WARM_START`` (on unless ``0``)."""
    if asked is not None:
        return asked
    return os.environ.get(WARM_START_ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def gym_side_digest() -> str:
    """The Gym-side code a warm parent runs: a warm parent of other code is another one."""
    digest = hashlib.sha256()
    for name in _SOURCES:
        digest.update((GYM_SIDE / f"{name}.py").read_bytes())
    return digest.hexdigest()[:16]


def probe(runtime: GymRuntime, env: Mapping[str, str]) -> tuple[Path, dict[str, Any]]:
    """What Gym's import chain loads in ``runtime`` (``zygote.py --probe``: the modules, those that read the
    working directory, the variables they read), run once per runtime and cached; its path and contents."""
    stamp = [str(runtime.python), runtime.nemo_gym_version, gym_side_digest()]
    stamp += [str(os.stat(d).st_mtime_ns) for d in site_packages(runtime)]
    path = cache_dir() / "warm" / f"probe-{hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:16]}.json"
    try:
        return path, json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="vnr-probe-") as cwd:
        try:
            out = subprocess.run(
                [str(runtime.python), str(GYM_SIDE / "zygote.py"), "--probe"],
                cwd=cwd,
                env=dict(env),
                capture_output=True,
                text=True,
                timeout=_PROBE_TIMEOUT_S,
                check=True,
            ).stdout
            listed = json.loads(out.strip().splitlines()[-1])
        except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
            raise WarmStartUnavailable(f"listing Gym's imports failed: {exc}") from exc
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    tmp.write_text(json.dumps(listed))
    os.replace(tmp, path)
    return path, listed


def key(runtime: GymRuntime, env: Mapping[str, str], env_read: list[str]) -> str:
    """Which warm parent a process with environment ``env`` may use (see the module docstring)."""
    read = set(env_read)
    seen = {k: v for k, v in sorted(env.items()) if (k in read or NATIVE.match(k)) and k not in READ_LATE}
    place = {what: _readlink(f"/proc/self/{what}") for what in ("ns/mnt", "ns/net", "ns/pid", "ns/ipc", "ns/user")}
    with open("/proc/self/cgroup") as f:
        place["cgroup"] = f.read()
    attributes = {
        "uid": os.getuid(),
        "gid": os.getgid(),
        "groups": sorted(os.getgroups()),
        "rlimits": rlimits(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "cpus": sorted(os.sched_getaffinity(0)),
    }
    stamp = [gym_side_digest(), str(runtime.python), seen, place, attributes]
    return hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]


class WarmParent:
    """This process's hold on one machine's warm parent: a lease, and where it listens. Made by
    ``acquire_warm_parent`` (one per process and key, refcounted by its stacks); ``supervise`` forks a stack's
    supervisor from it (waiting, the first time, until it is ready)."""

    def __init__(self, runtime: GymRuntime, env: Mapping[str, str], folder: Path, preload: Path) -> None:
        self.folder = folder
        with locked(folder / "lock"):
            self._lease: tuple[Path, int] | None = take_lease(folder / "leases")
            try:
                state = _valid(read_state(folder / "state.json"), folder)
                if state is not None and not _usable(state):
                    _remove_remains(state)
                    state = None
                if state is None:
                    state = _start(runtime, env, folder, preload)
            except BaseException:
                self.leave()
                raise
        self.state = state
        self._ready = False

    @property
    def pid(self) -> int:
        """Its supervisor's pid, which is also its session id."""
        return int(self.state["pid"])

    @property
    def log_path(self) -> Path:
        return Path(self.state["log"])

    @property
    def alive(self) -> bool:
        return self._lease is not None and start_time(self.pid) == self.state["started"]

    def supervise(
        self, spec: dict[str, Any], env: Mapping[str, str], cwd: Path, deadline: waiting.Deadline | None = None
    ) -> WarmSupervisor:
        """Fork a stack's supervisor for ``spec`` (as ``start_supervised`` would start it: this process its
        owner, ``env`` its environment, ``cwd`` its folder), waiting first, if need be, until the warm parent is
        ready (as long as it makes progress, within ``deadline``: ``waiting``). ``WarmStartUnavailable`` when it
        cannot."""
        self._wait_ready(deadline or waiting.deadline())
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        ignored, blocked = signal_state()
        request = {
            "spec": spec,
            "cwd": str(cwd),
            "env": dict(env),
            "owner": {"ignored": ignored, "blocked": blocked, "umask": _umask(), "rlimits": rlimits()},
        }
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        channel = wire.Channel(sock)
        try:
            sock.settimeout(30.0)
            _connect_checked(sock, self.state)
            channel.send(request, [read_end])
            reply, fds = channel.recv()
        except (OSError, EOFError, ValueError) as exc:
            os.close(write_end)
            said = f"the warm parent (pid {self.pid}) did not answer: {exc}"
            raise WarmStartUnavailable(said, transient=True) from exc
        finally:
            os.close(read_end)
            channel.close()
        if not reply or "pid" not in reply or len(fds) != 1:
            os.close(write_end)
            for fd in fds:
                os.close(fd)
            refused = (reply or {}).get("refused", "no answer")
            raise WarmStartUnavailable(f"the warm parent refused: {refused}")
        return WarmSupervisor(int(reply["pid"]), fds[0], write_end)

    def _wait_ready(self, deadline: waiting.Deadline) -> None:
        """Until its socket accepts connections; ``WarmStartUnavailable`` with its log's reason if it exits, or when
        it stalls or the start's time is up."""
        wait = waiting.Waiting("the warm parent of the Gym runtime", deadline, sid=self.pid, log=self.log_path)
        while not self._ready:
            probe_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                _connect_checked(probe_sock, self.state)
                self._ready = True
            except PermissionError as exc:
                raise WarmStartUnavailable(str(exc)) from None
            except OSError:
                if not self.alive:
                    said = self._reason()
                    if "cannot serve" not in said:  # stopped from outside, not unable to prepare: another may serve
                        raise WarmStartUnavailable(f"the warm parent stopped while preparing: {said}") from None
                    reason = f"the warm parent exited while preparing: {said}"
                    _unavailable[(str(self.folder.parent), self.folder.name)] = reason  # not asked again here
                    raise WarmStartUnavailable(reason, broken=True) from None
                try:
                    wait.check()
                except StackStartError as exc:
                    raise WarmStartUnavailable(str(exc).split("\n", 1)[0]) from None
                time.sleep(0.02)
            finally:
                probe_sock.close()

    def _reason(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return f"(no log at {self.log_path})"
        said = [line for line in lines if "cannot serve" in line]
        return (said or lines[-5:] or ["(empty log)"])[-1]

    def leave(self) -> None:
        """Give up this process's lease (idempotent); the warm parent stops once no process holds one."""
        lease, self._lease = self._lease, None
        if lease is not None:
            give_up_lease(lease)


_STATE_KINDS = {"pid": int, "started": str, "socket": str, "log": str}


def _valid(state: dict[str, Any] | None, folder: Path) -> dict[str, Any] | None:
    """A state file's contents when they are what ``_start`` writes, the socket in ``folder`` itself; else None."""
    if state is None or any(type(state.get(k)) is not kind for k, kind in _STATE_KINDS.items()):
        return None
    return state if Path(state["socket"]).parent == folder else None


def _connect_checked(sock: socket.socket, state: dict[str, Any]) -> None:
    """Connect to the warm parent's socket, and make sure the listener is the warm parent of this user that the
    state names (``SO_PEERCRED``: this user's process, in its supervisor's session) before anything is sent.
    ``PermissionError`` when it is not (the connection is closed)."""
    sock.connect(state["socket"])
    pid, uid, _ = wire.peer(sock)
    try:
        session = os.getsid(pid)
    except OSError:
        session = -1
    if uid != os.getuid() or session != int(state["pid"]):
        sock.close()
        raise PermissionError(
            f"the process listening on {state['socket']} (pid {pid}, uid {uid}) is not this user's warm parent"
        )


def _usable(state: dict[str, Any]) -> bool:
    """Whether a warm parent the state file names may be joined: its supervisor is the same live process, and its
    socket, once there (it appears when the warm parent has prepared), takes connections. One whose socket refuses
    them has stopped serving: its warm parent exited, its supervisor is tearing it down (as the Ray head's GCS port
    tells a dead head)."""
    if start_time(int(state["pid"])) != state["started"] or not process_is_mine(int(state["pid"])):
        return False
    probe_sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        probe_sock.settimeout(2.0)
        _connect_checked(probe_sock, state)
    except (FileNotFoundError, TimeoutError, BlockingIOError):
        return True  # preparing, or too busy to accept at once: alive
    except OSError:
        return False  # refused: nothing listens there any more
    finally:
        probe_sock.close()
    return True


def _remove_remains(state: dict[str, Any]) -> None:
    """What a warm parent that stopped serving left (under the folder's lock, before its successor starts): its
    supervisor's session, still stopping, and its socket. Stacks forked from it lead sessions of their own."""
    if start_time(int(state["pid"])) == state["started"] and process_is_mine(int(state["pid"])):
        kill_session(int(state["pid"]), timeout=5.0)
    remove_path(Path(state["socket"]))  # in the warm parent's own checked folder (``_valid``)


def _start(runtime: GymRuntime, env: Mapping[str, str], folder: Path, preload: Path) -> dict[str, Any]:
    """Start a warm parent (under the folder's lock) without waiting for it; its state. Its socket is its own
    (``socket-<token>``), never a predecessor's: a warm parent still stopping keeps listening on its socket until
    its supervisor has taken it down, and removes that socket then."""
    logs = logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(4)
    log_path = logs / f"warm-parent-{folder.name}-{os.getpid()}-{token}.log"
    sock = folder / f"socket-{token}"
    own_env = {_JEMALLOC_CONF: env.get(_JEMALLOC_CONF)}
    config = {"socket": str(sock), "preload": str(preload), "own_env": own_env}
    spec = {
        "argv": [str(runtime.python), str(GYM_SIDE / "zygote.py"), json.dumps(config)],
        "title_room": TITLE_ROOM,
        "cwd": str(folder),
        "log": str(log_path),
        "grace_s": 2.0,
        "ports": [],
        "remove": [str(sock)],
        "logs": [str(log_path)],
        "leases": lease_spec(folder, "state.json", _POLL_S),
    }
    jemalloc = ",".join(filter(None, [env.get(_JEMALLOC_CONF), "background_thread:false"]))
    try:
        # ENV_ROOM: removed by the warm parent at once (see warm_child)
        pid = start_detached(runtime.python, spec, cwd=folder, env={**env, _JEMALLOC_CONF: jemalloc, **ENV_ROOM})
    except OSError as exc:
        raise WarmStartUnavailable(f"the warm parent did not start: {exc}") from exc
    state = {"pid": pid, "started": start_time(pid) or "", "socket": str(sock), "log": str(log_path)}
    write_state(folder / "state.json", state)
    logger.debug("Started the warm parent of %s (supervisor pid %d, log %s)", runtime.python, pid, log_path)
    return state


_STALE_S = 3600.0


def _sweep(heads_dir: Path, keep: Path) -> None:
    """Remove the folders of warm parents that stopped more than an hour ago (one per key: an environment that
    changed leaves one behind), each under its lock, taken without waiting, so a process that uses it keeps it."""
    import fcntl
    import shutil

    try:
        folders = [f for f in heads_dir.iterdir() if f.name.startswith("warm-") and f != keep]
    except OSError:
        return
    for folder in folders:
        try:
            if time.time() - folder.stat().st_mtime < _STALE_S or (folder / "state.json").exists():
                continue
            with open(folder / "lock", "a") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if not (folder / "state.json").exists() and not any((folder / "leases").glob("*")):
                    shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


# -- one lease per (process, warm parent), refcounted by the stacks that use it ------------------------------

_parents: Registry[Path, WarmParent] = Registry(reusable=lambda parent: parent.alive)
_unavailable: dict[tuple[str, str], str] = {}
"""Per warm parent (heads folder, key): why it could not prepare, in this process (it is not tried again)."""


def acquire_warm_parent(runtime: GymRuntime, env: Mapping[str, str], heads_dir: Path | None = None) -> WarmParent:
    """This process's hold on the machine's warm parent for ``runtime`` and ``env`` (the environment Gym
    processes get, less a stack's own variables): joined, or started if none runs; refcounted by the process's
    stacks. ``WarmStartUnavailable`` when there can be none (said by the caller)."""
    from .launchers import launcher_unusable

    unusable = launcher_unusable(runtime)
    if unusable is not None:
        raise WarmStartUnavailable(unusable)
    preload, listed = probe(runtime, env)
    folder = helper_folder(heads_dir, f"warm-{key(runtime, env, listed.get('env_read', []))}")
    _sweep(folder.parent, keep=folder)
    failed = _unavailable.get((str(folder.parent), folder.name))
    if failed is not None:
        raise WarmStartUnavailable(failed)
    parent, spent = _parents.acquire(folder, lambda: WarmParent(runtime, env, folder, preload))
    if spent is not None:
        spent.leave()
    return parent


_said: set[tuple[str, ...]] = set()
"""What this process has said of plain starts already (each said once per process)."""


def _warn_once(key: tuple[str, ...], message: str, *args: str) -> None:
    if key not in _said:
        _said.add(key)
        logger.warning(message, *args)


def say_unavailable(reason: str) -> None:
    """Log, once per process and reason, that Gym processes start the plain way, and why."""
    _warn_once((reason,), "Gym processes start the plain way (no warm start): %s", reason)


def say_plain_servers(stack_name: str, log_path: Path) -> None:
    """Log, once per process and reason, each server of a stack that its warm supervisor started the plain
    way (``log_path``: the stack's log, where the supervisor wrote why)."""
    head, _, tail = SERVER_STARTS_PLAIN.partition("{server}")
    head, marker = f"[verifiers_nemo] {head}", tail.partition("{reason}")[0]
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        server, found, reason = line.removeprefix(head).partition(marker)
        if line.startswith(head) and found:
            _warn_once(
                (server, reason),
                "Gym stack %s: %s starts the plain way (no warm start; it runs the same, its start is slower): %s",
                stack_name,
                server,
                reason,
            )


def release_warm_parent(parent: WarmParent) -> None:
    """Drop one reference; the last one gives up the process's lease."""
    if _parents.release(parent.folder, parent) is not False:
        parent.leave()


def stop_all_warm_parents() -> None:
    """Give up every lease of this process (at exit, after the stacks)."""
    for parent in _parents.clear():
        parent.leave()
