"""GymStack: one NeMo Gym server stack (head server, resources server, Gym agent), run by ng_run.

The stack is launched with nemo-gym's own launcher from the Gym runtime interpreter, under a small
supervisor (``_gym_side/supervisor.py``) that leads its own process session: stopping the stack,
or the death of the owning process by any signal, takes down every process of that session.

The ``policy_model`` entry of the Gym config is a placeholder process whose host and port are the
routing proxy's, so Gym agents send their policy calls straight to the proxy.
"""

from __future__ import annotations

import asyncio
import atexit
import hashlib
import http.client
import json
import logging
import os
import re
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import yaml

from .._exceptions import ConfigurationError, MissingRequirementsError, StackStartError
from .._gym.config import (
    POLICY_MODEL,
    ServerInstance,
    merged_configs,
    requirements_beyond_nemo_gym,
    server_instances,
)
from .._gym.runtime import GymRuntime, cache_dir, find_gym_runtime
from .procs import (
    PortReservation,
    port_accepts,
    port_state,
    remove_legacy_port_locks,
    remove_path,
    reserve_ports,
    rss_bytes,
    session_pids,
    stop_supervised,
    sweep_dead_owners,
)
from .ray_head import RayHead, acquire_ray_head, release_ray_head, stop_all_ray_heads

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
_START_ATTEMPTS = 3
POLICY_IMPLEMENTATION = "verifiers_nemo_policy"
_GYM_SIDE = Path(__file__).parent.parent / "_gym_side"
# Start-up chatter every Gym server prints (Ray's and uvicorn's INFO lines): left out of failure messages.
_ROUTINE = re.compile(r"^(INFO:\s|\S+ \S+\s+INFO \S+\.py:\d+ -- |Connecting to Ray cluster at )")
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)
_CHECK_REQUIREMENTS = r"""
import json, sys, importlib.metadata as md
from packaging.requirements import Requirement, InvalidRequirement
missing = {}
for server, lines in json.loads(sys.argv[1]).items():
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            missing.setdefault(server, []).append(line)
            continue
        if req.marker is not None and not req.marker.evaluate():
            continue
        try:
            version = md.version(req.name)
        except md.PackageNotFoundError:
            missing.setdefault(server, []).append(line)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.setdefault(server, []).append(f"{line} (installed: {version})")
print(json.dumps(missing))
"""


@dataclass(frozen=True)
class StackConfig:
    """What to run: plain data, built by the harness or the CLI; ``GymStack`` runs it."""

    name: str
    """A label for logs, usually the environment name."""
    config_paths: tuple[Path, ...]
    """Gym config YAMLs (the environment's), without any policy model config."""
    policy_url: str
    """Where the agents' ``policy_model`` calls go: the routing proxy, ``http://127.0.0.1:PORT``."""
    overrides: tuple[str, ...] = ()
    """Extra ``ng_run`` overrides (``++key=value``)."""
    gym_python: str | None = None
    isolated_venvs: bool = False
    """Let nemo-gym build its own venv (from PyPI) for servers whose requirements the runtime lacks."""
    pass_env: tuple[str, ...] = ()
    """Environment variables with secret-looking names that Gym processes may still see."""
    secrets: frozenset[str] = field(default=frozenset(), repr=False)
    """Values Gym processes must never see (API keys): environment variables holding one are dropped."""
    shared_ray: bool = True
    """Join the process's one Ray head (see ``_ray_head``) instead of letting ng_run start a Ray cluster
    per stack. Ignored when ``overrides`` name a ``ray_head_node_address`` of their own."""
    start_timeout: float = 300.0
    stop_timeout: float = 10.0


@dataclass
class _Launch:
    generation: int
    supervisor: subprocess.Popen[bytes]
    run_dir: Path
    log_path: Path
    """ng_run's output (every server's too), in the launch's log folder ``log_path.parent``, which
    is kept after a failure for the error message that names it, and removed after a clean stop."""
    head_port: int
    servers: dict[str, tuple[ServerInstance, int]]
    started_at: float
    ports: PortReservation | None = None
    ready_seconds: float = 0.0
    stopped: bool = False


