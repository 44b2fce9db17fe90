"""One Ray head per process, shared by its Gym stacks.

Every ``ng_run`` starts a Ray cluster of its own (about 20 processes, most of a warm start's CPU) unless
it is given ``+ray_head_node_address`` (nemo-gym's public seam for an existing cluster). A ``RayHead`` is
that cluster, started once for the process with ``ray start --head --block`` from the Gym runtime and
joined by every stack of the process and by every restart, so later starts skip Ray's start altogether.
The first start does not wait for it: ng_run is launched at the same moment, and its ``ray.init``
connects once the head's GCS answers (Ray retries that for about 20 s).

The head runs under the same supervisor as the stacks (its own session, torn down when the owner stops it
or dies), binds 127.0.0.1 only, keeps its files in a private temporary folder (not the machine-wide
``/tmp/ray``, whose ``ray_current_cluster`` file other Ray users on the machine would join), and
requires a random token that only this process's Gym processes get (Ray's token authentication).
The supervisor removes that folder whenever the head stops; its log lives with the stacks' logs
(kept only when the head failed).
"""

from __future__ import annotations

import logging
import os
import secrets
import tempfile
import time
from pathlib import Path

from .._gym import GymRuntime
from .config import HOST
from .logs import logs_dir
from .procs import PortReservation, remove_path, reserve_ports, sweep_dead_owners
from .registry import Registry
from .supervisor import start_supervised, stop_supervised

logger = logging.getLogger(__name__)

_STOP_TIMEOUT = 10.0
TEMP_PREFIX = "vnr-ray-"
"""Temporary folders are ``<tmp>/vnr-ray-<owner pid>-<random>``: short (Ray's socket paths live under
them), and named after their owner so that those of a dead owner can be swept."""


class RayHead:
    """A Ray head node for this process's Gym stacks (see the module docstring)."""

    def __init__(self, runtime: GymRuntime, env: dict[str, str]) -> None:
        self.runtime = runtime
        self.token = secrets.token_hex(32)
        self._ports: PortReservation | None = reserve_ports(3)
        self.gcs_port, client_port, agent_port = self._ports.ports
        tmp = Path(tempfile.gettempdir())
        sweep_dead_owners(tmp, prefix=TEMP_PREFIX)
        self.temp_dir = Path(tempfile.mkdtemp(prefix=f"{TEMP_PREFIX}{os.getpid()}-", dir=tmp))
        logs = logs_dir()
        logs.mkdir(parents=True, exist_ok=True)
        self.log_path = logs / f"ray-head-{os.getpid()}-{self.temp_dir.name.rsplit('-', 1)[1]}.log"
        argv = [
            str(runtime.bin_dir / "ray"),
            "start",
            "--head",
            "--block",
            f"--node-ip-address={HOST}",
            f"--port={self.gcs_port}",
            f"--ray-client-server-port={client_port}",
            f"--dashboard-agent-listen-port={agent_port}",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={self.temp_dir}",
        ]
        spec = {
            "argv": argv,
            "cwd": str(self.temp_dir),
            "log": str(self.log_path),
            "grace_s": 5.0,
            "ports": [[HOST, self.gcs_port]],
            "remove": [str(self.temp_dir)],
            "logs": [str(self.log_path)],
        }
        self._supervisor = start_supervised(runtime.python, spec, cwd=self.temp_dir, env={**env, **self.env()})
        self.started_at = time.monotonic()
        self._stopped = False
        logger.info("Ray head for Gym stacks starting at %s (pid %d)", self.address, self._supervisor.pid)

    @property
    def address(self) -> str:
        """``host:port`` of the head's GCS, for ``+ray_head_node_address``."""
        return f"{HOST}:{self.gcs_port}"

    @property
    def pid(self) -> int:
        """The supervisor's pid, which is also the head's session id."""
        return self._supervisor.pid

    def env(self) -> dict[str, str]:
        """What a process needs in its environment to join this head."""
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": self.token,
            "RAY_USAGE_STATS_ENABLED": "0",
            # Ray's switch for single-machine clusters: with it off, every Ray process binds 127.0.0.1.
            "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        }

    @property
    def alive(self) -> bool:
        return not self._stopped and self._supervisor.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        """Stop every process of the head (graceful, then forced) and remove its folder. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        failed = self._supervisor.poll() is not None  # it died before we stopped it: keep its log
        stop_supervised(self._supervisor, f"Ray head at {self.address}", _STOP_TIMEOUT, keep_logs=failed)
        if self._ports is not None:
            self._ports.release()
            self._ports = None
        remove_path(self.temp_dir)  # the supervisor removes it too; not if it was killed
        if not failed:
            remove_path(self.log_path)


# -- one head per (process, Gym runtime), refcounted by the stacks that use it ------------------------

_heads: Registry[Path, RayHead] = Registry(reusable=lambda head: head.alive)


def acquire_ray_head(runtime: GymRuntime, env: dict[str, str]) -> RayHead:
    """The process's Ray head for ``runtime``, started if there is none or it died; refcounted."""
    head, spent = _heads.acquire(runtime.prefix, lambda: RayHead(runtime, env))
    if spent is not None:
        logger.warning("Ray head at %s is gone; started a new one. Its log:\n%s", spent.address, spent.log_tail())
        _stop_quietly(spent)
    return head


def release_ray_head(head: RayHead) -> None:
    """Drop one reference; the last one stops the head (as does releasing a head already replaced)."""
    if _heads.release(head.runtime.prefix, head) is not False:
        _stop_quietly(head)


def stop_all_ray_heads() -> None:
    """Stop every head of this process (at exit, after the stacks)."""
    for head in _heads.clear():
        _stop_quietly(head)


def _stop_quietly(head: RayHead) -> None:
    try:
        head.stop()
    except Exception:
        logger.exception("stopping the Ray head at %s failed", head.address)
