"""The machine's shared Ray head for Gym stacks: one per user, Ray version and Python, held by leases.

Every nemo-gym server is a Ray driver (``ray.init`` when it starts), so every ``ng_run`` starts a Ray
cluster of its own unless it is given ``+ray_head_node_address`` (nemo-gym's public seam for an existing
cluster). That cluster was half of a stack's processes and most of its memory. Here every process of the
machine that starts a Gym stack joins one head instead: the first starts it (``ray start --head --block``
from the Gym runtime, lean: no autoscaler monitor, no log monitor, no prestarted workers, node reports once
a minute), later ones join it, and it stops once no process holds it any more.

On disk, under ``ray_dir()`` (the user's checked folder: ``private_dir.py``; ``VERIFIERS_NEMO_RAY_DIR``, else
``$XDG_RUNTIME_DIR/verifiers-nemo``, else ``<tmp>/vnr-ray-<uid>``), one folder per head key (``head_key``: Ray's
version and the runtime's Python, which Ray requires to match):

- ``lock``: ``flock``-ed while a process starts or joins the head, and by the head's supervisor when it
  decides to stop, so that concurrent first starts race safely and no process joins a stopping head;
- ``head.json`` (0600): where the running head is (address, token, its supervisor's pid), written once
  its node is registered, so a process that joins can connect a driver at once;
- ``leases/``: a file per holding process, ``flock``-ed by it for as long as it holds the head. The
  kernel releases that lock however the holder dies (SIGKILL included); the head's supervisor removes
  such dead leases and stops the head once none is live (``_gym_side/supervisor.py``).

What ``head.json`` names is verified before it is used: the supervisor is a process of this user, the GCS port is
listened on by this user's sockets only (``/proc/net/tcp``), and only a Ray temporary folder of this user's is ever
removed. The head binds 127.0.0.1 only, keeps its Ray files in a temporary folder of its own (not the machine-wide
``/tmp/ray``), and requires a random token kept in ``head.json`` (Ray's token authentication): only the
user's own processes can join it. Processes' stacks do not see each other: each has its own ports, run and
log folders, and each Gym server is a Ray driver with a namespace of its own.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import secrets
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from .._exceptions import StackStartError
from .._gym import GymRuntime
from .._gym.runtime import site_packages
from . import waiting
from .config import HOST
from .leases import give_up_lease, lease_spec, locked, read_state, start_time, take_lease, write_state
from .logs import logs_dir
from .private_dir import (
    RAY_DIR_ENV_VAR,
    UnsafeFolder,
    ensure_child,
    ensure_private,
    owned_by_me,
    private_root,
    process_is_mine,
)
from .procs import kill_session, listener_uids, port_state, remove_path, reserve_ports, session_pids
from .registry import Registry
from .supervisor import start_detached

logger = logging.getLogger(__name__)

__all__ = ["RAY_DIR_ENV_VAR"]
RAY_NODE_TIMED_OUT = "The current node timed out during startup"
"""What ``ray start`` raises when its node did not register within its own fixed 30 s (``ray._private.node``)."""
READY_LINE = "Ray runtime started."
"""What ``ray start`` prints once its node is registered with the GCS (it waits for that before printing):
from then on a driver's ``ray.init`` finds the node at once."""
_START_ATTEMPTS = 3
_POLL_S = 0.5
"""How often the head's supervisor looks at the leases: the head outlives its last holder by about this."""
# No idle worker processes: Ray would prestart one per CPU when a driver connects, and Gym servers run no
# Ray task unless an environment submits one (code execution, some judges), which then starts workers on demand.
# The dashboard agent's node reports (psutil stats of every Ray process, every 2.5 s by default) feed a dashboard
# this head does not run: once a minute. Measured on 2 cores, an idle head with one stack: the agent's CPU
# 0.26 s per 30 s at the default, 0.05 s at this; the head is held for as long as its holders run.
_LEAN_HEAD_ENV = {
    "RAY_enable_worker_prestart": "0",
    "RAY_prestart_worker_first_driver": "0",
    "REPORTER_UPDATE_INTERVAL_MS": "60000",
}


def ray_dir() -> Path:
    """Where the machine's shared heads (and warm parents) are kept: the user's checked folder, created if missing
    (``private_dir.private_root``); ``StackStartError`` in one line when the folder named by
    ``VERIFIERS_NEMO_RAY_DIR`` fails a check."""
    try:
        return private_root()
    except UnsafeFolder as exc:
        raise StackStartError(str(exc)) from None


