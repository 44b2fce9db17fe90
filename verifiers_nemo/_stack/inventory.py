"""What this package runs for the current user on this machine, read from ``/proc`` and the helpers' folders, and
the clean-up of what a killed run left (``verifiers-nemo ps``).

- **Stacks**: every Gym process a launch starts carries ``VERIFIERS_NEMO_RUN=<its run folder>`` in its environment
  (set by ``launch.py``: ``<cache>/runs/<run id>``, the run id ``<env>-<owner pid>-<hex>``; its logs are in
  ``<cache>/logs/<run id>``, whichever cache folder the run used). A stack whose owner (the
  process that started it) is gone is *left over*: its supervisor stops it within seconds of the owner's death, so a
  left-over stack is one whose supervisor was killed too (``kill -9`` of every process of the user's, an OOM kill).
- **Helpers**: the shared Ray head and the warm parents, one folder each under ``ray_dir()``, with a state file naming
  their supervisor (the leader of the helper's session) and ``leases/``, a locked file per holding process. A helper
  no live process holds stops by itself; one whose supervisor died leaves its session's processes behind.
- **Ray clusters of ``--ray``**: the processes of a run's own local cluster, whose files live under
  ``<tmp>/vnr-rl-<owner pid>-<hex>``.

Only this user's processes and folders are read or touched: a process is this user's by its ``/proc`` entry's owner,
checked again right before each signal; another user's process is never signalled, whatever its environment says.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .._gym.runtime import cache_dir
from .leases import locked, read_state, start_time
from .logs import logs_dir
from .plan import RUN_VAR
from .private_dir import owned_by_me, process_is_mine
from .procs import listening_ports, owner_pid, pid_alive, process_sid, remove_path

RAY_CLUSTER_PREFIX = "vnr-rl-"
"""A ``--ray`` run's own local cluster keeps its files in ``<tmp>/vnr-rl-<owner pid>-<hex>`` (``_scale``)."""
_STATE_FILES = {"head.json": "Ray head", "state.json": "warm parent"}
_STOP_GRACE_S = 5.0


@dataclass
class Processes:
    """A group of this user's processes: their pids and sessions, and the TCP ports they listen on."""

    pids: list[int] = field(default_factory=list)
    ports: list[int] = field(default_factory=list)

    @property
    def sessions(self) -> list[int]:
        return sorted({sid for sid in map(process_sid, self.pids) if sid is not None})


@dataclass
class StackRun:
    """One launch of a Gym stack (a run id): its processes, its owner, its folders."""

    run_id: str
    processes: Processes
    owner: int | None
    owner_command: str | None
    run_dir: Path
    log_dir: Path

    @property
    def env(self) -> str:
        return self.run_id.rsplit("-", 2)[0]

    @property
    def left_over(self) -> bool:
        return self.owner_command is None


@dataclass
class Helper:
    """A shared helper (the Ray head or a warm parent) in its folder."""

    kind: str
    folder: Path
    supervisor: int | None
    """The pid of the helper's supervisor while it runs (None: gone)."""
    session: int | None
    holders: list[int]
    processes: Processes
    state: dict[str, Any]

    @property
    def left_over(self) -> bool:
        """No live process holds it, or its supervisor is gone while processes of its session are left."""
        return not self.holders or (self.supervisor is None and bool(self.processes.pids))


@dataclass
class RayCluster:
    """A ``--ray`` run's own local cluster: its processes and folder."""

    folder: Path
    owner: int | None
    owner_command: str | None
    processes: Processes

    @property
    def left_over(self) -> bool:
        return self.owner_command is None


@dataclass
class Inventory:
    """Everything this package runs for the user on this machine, and where its folders are."""

    stacks: list[StackRun]
    helpers: list[Helper]
    ray_clusters: list[RayCluster]
    folders: dict[str, Path]

    @property
    def left_over(self) -> list[StackRun | Helper | RayCluster]:
        return [item for item in (*self.stacks, *self.helpers, *self.ray_clusters) if item.left_over]


def take_inventory(helpers_root: Path | None) -> Inventory:
    """What runs for this user now; ``helpers_root``: the helpers' folder (``ray_dir()``), None when it cannot be
    used."""
    mine = list(_my_processes())
    stacks: dict[Path, list[int]] = {}
    clusters: dict[str, list[int]] = {}
    temp = tempfile.gettempdir()
    for pid, environ, cmdline in mine:
        run = environ.get(RUN_VAR)
        if run and os.path.isabs(run):
            stacks.setdefault(Path(run), []).append(pid)
        elif f"{temp}/{RAY_CLUSTER_PREFIX}" in cmdline:
            name = cmdline.split(f"{temp}/{RAY_CLUSTER_PREFIX}", 1)[1].split("/", 1)[0].split()[0]
            clusters.setdefault(f"{RAY_CLUSTER_PREFIX}{name}", []).append(pid)
    runs_dir = cache_dir() / "runs"
    for folder in _entries(runs_dir):  # run folders of gone owners with no process left
        if folder not in stacks and (pid := owner_pid(folder)) is not None and not pid_alive(pid):
            stacks[folder] = []
    return Inventory(
        stacks=[_stack(run_dir, pids) for run_dir, pids in sorted(stacks.items())],
        helpers=[h for folder in _entries(helpers_root) if (h := _helper(folder, mine)) is not None],
        ray_clusters=[_ray_cluster(Path(temp) / name, pids) for name, pids in sorted(clusters.items())],
        folders={
            "run folders": runs_dir,
            "logs": logs_dir(),
            "shared helpers": helpers_root or Path("(none usable)"),
            "Ray clusters of --ray": Path(temp) / f"{RAY_CLUSTER_PREFIX}<pid>-<hex>",
        },
    )