@dataclass(frozen=True)
class StackInfo:
    """A snapshot of a running stack: where its servers are, and what it costs."""

    name: str
    generation: int
    head_url: str
    server_urls: dict[str, str]
    agent_names: tuple[str, ...]
    ready_seconds: float
    pids: tuple[int, ...] = field(repr=False)
    """The stack's processes, and those of the Ray head it joined (shared with the process's other stacks)."""
    rss_bytes: int = 0


class GymStack:
    """Starts, watches, restarts and stops one Gym server stack. Thread-safe; every method blocks."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._launch: _Launch | None = None
        self._generation = 0
        self._dead_reason: str | None = None
        self._dead = threading.Event()
        self._death_lock = threading.Lock()
        self._monitor_stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._listeners: list[Callable[[int, str], None]] = []
        self._death_waiters: dict[tuple[int, asyncio.AbstractEventLoop], asyncio.Future[str]] = {}
        self._ray_head: RayHead | None = None
        self.runtime: GymRuntime | None = None
        self._instances = self._read_instances()

    # -- configuration ---------------------------------------------------------------------------

    def _read_instances(self) -> list[ServerInstance]:
        for path in self.config.config_paths:
            if not Path(path).is_file():
                raise ConfigurationError(f"Gym config file {path} does not exist.")
        instances = server_instances(merged_configs([Path(p) for p in self.config.config_paths]))
        instances = [i for i in instances if i.name != POLICY_MODEL]
        if not any(i.server_type == "responses_api_agents" for i in instances):
            raise ConfigurationError(
                f"Gym config {', '.join(map(str, self.config.config_paths))} defines no Gym agent "
                "(a responses_api_agents entry); pass an environment config."
            )
        names = {i.name for i in instances} | {POLICY_MODEL}
        for instance in instances:
            for server_type, ref in instance.references():
                if ref not in names:
                    raise ConfigurationError(
                        f"Gym server {instance.name!r} refers to {server_type}/{ref!r}, which this stack "
                        "does not define. Servers other than policy_model (e.g. a judge model) must be "
                        "routed or configured explicitly; this environment cannot run as it is."
                    )
        return instances

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self._instances if i.server_type == "responses_api_agents")

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> StackInfo:
        """Launch the stack and wait until every server answers; a no-op when it already runs."""
        with self._lock:
            if self._launch is not None and not self._launch.stopped and not self._dead.is_set():
                return self.info()
            if self._launch is not None:
                self._stop_locked()
            self.runtime = find_gym_runtime(self.config.gym_python)
            isolated = self._check_requirements(self.runtime)  # before anything starts (the Ray head included)
            self._generation += 1
            self._dead.clear()
            self._dead_reason = None
            for attempt in range(1, _START_ATTEMPTS + 1):
                self._launch = self._spawn(self.runtime, self._join_ray_head(self.runtime), isolated)
                try:
                    self._wait_ready(self._launch)
                    break
                except StackStartError:
                    collided = "address already in use" in self._log_tail(self._launch, lines=10_000)
                    head = self._ray_head
                    if head is not None and not head.alive:  # e.g. its port was taken: the next try gets a new one
                        collided = collided or "address already in use" in head.log_tail(10_000)
                        self._leave_ray_head()
                    self._stop_locked(keep_logs=not collided or attempt == _START_ATTEMPTS)
                    if not collided or attempt == _START_ATTEMPTS:
                        self._leave_ray_head()
                        raise
                    logger.warning("Gym stack %s: a port was taken while starting; retrying", self.config.name)
                except BaseException:
                    self._stop_locked(keep_logs=True)
                    self._leave_ray_head()
                    raise
            self._start_monitor()
            _registry_track(self)
            info = self.info()
            logger.info("Gym stack %s ready in %.1fs: %s", self.config.name, info.ready_seconds, info.server_urls)
            return info

    def stop(self) -> None:
        """Stop every process of the stack (graceful, then forced), bounded and idempotent; the last stack
        of the process to stop also stops the shared Ray head."""
        with self._lock:
            self._stop_locked()
            self._leave_ray_head()

    def _join_ray_head(self, runtime: GymRuntime) -> RayHead | None:
        """The Ray head this launch joins (kept across restarts while it lives), or None to let ng_run
        start its own Ray."""
        if not self.config.shared_ray or any("ray_head_node_address" in o for o in self.config.overrides):
            return None
        head = self._ray_head
        if head is not None and not head.alive:
            self._leave_ray_head()
        if self._ray_head is None:
            self._ray_head = acquire_ray_head(runtime, self._child_env(runtime))
        return self._ray_head

    def _leave_ray_head(self) -> None:
        head, self._ray_head = self._ray_head, None
        if head is not None:
            release_ray_head(head)

    def restart(self) -> StackInfo:
        with self._lock:
            self._stop_locked()
            return self.start()

    def ensure_running(self) -> StackInfo:
        """Start the stack if it is not running, or restart it after a death."""
        return self.start()

    def __enter__(self) -> GymStack:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- state -----------------------------------------------------------------------------------

    @property
    def generation(self) -> int:
        return self._generation

    @property
    def running(self) -> bool:
        launch = self._launch
        return launch is not None and not launch.stopped and not self._dead.is_set()

    @property
    def dead_reason(self) -> str | None:
        return self._dead_reason

    def is_dead(self, generation: int | None = None) -> bool:
        """Whether the stack (of ``generation``, if given) died or was stopped."""
        if generation is not None and generation != self._generation:
            return True
        launch = self._launch
        return launch is None or launch.stopped or self._dead.is_set()

    def on_death(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(generation, reason)`` (from the monitor thread) when a server dies."""
        self._listeners.append(listener)

    def info(self) -> StackInfo:
        launch = self._launch
        if launch is None or launch.stopped:
            raise StackStartError(f"Gym stack {self.config.name} is not running.")
        pids = tuple(session_pids(launch.supervisor.pid))
        if self._ray_head is not None:
            pids += tuple(session_pids(self._ray_head.pid))
        return StackInfo(
            name=self.config.name,
            generation=launch.generation,
            head_url=f"http://{HOST}:{launch.head_port}",
            server_urls={name: f"http://{HOST}:{port}" for name, (_, port) in launch.servers.items()},
            agent_names=self.agent_names,
            ready_seconds=launch.ready_seconds,
            pids=pids,
            rss_bytes=rss_bytes(list(pids)),
        )

    def agent_url(self, agent: str | None = None) -> str:
        """Base URL of a Gym agent of this stack (the only one when ``agent`` is None).

        Called once per rollout: it reads the launch's own port table and nothing else (no ``/proc``)."""
        launch = self._launch
        if launch is None or launch.stopped:
            raise StackStartError(f"Gym stack {self.config.name} is not running.")
        names = self.agent_names
        if agent is None:
            if len(names) != 1:
                raise ConfigurationError(f"Gym stack {self.config.name} has several agents {list(names)}; name one.")
            agent = names[0]
        if agent not in names:
            raise ConfigurationError(f"Gym stack {self.config.name} has no agent {agent!r}; it has {list(names)}.")
        return f"http://{HOST}:{launch.servers[agent][1]}"

    def death_future(self, generation: int) -> asyncio.Future[str]:
        """A future of the running event loop that resolves, with the reason, when ``generation`` of this
        stack dies or is stopped (at once if it already has). One per (generation, loop), shared by every
        rollout waiting on it, so a rollout waits on its request and this instead of polling."""
        loop = asyncio.get_running_loop()
        with self._death_lock:
            launch = self._launch
            gone = generation != self._generation or launch is None or launch.stopped or self._dead.is_set()
            if gone:
                future = loop.create_future()
                future.set_result(self._dead_reason or "stopped")
                return future
            future = self._death_waiters.get((generation, loop))
            if future is None:
                for key in [k for k in self._death_waiters if k[1].is_closed()]:
                    del self._death_waiters[key]
                future = self._death_waiters[(generation, loop)] = loop.create_future()
            return future

    def _signal_death(self, reason: str) -> None:
        with self._death_lock:
            waiters, self._death_waiters = self._death_waiters, {}
        for (_, loop), future in waiters.items():
            try:
                loop.call_soon_threadsafe(_resolve, future, reason)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    @property
    def log_path(self) -> Path | None:
        return self._launch.log_path if self._launch else None

    # -- launching -------------------------------------------------------------------------------

    def _venv_links_dir(self, runtime: GymRuntime) -> Path:
        digest = hashlib.sha256(str(runtime.prefix).encode()).hexdigest()[:12]
        return cache_dir() / "server-venvs" / digest

    def _check_requirements(self, runtime: GymRuntime) -> set[str]:
        """Servers whose requirements the runtime lacks; raises unless isolated venvs are allowed."""
        return check_requirements(self.config.name, self._instances, runtime, isolated_venvs=self.config.isolated_venvs)

    def _link_venvs(self, runtime: GymRuntime, isolated: set[str]) -> Path:
        links = self._venv_links_dir(runtime)
        rel_dirs = {i.rel_dir for i in self._instances if i.name not in isolated}
        rel_dirs.add(Path("responses_api_models", POLICY_IMPLEMENTATION))
        for rel in rel_dirs:
            link = links / rel / ".venv"
            if link.is_symlink() and link.resolve() == runtime.prefix.resolve():
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".venv.tmp-{secrets.token_hex(4)}")
            tmp.symlink_to(runtime.prefix, target_is_directory=True)
            os.replace(tmp, link)  # atomic: concurrent stacks may do the same
        return links

    def _child_env(self, runtime: GymRuntime) -> dict[str, str]:
        # No secrets for Gym: drop secret-looking names, and any variable holding one of the config's secrets.
        env = {
            k: v
            for k, v in os.environ.items()
            if (not _SECRET_NAME.search(k) or k in self.config.pass_env) and v not in self.config.secrets
        }
        env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled bytecode halves each server's start
        env.pop("VIRTUAL_ENV", None)
        env["PATH"] = f"{runtime.bin_dir}{os.pathsep}{env.get('PATH', '')}"
        env["UV_PYTHON_DOWNLOADS"] = "never"
        env["RAY_USAGE_STATS_ENABLED"] = "0"
        # Ray's public switch for single-machine clusters: with it off, Ray takes the loopback address
        # as its node IP, so its GCS, raylet, agents and workers listen on 127.0.0.1 instead of every
        # interface (measured: 14 non-loopback listening sockets per stack without it, 0 with it).
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
        env["PYTHONUNBUFFERED"] = "1"
        return env

    def _spawn(self, runtime: GymRuntime, ray_head: RayHead | None, isolated: set[str]) -> _Launch:
        links = self._link_venvs(runtime, isolated)
        sweep_run_dirs(cache_dir() / "runs")
        sweep_dead_owners(logs_dir(), keep_newest=KEEP_FAILED_LOGS)
        remove_legacy_port_locks(cache_dir() / "ports")
        run_id = f"{_safe_name(self.config.name)}-{os.getpid()}-{secrets.token_hex(4)}"
        run_dir = cache_dir() / "runs" / run_id
        log_dir = logs_dir() / run_id
        (log_dir / SERVER_LOGS).mkdir(parents=True)
        policy_dir = run_dir / "responses_api_models" / POLICY_IMPLEMENTATION
        policy_dir.mkdir(parents=True)
        shutil.copy(_GYM_SIDE / "policy_server.py", policy_dir / "app.py")
        (policy_dir / "requirements.txt").write_text("# served by verifiers_nemo's routing proxy\n")
        policy = urlsplit(self.config.policy_url)
        policy_yaml = run_dir / "policy_model.yaml"
        policy_yaml.write_text(
            yaml.safe_dump(
                {
                    POLICY_MODEL: {
                        "responses_api_models": {
                            POLICY_IMPLEMENTATION: {
                                "entrypoint": "app.py",
                                "host": policy.hostname,
                                "port": policy.port,
                            }
                        }
                    }
                }
            )
        )
        reservation = reserve_ports(1 + len(self._instances))
        head_port, *ports = reservation.ports
        servers = {i.name: (i, port) for i, port in zip(self._instances, ports, strict=True)}
        config_paths = ",".join(str(Path(p).resolve()) for p in (*self.config.config_paths, policy_yaml))
        argv = [
            str(runtime.ng_run),
            f"+config_paths=[{config_paths}]",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={links}",
            f"+uv_cache_dir={cache_dir() / 'uv'}",
            f"+nemo_gym_log_dir={log_dir / SERVER_LOGS}",  # each server's own output, for failure messages
            f"+default_host={HOST}",
            f"++head_server={{host:{HOST},port:{head_port}}}",
        ]
        for instance, port in servers.values():
            argv += [f"++{instance.override_prefix}.host={HOST}", f"++{instance.override_prefix}.port={port}"]
        if ray_head is not None:
            argv.append(f"+ray_head_node_address={ray_head.address}")
        argv += list(self.config.overrides)
        log_path = log_dir / "ng_run.log"
        spec = {
            "argv": argv,
            "cwd": str(run_dir),
            "log": str(log_path),
            "grace_s": max(1.0, self.config.stop_timeout - 3.0),
            "ports": [[HOST, port] for _, port in servers.values()],
            "remove": [str(run_dir)],
            "logs": [str(log_dir)],
        }
        logger.debug("Launching Gym stack %s: %s", self.config.name, argv)
        supervisor = subprocess.Popen(
            [str(runtime.python), str(_GYM_SIDE / "supervisor.py"), json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            cwd=run_dir,
            env={**self._child_env(runtime), **(ray_head.env() if ray_head else {})},
            start_new_session=True,
        )
        return _Launch(
            generation=self._generation,
            supervisor=supervisor,
            run_dir=run_dir,
            log_path=log_path,
            head_port=head_port,
            servers=servers,
            started_at=time.monotonic(),
            ports=reservation,
        )

    def _log_tail(self, launch: _Launch, lines: int = 40) -> str:
        try:
            text = launch.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def _server_lines(self, launch: _Launch, name: str, lines: int = 25) -> list[str]:
        """The last lines a server wrote itself: its own log (``nemo_gym_log_dir``: stdout and stderr,
        the output of its start-up commands included), else the lines ng_run's log prefixes with its
        name. Blank lines and Gym's routine start-up chatter are left out."""
        own = launch.log_path.parent / SERVER_LOGS / f"{name.replace('/', '_')}.log"
        try:
            text = own.read_text(errors="replace").splitlines()
        except OSError:
            try:
                text = [
                    line.removeprefix(f"({name}) ")
                    for line in launch.log_path.read_text(errors="replace").splitlines()
                    if line.startswith(f"({name}) ")
                ]
            except OSError:
                text = []
        text = [line.removeprefix(f"({name}) ").rstrip() for line in text]
        text = [line for line in text if line.strip() and not _ROUTINE.search(line)]
        return _without_traceback_frames(text)[-lines:]

    def _failure_summary(self, launch: _Launch) -> str:
        """Why the start failed: the crashed server's own last lines when ng_run names one, else the log's tail."""
        try:
            text = launch.log_path.read_text(errors="replace")
        except OSError:
            text = ""
        crashed = re.findall(r"Process `([^`]+)` finished unexpectedly", text)
        own = self._server_lines(launch, crashed[-1]) if crashed else []
        if crashed and not own:
            return f"Gym server {crashed[-1]} exited while the stack started, without any output of its own."
        if not own:
            lines = [line for line in text.splitlines() if line.strip() and not _ROUTINE.search(line)]
            tail = "\n".join(_without_traceback_frames(lines)[-25:]) or "(no output)"
            return f"Gym stack {self.config.name} exited while starting. The launcher's last lines:\n{tail}"
        return f"Gym server {crashed[-1]} exited while the stack started. Its last lines:\n" + "\n".join(
            f"  {line}" for line in own
        )

    def _wait_ready(self, launch: _Launch) -> None:
        deadline = launch.started_at + self.config.start_timeout
        pending = {"head_server": launch.head_port} | {n: p for n, (_, p) in launch.servers.items()}
        while pending:
            if launch.supervisor.poll() is not None:
                raise StackStartError(f"{self._failure_summary(launch)}\n(full log: {launch.log_path})")
            for name, port in list(pending.items()):
                if _http_ok(port):
                    del pending[name]
            if not pending:
                break
            if time.monotonic() > deadline:
                waiting = "\n".join(
                    f"{name}'s last lines:\n" + "\n".join(f"  {line}" for line in self._server_lines(launch, name, 10))
                    for name in sorted(pending)
                    if name != "head_server"
                )
                raise StackStartError(
                    f"Gym stack {self.config.name}: {sorted(pending)} did not answer within "
                    f"{self.config.start_timeout:.0f}s.\n{waiting or self._log_tail(launch)}\n"
                    f"(full log: {launch.log_path})"
                )
            time.sleep(0.1)
        launch.ready_seconds = time.monotonic() - launch.started_at

    def _stop_locked(self, keep_logs: bool = False) -> None:
        """Stop the launch; its run folder goes, its logs stay only when ``keep_logs`` or it died."""
        self._monitor_stop.set()
        if self._monitor is not None and self._monitor is not threading.current_thread():
            self._monitor.join(timeout=2)
        self._monitor = None
        launch = self._launch
        if launch is None or launch.stopped:
            return
        launch.stopped = True
        keep_logs = keep_logs or self._dead.is_set()
        self._signal_death(self._dead_reason or "the Gym stack was stopped")
        label = f"Gym stack {self.config.name}"
        stop_supervised(launch.supervisor, label, self.config.stop_timeout, keep_logs=keep_logs)
        if launch.ports is not None:
            launch.ports.release()
        remove_path(launch.run_dir)  # the supervisor removes it too; not if it was killed
        if not keep_logs:
            remove_path(launch.log_path.parent)
        _registry_untrack(self)

    # -- watching --------------------------------------------------------------------------------

    def _start_monitor(self) -> None:
        self._monitor_stop = threading.Event()
        launch = self._launch
        assert launch is not None
        self._monitor = threading.Thread(
            target=self._watch,
            args=(launch, self._monitor_stop),
            name=f"gym-stack-{self.config.name}",
            daemon=True,
        )
        self._monitor.start()

    def _watch(self, launch: _Launch, stop: threading.Event) -> None:
        strikes: dict[str, int] = {}
        while not stop.wait(0.5):
            reason = None
            head = self._ray_head
            if launch.supervisor.poll() is not None:
                reason = "the Gym launcher (ng_run) exited"
            elif head is not None and not head.alive:
                reason = f"the Ray head the stack joined exited (log: {head.log_path})"
            else:
                for name, (_, port) in launch.servers.items():
                    # Only a refused connection (nothing listening) is a strike: a connect that times out means
                    # a busy server whose listen queue is full under load, not a dead one.
                    if port_state(HOST, port) != "refused":
                        strikes[name] = 0
                        continue
                    strikes[name] = strikes.get(name, 0) + 1
                    if strikes[name] >= 2:
                        reason = f"Gym server {name} stopped answering on port {port}"
                        break
            if reason and not stop.is_set():
                self._mark_dead(launch, reason)
                return

    def probe_now(self, generation: int) -> bool:
        """Check every server of ``generation`` at once (not waiting for the monitor); mark it dead if one
        is gone. For callers that just saw a refused connection. Returns whether that generation is alive;
        a newer generation (already restarted, maybe still starting) is never probed or marked by it."""
        launch = self._launch
        if launch is None or launch.stopped or self._dead.is_set() or launch.generation != generation:
            return False
        if launch.supervisor.poll() is not None:
            self._mark_dead(launch, "the Gym launcher (ng_run) exited")
            return False
        for name, (_, port) in launch.servers.items():
            if not port_accepts(HOST, port):
                self._mark_dead(launch, f"Gym server {name} refused connections on port {port}")
                return False
        return True

    def _mark_dead(self, launch: _Launch, reason: str) -> None:
        with self._death_lock:
            if self._dead.is_set() or launch.generation != self._generation:
                return
            self._dead_reason = reason
            self._dead.set()
        logger.warning("Gym stack %s died: %s (log: %s)", self.config.name, reason, launch.log_path)
        self._signal_death(reason)
        for listener in list(self._listeners):
            try:
                listener(launch.generation, reason)
            except Exception:  # a listener's bug must not stop the others
                logger.exception("stack death listener failed")


_satisfied: set[tuple[str, str]] = set()  # (interpreter, requirements) checked and found installed


def check_requirements(
    name: str, instances: list[ServerInstance], runtime: GymRuntime, *, isolated_venvs: bool = False
) -> set[str]:
    """The servers among ``instances`` whose Python requirements ``runtime`` lacks. Raises
    MissingRequirementsError naming them unless ``isolated_venvs`` (nemo-gym then builds their venvs).
    Starts nothing: it asks the runtime's interpreter which packages it has."""
    wanted = {}
    for instance in instances:
        reqs, _ = requirements_beyond_nemo_gym(runtime.root / instance.rel_dir)
        if reqs:
            wanted[instance.name] = reqs
    key = (str(runtime.python), json.dumps(wanted, sort_keys=True))
    if not wanted or key in _satisfied:
        return set()
    out = subprocess.run(
        [str(runtime.python), "-c", _CHECK_REQUIREMENTS, json.dumps(wanted)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise StackStartError(f"Could not check server requirements with {runtime.python}: {out.stderr}")
    missing: dict[str, list[str]] = json.loads(out.stdout)
    if not missing:
        _satisfied.add(key)
    elif not isolated_venvs:
        raise MissingRequirementsError(name, str(runtime.python), missing)
    return set(missing)


KEEP_FAILED_LOGS = 10
"""Log folders of failed or dead launches kept for their error messages (the newest; others are removed)."""
SERVER_LOGS = "servers"


def logs_dir() -> Path:
    """Where launches keep their logs: ``<cache>/logs/<run id>/`` (ng_run.log, servers/<name>.log)."""
    return cache_dir() / "logs"


def sweep_run_dirs(runs: Path) -> list[Path]:
    """Remove run folders (``<name>-<pid>-<hex>``) whose owner process is gone. Supervisors remove their
    run folder themselves; this catches the rest (a supervisor killed outright, an owner killed between
    creating the folder and starting the supervisor)."""
    return sweep_dead_owners(runs)


def _without_traceback_frames(lines: list[str]) -> list[str]:
    """Python tracebacks without their frames (kept in the full log): the exception line says why."""
    out: list[str] = []
    in_traceback = False
    for line in lines:
        if line.lstrip().startswith("Traceback (most recent call last):"):
            in_traceback = True
            continue
        if in_traceback and line[:1].isspace():
            continue
        in_traceback = False
        out.append(line)
    return out


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.]+", "_", name) or "_"


def _resolve(future: asyncio.Future[str], reason: str) -> None:
    if not future.done():
        future.set_result(reason)


def _http_ok(port: int) -> bool:
    conn = http.client.HTTPConnection(HOST, port, timeout=1.0)
    try:
        conn.request("GET", "/")
        conn.getresponse().read()
        return True
    except (OSError, http.client.HTTPException):
        return False
    finally:
        conn.close()


# -- process-wide registry: one stack per (process, config), teardown at exit -----------------------

_registry_lock = threading.Lock()
_running: set[GymStack] = set()
_shared: dict[StackConfig, tuple[GymStack, int]] = {}
_hooks_installed = False


def acquire_stack(config: StackConfig) -> GymStack:
    """The process's shared stack for ``config`` (created, not started, on first use), refcounted."""
    with _registry_lock:
        stack, count = _shared.get(config, (None, 0))
        if stack is None:
            stack = GymStack(config)
        _shared[config] = (stack, count + 1)
        return stack


def release_stack(stack: GymStack) -> None:
    """Drop one reference; the last one stops the stack."""
    with _registry_lock:
        entry = _shared.get(stack.config)
        if entry is None or entry[0] is not stack:
            return
        count = entry[1] - 1
        if count > 0:
            _shared[stack.config] = (stack, count)
            return
        del _shared[stack.config]
    stack.stop()


def stop_all_stacks() -> None:
    """Stop every stack this process started (at interpreter exit). No signal handler calls it: when the
    process dies by a signal, each stack's supervisor sees its pipe close and takes the stack down."""
    with _registry_lock:
        stacks = list(_running)
    for stack in stacks:
        try:
            stack.stop()
        except Exception:
            logger.exception("stopping Gym stack %s failed", stack.config.name)
    stop_all_ray_heads()


def _registry_track(stack: GymStack) -> None:
    global _hooks_installed
    with _registry_lock:
        _running.add(stack)
        if not _hooks_installed:
            _hooks_installed = True
            atexit.register(stop_all_stacks)


def _registry_untrack(stack: GymStack) -> None:
    with _registry_lock:
        _running.discard(stack)