def helper_folder(heads_dir: Path | None, name: str) -> Path:
    """The checked folder ``name`` of one shared helper under ``heads_dir`` (checked too) or ``ray_dir()``."""
    try:
        root = ensure_private(heads_dir, fix="remove it, or name a folder of your own") if heads_dir else ray_dir()
        return ensure_child(root, name)
    except UnsafeFolder as exc:
        raise StackStartError(str(exc)) from None


@functools.cache
def head_key(runtime: GymRuntime) -> str:
    """The runtimes that may share a head: the same Ray release on the same Python build (Ray refuses a
    driver whose Ray or Python version differs from the cluster's), in the same network namespace (a head binds
    127.0.0.1, which is another address in another namespace: ``unshare -n``, ``ip netns exec``)."""
    ray_version = _ray_version(runtime)
    base = Path(os.path.realpath(runtime.python))  # a venv's python links to the interpreter it was made from
    digest = hashlib.sha256(f"{base}\0{_network_namespace()}".encode()).hexdigest()[:8]
    return f"ray{ray_version}-{base.name}-{digest}"


def _network_namespace() -> str:
    """This process's network namespace (``net:[4026531840]``), or ``""`` where /proc does not say."""
    try:
        return os.readlink("/proc/self/ns/net")
    except OSError:
        return ""


def _ray_version(runtime: GymRuntime) -> str:
    for folder in (runtime.root, *site_packages(runtime)):
        found = sorted(Path(folder).glob("ray-*.dist-info"))
        if found:
            return found[-1].name[len("ray-") : -len(".dist-info")]
    raise StackStartError(f"The Gym runtime {runtime.python} has no Ray (nemo-gym needs it): reinstall nemo-gym there.")


@dataclass(frozen=True)
class HeadState:
    """What ``head.json`` says of a running head."""

    gcs_port: int
    token: str
    pid: int
    """The head's supervisor: its session holds every process of the head."""
    started: str
    """The supervisor's start time (``/proc/PID/stat``), so that a reused pid is not taken for the head."""
    temp_dir: str
    log: str

    @property
    def address(self) -> str:
        return f"{HOST}:{self.gcs_port}"

    def mine(self) -> bool:
        """Whether the supervisor it names is this user's same live process."""
        return start_time(self.pid) == self.started and process_is_mine(self.pid)

    def alive(self) -> bool:
        """Whether the head still runs: its supervisor is this user's same live process and its GCS listens, on a
        port no other user listens on (a connection that times out on a loaded machine is not taken for a dead
        head, which would be torn down)."""
        if not self.mine():
            return False
        listening = port_state(HOST, self.gcs_port, timeout=2.0) != "refused"
        return listening and listener_uids(self.gcs_port) == {os.getuid()}