def clean(inventory: Inventory) -> list[str]:
    """Stop what ``inventory`` says is left over and remove its folders; what was done, a line each. Logs stay."""
    done = []
    for stack in (s for s in inventory.stacks if s.left_over):
        stopped = stop_processes(stack.processes)
        if stack.run_dir.parent.name == "runs" and owner_pid(stack.run_dir) is not None and owned_by_me(stack.run_dir):
            remove_path(stack.run_dir)  # only a run folder of this user's, named as ``launch.py`` names them
        done.append(f"stack {stack.run_id}: stopped {stopped} process(es), removed {stack.run_dir}")
    for helper in (h for h in inventory.helpers if h.left_over):
        done.append(_stop_helper(helper))
    for cluster in (c for c in inventory.ray_clusters if c.left_over):
        stopped = stop_processes(cluster.processes)
        if owned_by_me(cluster.folder):
            remove_path(cluster.folder)
        done.append(f"Ray cluster {cluster.folder}: stopped {stopped} process(es), removed the folder")
    return done


def stop_processes(processes: Processes, grace_s: float = _STOP_GRACE_S) -> int:
    """SIGTERM then, after ``grace_s``, SIGKILL the processes still this user's; how many there were."""
    pids = [p for p in processes.pids if process_is_mine(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            if process_is_mine(pid):  # checked again: a pid may have been reused meanwhile
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_running(p) for p in pids):
            time.sleep(0.05)
    return len(pids)


def _stop_helper(helper: Helper) -> str:
    """Stop a helper no live process holds (under its lock, looked at once more: nothing joins it meanwhile)."""
    state_path = next((helper.folder / name for name in _STATE_FILES if (helper.folder / name).exists()), None)
    with locked(helper.folder / "lock"):
        again = _helper(helper.folder)
        if again is None or not again.left_over:
            return f"{helper.kind} {helper.folder}: held again, left running"
        if state_path is not None:
            remove_path(state_path)
        stopped = stop_processes(again.processes)
    temp_dir = Path(str(helper.state.get("temp_dir", "")))
    if (
        temp_dir.name.startswith("vnr-ray-")
        and temp_dir.parent == Path(tempfile.gettempdir())
        and owned_by_me(temp_dir)
    ):
        remove_path(temp_dir)
    return f"{helper.kind} {helper.folder}: stopped {stopped} process(es)"


def _helper(folder: Path, mine: list[tuple[int, dict[str, str], str]] | None = None) -> Helper | None:
    """The helper in ``folder``; ``mine``: this user's processes as read once for the whole inventory (None: now)."""
    for name, kind in _STATE_FILES.items():
        state = read_state(folder / name)
        if state is None or type(state.get("pid")) is not int:
            continue
        pid = state["pid"]
        alive = start_time(pid) == state.get("started") and process_is_mine(pid)
        pids = [p for p, _, _ in (mine if mine is not None else _my_processes()) if process_sid(p) == pid]
        return Helper(
            kind=kind,
            folder=folder,
            supervisor=pid if alive else None,
            session=pid,
            holders=_live_holders(folder / "leases"),
            processes=Processes(pids, _ports(pids)),
            state=state,
        )
    return None


def _live_holders(leases: Path) -> list[int]:
    """The pids of the lease files in ``leases`` still locked by their holder (a dead holder's lock is free)."""
    holders = []
    for lease in _entries(leases):
        try:
            fd = os.open(lease, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            holders.append(int(lease.name.split("-", 1)[0]) if lease.name.split("-", 1)[0].isdigit() else -1)
        else:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    return sorted(holders)


def _stack(run_dir: Path, pids: list[int]) -> StackRun:
    owner = owner_pid(run_dir)
    return StackRun(
        run_id=run_dir.name,
        processes=Processes(sorted(pids), _ports(pids)),
        owner=owner,
        owner_command=_command_of(owner),
        run_dir=run_dir,
        log_dir=run_dir.parent.parent / "logs" / run_dir.name,
    )


def _ray_cluster(folder: Path, pids: list[int]) -> RayCluster:
    owner = owner_pid(folder)
    return RayCluster(folder, owner, _command_of(owner), Processes(sorted(pids), _ports(pids)))


def _command_of(pid: int | None) -> str | None:
    """The command line of ``pid`` when it is a live process of this user's, else None."""
    if pid is None or not _running(pid) or not process_is_mine(pid):
        return None
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip() or "?"


def _my_processes() -> Iterable[tuple[int, dict[str, str], str]]:
    """This user's live processes (not this one): pid, environment, command line."""
    me = os.getpid()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me or not process_is_mine(int(entry)) or not _running(int(entry)):
            continue
        raw = _read(f"/proc/{entry}/environ")
        environ = dict(item.split("=", 1) for item in raw.decode(errors="replace").split("\0") if "=" in item)
        yield int(entry), environ, _read(f"/proc/{entry}/cmdline").replace(b"\0", b" ").decode(errors="replace")


def _running(pid: int) -> bool:
    status = _read(f"/proc/{pid}/stat")
    return bool(status) and status[status.rfind(b")") + 2 : status.rfind(b")") + 3] != b"Z"


def _ports(pids: list[int]) -> list[int]:
    return sorted({port for ports in listening_ports(pids).values() for port in ports})


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""


def _entries(folder: Path | None) -> list[Path]:
    try:
        return sorted(folder.iterdir()) if folder is not None else []
    except OSError:
        return []