class RayHead:
    """This process's hold on the machine's shared Ray head for one Gym runtime: a lease, and where the
    head is. Made by ``acquire_ray_head`` (one per process and head key, refcounted by its stacks)."""

    def __init__(
        self,
        runtime: GymRuntime,
        env: Mapping[str, str],
        folder: Path | None = None,
        deadline: waiting.Deadline | None = None,
    ) -> None:
        self.runtime = runtime
        self.folder = helper_folder(folder.parent, folder.name) if folder else _folder(runtime)
        with locked(self.folder / "lock"):
            self._lease: tuple[Path, int] | None = take_lease(self.folder / "leases")
            try:
                state = _read_state(self.folder / "head.json")
                if state is None or not state.alive():
                    if state is not None:
                        _remove_remains(state)
                    state = _start_head(runtime, env, self.folder, deadline or waiting.deadline())
            except BaseException:
                self.leave()
                raise
        self.state = state
        logger.info("Gym stacks join the Ray head at %s (supervisor pid %d)", self.address, self.pid)

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS, for ``+ray_head_node_address``."""
        return self.state.address

    @property
    def pid(self) -> int:
        """The head's supervisor's pid, which is also the head's session id."""
        return self.state.pid

    @property
    def gcs_port(self) -> int:
        return self.state.gcs_port

    @property
    def temp_dir(self) -> Path:
        """The head's Ray files (sessions, sockets, logs): removed when it stops."""
        return Path(self.state.temp_dir)

    @property
    def log_path(self) -> Path:
        return Path(self.state.log)

    @property
    def token(self) -> str:
        return self.state.token

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to join this head."""
        return _join_env(self.state.token)

    @property
    def alive(self) -> bool:
        return self._lease is not None and start_time(self.pid) == self.state.started

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def leave(self) -> None:
        """Give up this process's lease (idempotent). The head stops about ``_POLL_S`` after its last
        holder leaves; it is not stopped here, since other processes may hold it."""
        lease, self._lease = self._lease, None
        if lease is None:
            return
        give_up_lease(lease)


def join_env_without_token() -> dict[str, str]:
    """What a process needs in its environment to join any of these heads, less the head's token (which Ray reads
    only when a driver connects; its authentication mode it reads when it is imported)."""
    return {
        "RAY_AUTH_MODE": "token",
        "RAY_USAGE_STATS_ENABLED": "0",
        # Ray's switch for single-machine clusters: with it off, every Ray process binds 127.0.0.1.
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    }


def _join_env(token: str) -> dict[str, str]:
    return {**join_env_without_token(), "RAY_AUTH_TOKEN": token}


def _read_state(path: Path) -> HeadState | None:
    state = read_state(path)
    try:
        head = HeadState(**state) if state is not None else None
    except TypeError:
        return None
    kinds = (int, str, int, str, str, str)
    if head is not None and not all(type(v) is k for v, k in zip(asdict(head).values(), kinds, strict=True)):
        return None
    return head


def _write_state(path: Path, state: HeadState) -> None:
    write_state(path, asdict(state))


def _remove_remains(state: HeadState) -> None:
    """What a head that died without its supervisor's clean-up left: its processes and its folder (only a process
    of this user's, and only a Ray temporary folder of this user's: what ``_start_head_once`` made)."""
    if state.mine():
        kill_session(state.pid, timeout=5.0)
    remove_head_temp_dir(Path(state.temp_dir))


def remove_head_temp_dir(temp_dir: Path) -> None:
    """Remove a head's Ray temporary folder: only one ``_start_head_once`` could have made, and only this user's."""
    ours = temp_dir.parent == Path(tempfile.gettempdir()) and temp_dir.name.startswith("vnr-ray-")
    if ours and owned_by_me(temp_dir):
        remove_path(temp_dir)


def _start_head(runtime: GymRuntime, env: Mapping[str, str], folder: Path, deadline: waiting.Deadline) -> HeadState:
    """Start a head (under the folder's lock) and wait until its node is registered; a start that fails
    because a port was taken meanwhile is tried again with other ports, and one that Ray gave up on because its
    node did not register within Ray's own 30 s (``RAY_NODE_TIMED_OUT``: a busy machine) is tried again for as
    long as the start's deadline allows."""
    attempt = 0
    while True:
        attempt += 1
        try:
            return _start_head_once(runtime, env, folder, deadline)
        except StackStartError as exc:
            if "address already in use" in str(exc) and attempt < _START_ATTEMPTS:
                logger.warning("The Ray head's port was taken while it started; retrying")
            elif RAY_NODE_TIMED_OUT in str(exc) and time.monotonic() < deadline.at:
                logger.warning(
                    "The Ray head for Gym stacks gave up after Ray's own 30 s wait for its node (%s); starting it"
                    " again (attempt %d)",
                    waiting.machine_load(),
                    attempt + 1,
                )
            else:
                raise


def _start_head_once(
    runtime: GymRuntime, env: Mapping[str, str], folder: Path, deadline: waiting.Deadline
) -> HeadState:
    token = secrets.token_hex(32)
    ports = reserve_ports(3)
    gcs_port, client_port, agent_port = ports.ports
    # Short: Ray's socket paths live under it (a Unix socket path has at most 107 bytes).
    temp_dir = Path(tempfile.mkdtemp(prefix="vnr-ray-", dir=tempfile.gettempdir()))
    logs = logs_dir()
    logs.mkdir(parents=True, exist_ok=True)
    log_path = logs / f"ray-head-{folder.name}-{temp_dir.name.rsplit('-', 1)[-1]}.log"
    argv = [
        str(runtime.bin_dir / "ray"),
        "start",
        "--head",
        "--block",
        f"--node-ip-address={HOST}",
        f"--port={gcs_port}",
        f"--ray-client-server-port={client_port}",
        f"--dashboard-agent-listen-port={agent_port}",
        "--include-dashboard=false",
        "--include-log-monitor=false",
        "--no-monitor",
        "--disable-usage-stats",
        f"--temp-dir={temp_dir}",
    ]
    spec = {
        "argv": argv,
        "cwd": str(temp_dir),
        "log": str(log_path),
        "grace_s": 5.0,
        "ports": [[HOST, gcs_port]],
        "remove": [str(temp_dir)],
        "logs": [str(log_path)],
        "leases": lease_spec(folder, "head.json", _POLL_S),
    }
    try:
        pid = start_detached(runtime.python, spec, cwd=temp_dir, env={**env, **_join_env(token), **_LEAN_HEAD_ENV})
    except OSError as exc:
        ports.release()
        remove_path(temp_dir)
        raise StackStartError(f"The Ray head for Gym stacks did not start: {exc}") from exc
    started = start_time(pid) or ""
    state = HeadState(gcs_port, token, pid, started, str(temp_dir), str(log_path))
    try:
        _wait_ready(state, deadline)
    except BaseException:
        _remove_remains(state)
        raise
    finally:
        ports.release()  # bound by the head now (or never to be)
    _write_state(folder / "head.json", state)
    logger.info("Ray head for Gym stacks ready at %s (pid %d)", state.address, pid)
    return state


def _wait_ready(state: HeadState, deadline: waiting.Deadline) -> None:
    """Until ``ray start`` says its node is registered, for as long as it makes progress within the start's
    ``deadline`` (``waiting.Waiting``: said every 30 s); StackStartError when it exits, stalls or time is up."""
    log = Path(state.log)
    wait = waiting.Waiting("the Ray head for Gym stacks", deadline, sid=state.pid, log=log)
    looked_at, launcher_gone = time.monotonic(), False  # the first look a second from now: ``ray start`` execs
    while True:
        try:
            text = log.read_text(errors="replace")
        except OSError:
            text = ""
        if READY_LINE in text:
            return
        if time.monotonic() - looked_at >= 1.0:  # not at every poll: a look at every process of the machine
            looked_at = time.monotonic()
            launcher_gone = not _launcher_running(state)
        if start_time(state.pid) != state.started or launcher_gone:
            tail = "\n".join(text.splitlines()[-20:])
            raise StackStartError(f"The Ray head for Gym stacks exited while starting:\n{tail}\n(full log: {log})")
        wait.check()
        time.sleep(0.05)


def _launcher_running(state: HeadState) -> bool:
    """Whether ``ray start`` still runs in the head's session (once it exits, its supervisor waits for the folder's
    lock, which the starting process holds: the start has failed)."""
    for pid in session_pids(state.pid):
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) > 2 and argv[1].endswith(b"/ray") and argv[2] == b"start":
            return True
    return False


# -- one lease per (process, head folder), refcounted by the stacks that use it ------------------------

_heads: Registry[Path, RayHead] = Registry(reusable=lambda head: head.alive)


def _folder(runtime: GymRuntime, heads_dir: Path | None = None) -> Path:
    return helper_folder(heads_dir, head_key(runtime))


def acquire_ray_head(
    runtime: GymRuntime, env: Mapping[str, str], heads_dir: Path | None = None, deadline: waiting.Deadline | None = None
) -> RayHead:
    """This process's hold on the machine's Ray head for ``runtime``: joined, or started if none runs (or
    the one held died); refcounted by the process's stacks. ``heads_dir``: where the heads are kept, if not
    ``ray_dir()`` as it is now; ``deadline``: when the start that needs it must be done
    (``waiting``; None: ``start_timeout()`` from now)."""
    folder = _folder(runtime, heads_dir)
    head, spent = _heads.acquire(folder, lambda: RayHead(runtime, env, folder, deadline))
    if spent is not None:
        logger.warning("Ray head at %s is gone; joined or started another:\n%s", spent.address, spent.log_tail())
        spent.leave()
    return head


def release_ray_head(head: RayHead) -> None:
    """Drop one reference; the last one gives up the process's lease (as does releasing a head already
    replaced)."""
    if _heads.release(head.folder, head) is not False:
        head.leave()


def stop_all_ray_heads() -> None:
    """Give up every lease of this process (at exit, after the stacks)."""
    for head in _heads.clear():
        head.leave()


_take_lease = take_lease  # its old name (tests hold leases with it)
