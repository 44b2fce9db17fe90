"""GymStack: one NeMo Gym server stack (head server, resources server, Gym agent), run by ng_run.

The stack is launched with nemo-gym's own launcher from the Gym runtime interpreter, under a small
supervisor (``supervisor.py``) that leads its own process session: stopping the stack, or the death
of the owning process by any signal, takes down every process of that session.

The ``policy_model`` entry of the Gym config is a placeholder process whose host and port are the
routing proxy's, so Gym agents send their policy calls straight to the proxy. What to launch is
``plan.py``'s; how a death is seen, ``monitor.py``'s; how it is told, ``deaths.py``'s.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .._exceptions import ConfigurationError, StackStartError
from .._gym import GymRuntime, ServerInstance, cache_dir, find_gym_runtime
from .._gym.env_vars import config_variable_names
from .._signals import at_exit, before_forced_exit
from .config import HOST, StackConfig, StackInfo
from .deaths import Deaths
from .logs import KEEP_FAILED_LOGS, SERVER_LOGS, failure_summary, log_tail, logs_dir, server_lines, sweep_run_dirs
from .monitor import Monitor
from .plan import (
    POLICY_IMPLEMENTATION,
    child_env,
    joins_shared_ray,
    ng_run_argv,
    policy_model_config,
    run_id,
    stack_servers,
)
from .procs import (
    PortReservation,
    http_ok,
    port_accepts,
    remove_legacy_port_locks,
    remove_path,
    reserve_ports,
    rss_bytes,
    session_pids,
    sweep_dead_owners,
)
from .ray_head import RayHead, acquire_ray_head, release_ray_head, stop_all_ray_heads
from .registry import Registry
from .requirements import server_venvs
from .supervisor import GYM_SIDE, start_supervised, stop_supervised

logger = logging.getLogger(__name__)

_START_ATTEMPTS = 3
_RAY_UNREACHED = "Failed to connect to Ray cluster"
"""How ``ray.init`` in a Gym server says it gave up on the head it was pointed at."""


@dataclass
class Launch:
    """One run of the stack's processes: its supervisor, folders and port table."""

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
    ready: bool = False
    """Every server answered: until then no rollout is sent to it and no probe marks it dead."""
    stopped: bool = False

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(name for name, (i, _) in self.servers.items() if i.server_type == "responses_api_agents")

    def agent_url(self, agent: str | None, stack_name: str) -> str:
        """Base URL of a Gym agent (the only one when ``agent`` is None), from the launch's own port table."""
        return f"http://{HOST}:{self.servers[self._agent_name(agent, stack_name)][1]}"

    def run_url(self, agent: str | None, stack_name: str) -> str:
        """Where a rollout of ``agent`` is posted, as Gym's own collector does: the ``/run`` of the environment
        server that relays to it when the config declares one (nemo-gym >= 0.7), else the agent's own."""
        name = self._agent_name(agent, stack_name)
        relay = next((n for n, (i, _) in self.servers.items() if i.relays_run_of(name)), name)
        return f"http://{HOST}:{self.servers[relay][1]}/run"

    def _agent_name(self, agent: str | None, stack_name: str) -> str:
        names = self.agent_names
        if agent is None:
            if len(names) != 1:
                raise ConfigurationError(f"Gym stack {stack_name} has several agents {list(names)}; name one.")
            agent = names[0]
        if agent not in names:
            raise ConfigurationError(f"Gym stack {stack_name} has no agent {agent!r}; it has {list(names)}.")
        return agent


class GymStack:
    """Starts, watches, restarts and stops one Gym server stack. Thread-safe; every method blocks."""

    def __init__(self, config: StackConfig) -> None:
        self.config = config
        self._lock = threading.RLock()
        self._launch: Launch | None = None
        self._generation = 0
        self._deaths = Deaths()
        self._monitor: Monitor | None = None
        self._ray_head: RayHead | None = None
        self.runtime: GymRuntime | None = None
        self._instances = stack_servers(config)
        self._start_failure: tuple[float, StackStartError] | None = None
        """When and why the last start failed (None once one succeeds): what the callers queued behind it are told."""

    @property
    def agent_names(self) -> tuple[str, ...]:
        return tuple(i.name for i in self._instances if i.server_type == "responses_api_agents")

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self, asked_at: float | None = None) -> StackInfo:
        """Launch the stack and wait until every server answers; a no-op when it already runs.

        ``asked_at``: when (``time.monotonic()``) a caller, a rollout, found the stack down. If a start has
        failed since, its error is raised instead of another try: the rollouts queued behind a failed
        restart share its verdict rather than each start the stack in turn (a later one tries again)."""
        with self._lock:
            if self.running:
                return self.info()
            failed = self._start_failure
            if asked_at is not None and failed is not None and failed[0] > asked_at:
                raise failed[1]
            if self._launch is not None:
                self._stop_locked()
            self._start_failure = None
            try:
                return self._start_locked()
            except StackStartError as exc:
                self._start_failure = (time.monotonic(), exc)
                raise

    def _start_locked(self) -> StackInfo:
        """``start()``'s work, under its lock."""
        self.runtime = find_gym_runtime(self.config.gym_python, gym_version=self.config.gym_version)
        venvs = self._check_requirements(self.runtime)  # before anything starts (the Ray head included)
        self._generation += 1
        for attempt in range(1, _START_ATTEMPTS + 1):
            self.begin_generation(self._spawn(self.runtime, self._join_ray_head(self.runtime), venvs))
            try:
                _wait_ready(self._launch, self.config.name, self.config.start_timeout)
                break
            except StackStartError:
                log = log_tail(self._launch.log_path, lines=10_000)
                collided = "address already in use" in log
                head = self._ray_head
                if head is not None and not head.alive:  # it died while we started: the next try joins another
                    self._leave_ray_head()
                    collided = True
                # A driver that could not reach a live head (Ray gave up waiting for it): the same head, again.
                unreached = head is not None and head.alive and _RAY_UNREACHED in log
                retry = (collided or unreached) and attempt < _START_ATTEMPTS
                self._stop_locked(keep_logs=not retry)
                if not retry:
                    self._leave_ray_head()
                    raise
                logger.warning(
                    "Gym stack %s: %s while starting; retrying",
                    self.config.name,
                    "its Ray head was not reached" if unreached else "a port was taken or the Ray head died",
                )
            except BaseException:
                self._stop_locked(keep_logs=True)
                self._leave_ray_head()
                raise
        self._start_monitor(self._launch)
        _track(self)
        info = self.info()
        logger.info("Gym stack %s ready in %.1fs: %s", self.config.name, info.ready_seconds, info.server_urls)
        return info

    def stop(self) -> None:
        """Stop every process of the stack (graceful, then forced), bounded and idempotent; the last stack
        of the process to stop also stops the shared Ray head."""
        with self._lock:
            self._stop_locked()
            self._leave_ray_head()

    def restart(self) -> StackInfo:
        with self._lock:
            self._stop_locked()
            return self.start()

    def begin_generation(self, launch: Launch) -> None:
        """Make ``launch`` the current generation, not yet ready: what ``start()`` does after spawning the
        processes and before waiting for them to answer (until ``launch.ready`` no rollout is sent to it
        and no probe calls it dead)."""
        with self._lock:
            self._launch, self._generation = launch, launch.generation
            self._deaths.begin(launch.generation)

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
    def launch(self) -> Launch | None:
        """The current (or last) launch: its supervisor, folders and ports. Read-only, for inspection."""
        return self._launch

    @property
    def ray_head(self) -> RayHead | None:
        """The shared Ray head this stack joined, if any."""
        return self._ray_head

    @property
    def running(self) -> bool:
        launch = self._launch
        return launch is not None and launch.ready and not launch.stopped and not self._deaths.is_over()

    @property
    def dead_reason(self) -> str | None:
        return self._deaths.reason

    def is_dead(self, generation: int | None = None) -> bool:
        """Whether the stack (of ``generation``, if given) died or was stopped."""
        if generation is not None and generation != self._generation:
            return True
        launch = self._launch
        return launch is None or launch.stopped or self._deaths.is_over()

    def on_death(self, listener: Callable[[int, str], None]) -> None:
        """Call ``listener(generation, reason)`` (from the monitor thread) when a server dies."""
        self._deaths.on_death(listener)

    def death_future(self, generation: int) -> asyncio.Future[str]:
        """A future of the running event loop that resolves, with the reason, when ``generation`` of this
        stack dies or is stopped (at once if it already has); see ``Deaths.future``."""
        return self._deaths.future(generation)

    def info(self) -> StackInfo:
        launch = self._running_launch()
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
        return self._running_launch().agent_url(agent, self.config.name)

    def run_url(self, agent: str | None = None) -> str:
        """Where a rollout of ``agent`` is posted: its environment server's ``/run`` when one relays to it,
        else the agent's (see ``Launch.run_url``)."""
        return self._running_launch().run_url(agent, self.config.name)

    @property
    def log_path(self) -> Path | None:
        return self._launch.log_path if self._launch else None

    def probe_now(self, generation: int) -> bool:
        """Check every server of ``generation`` at once (not waiting for the monitor); mark it dead if one
        is gone. For callers that just saw a refused connection. Returns whether that generation is alive;
        a newer generation (already restarted, maybe still starting) is never probed or marked by it."""
        launch = self._launch
        if launch is None or launch.stopped or self._deaths.is_over() or launch.generation != generation:
            return False
        if not launch.ready:  # a generation still starting is not probed (its ports may not listen yet)
            return False
        if launch.supervisor.poll() is not None:
            self._mark_dead(launch, "the Gym launcher (ng_run) exited")
            return False
        for name, (_, port) in launch.servers.items():
            if not port_accepts(HOST, port):
                self._mark_dead(launch, f"Gym server {name} refused connections on port {port}")
                return False
        return True

    def _running_launch(self) -> Launch:
        launch = self._launch
        if launch is None or launch.stopped:
            raise StackStartError(f"Gym stack {self.config.name} is not running.")
        return launch

    # -- launching -------------------------------------------------------------------------------

    def _check_requirements(self, runtime: GymRuntime) -> dict[str, Path | None]:
        """The venv of each server whose requirements the runtime lacks: an environment derived from the
        runtime (installed now the first time), or None for a venv nemo-gym builds (isolated venvs)."""
        return server_venvs(self.config.name, self._instances, runtime, isolated_venvs=self.config.isolated_venvs)

    def _join_ray_head(self, runtime: GymRuntime) -> RayHead | None:
        """The machine's Ray head this launch joins (kept across restarts while it lives), or None to let
        ng_run start its own Ray."""
        if not joins_shared_ray(self.config):
            return None
        head = self._ray_head
        if head is not None and not head.alive:
            self._leave_ray_head()
        if self._ray_head is None:
            # The head is the machine's, shared with other processes' stacks: none of this stack's own
            # variables (``pass_env``, its environment's) reach it, nor the Ray workers it may start.
            own = replace(self.config, pass_env=())
            self._ray_head = acquire_ray_head(runtime, child_env(os.environ, runtime.bin_dir, own))
        return self._ray_head

    def _leave_ray_head(self) -> None:
        head, self._ray_head = self._ray_head, None
        if head is not None:
            release_ray_head(head)

    def _link_venvs(self, runtime: GymRuntime, venvs: dict[str, Path | None]) -> Path:
        """Point each server's ``.venv`` at the runtime, or at its own venv in ``venvs`` (nemo-gym then
        skips building one); not for servers whose venv is None there (isolated: nemo-gym builds it, in
        a folder of its own so that no link of a non-isolated stack takes its place)."""
        links = cache_dir() / "server-venvs" / hashlib.sha256(str(runtime.prefix).encode()).hexdigest()[:12]
        if None in venvs.values():
            links = links.with_name(links.name + "-isolated")
        targets = {i.rel_dir: venvs.get(i.name, runtime.prefix) for i in self._instances}
        targets[Path("responses_api_models", POLICY_IMPLEMENTATION)] = runtime.prefix
        for rel, target in targets.items():
            link = links / rel / ".venv"
            if target is None or (link.is_symlink() and link.resolve() == target.resolve()):
                continue
            link.parent.mkdir(parents=True, exist_ok=True)
            tmp = link.with_name(f".venv.tmp-{secrets.token_hex(4)}")
            tmp.symlink_to(target, target_is_directory=True)
            os.replace(tmp, link)  # atomic: concurrent stacks may do the same
        return links

    def _spawn(self, runtime: GymRuntime, ray_head: RayHead | None, venvs: dict[str, Path | None]) -> Launch:
        links = self._link_venvs(runtime, venvs)
        sweep_run_dirs(cache_dir() / "runs")
        sweep_dead_owners(logs_dir(), keep_newest=KEEP_FAILED_LOGS)
        remove_legacy_port_locks(cache_dir() / "ports")
        name = run_id(self.config.name, os.getpid(), secrets.token_hex(4))
        with before_forced_exit():  # a second Ctrl-C now would leave the folders: the supervisor removes them
            return self._new_launch(runtime, ray_head, links, name)

    def _new_launch(self, runtime: GymRuntime, ray_head: RayHead | None, links: Path, name: str) -> Launch:
        run_dir = cache_dir() / "runs" / name
        log_dir = logs_dir() / name
        (log_dir / SERVER_LOGS).mkdir(parents=True)
        policy_dir = run_dir / "responses_api_models" / POLICY_IMPLEMENTATION
        policy_dir.mkdir(parents=True)
        shutil.copy(GYM_SIDE / "policy_server.py", policy_dir / "app.py")
        (policy_dir / "requirements.txt").write_text("# served by verifiers_nemo's routing proxy\n")
        policy_yaml = run_dir / "policy_model.yaml"
        policy_yaml.write_text(
            yaml.safe_dump(policy_model_config(self.config.policy_url, self.config.model_placeholders))
        )
        reservation = reserve_ports(1 + len(self._instances))
        head_port, *ports = reservation.ports
        servers = {i.name: (i, port) for i, port in zip(self._instances, ports, strict=True)}
        argv = ng_run_argv(
            runtime.ng_run,
            self.config,
            policy_yaml=policy_yaml,
            head_port=head_port,
            servers=servers,
            venv_links=links,
            uv_cache=cache_dir() / "uv",
            server_logs=log_dir / SERVER_LOGS,
            ray_head_address=ray_head.address if ray_head is not None else None,
        )
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
        own = config_variable_names(self.config.config_paths)  # the env's own variables reach its servers only
        env = child_env(os.environ, runtime.bin_dir, replace(self.config, pass_env=(*self.config.pass_env, *own)))
        supervisor = start_supervised(
            runtime.python, spec, cwd=run_dir, env={**env, **(ray_head.env() if ray_head else {})}
        )
        return Launch(
            generation=self._generation,
            supervisor=supervisor,
            run_dir=run_dir,
            log_path=log_path,
            head_port=head_port,
            servers=servers,
            started_at=time.monotonic(),
            ports=reservation,
        )

    def _stop_locked(self, keep_logs: bool = False) -> None:
        """Stop the launch; its run folder goes, its logs stay only when ``keep_logs`` or it died."""
        if self._monitor is not None:
            self._monitor.stop()
            self._monitor = None
        launch = self._launch
        if launch is None or launch.stopped:
            return
        launch.stopped = True
        keep_logs = keep_logs or self._deaths.died
        self._deaths.end("the Gym stack was stopped")
        label = f"Gym stack {self.config.name}"
        stop_supervised(launch.supervisor, label, self.config.stop_timeout, keep_logs=keep_logs)
        if launch.ports is not None:
            launch.ports.release()
        remove_path(launch.run_dir)  # the supervisor removes it too; not if it was killed
        if not keep_logs:
            remove_path(launch.log_path.parent)
        _untrack(self)

    # -- watching --------------------------------------------------------------------------------

    def _start_monitor(self, launch: Launch) -> None:
        processes = {launch.supervisor.pid: "the Gym launcher (ng_run) exited"}
        head = self._ray_head
        if head is not None:
            processes[head.pid] = f"the Ray head the stack joined exited (log: {head.log_path})"
        self._monitor = Monitor(
            self.config.name,
            processes=processes,
            servers={name: port for name, (_, port) in launch.servers.items()},
            sid=launch.supervisor.pid,
            on_death=lambda reason: self._mark_dead(launch, reason),
        ).start()

    def _mark_dead(self, launch: Launch, reason: str) -> None:
        if self._deaths.die(launch.generation, reason):
            logger.warning("Gym stack %s died: %s (log: %s)", self.config.name, reason, launch.log_path)


def _wait_ready(launch: Launch, stack_name: str, start_timeout: float) -> None:
    """Wait until every server of ``launch`` answers; ``StackStartError`` when ng_run exits or time is up."""
    deadline = launch.started_at + start_timeout
    pending = {"head_server": launch.head_port} | {n: p for n, (_, p) in launch.servers.items()}
    while pending:
        if launch.supervisor.poll() is not None:
            summary = failure_summary(launch.log_path, stack_name)
            raise StackStartError(f"{summary}\n(full log: {launch.log_path})")
        for name, port in list(pending.items()):
            if http_ok(port, HOST):
                del pending[name]
        if not pending:
            break
        if time.monotonic() > deadline:
            waiting = "\n".join(
                f"{name}'s last lines:\n" + "\n".join(f"  {line}" for line in server_lines(launch.log_path, name, 10))
                for name in sorted(pending)
                if name != "head_server"
            )
            raise StackStartError(
                f"Gym stack {stack_name}: {sorted(pending)} did not answer within "
                f"{start_timeout:.0f}s.\n{waiting or log_tail(launch.log_path)}\n"
                f"(full log: {launch.log_path})"
            )
        time.sleep(0.1)
    launch.ready_seconds = time.monotonic() - launch.started_at
    launch.ready = True


# -- process-wide registry: one stack per (process, config), teardown at exit -----------------------

_stacks: Registry[StackConfig, GymStack] = Registry()
_running_lock = threading.Lock()
_running: set[GymStack] = set()


def acquire_stack(config: StackConfig) -> GymStack:
    """The process's shared stack for ``config`` (created, not started, on first use), refcounted."""
    stack, _ = _stacks.acquire(config, lambda: GymStack(config))
    return stack


def release_stack(stack: GymStack) -> None:
    """Drop one reference; the last one stops the stack."""
    if _stacks.release(stack.config, stack):
        stack.stop()


def stop_all_stacks() -> None:
    """Stop every stack this process started (at interpreter exit). No signal handler calls it: when the
    process dies by a signal, each stack's supervisor sees its pipe close and takes the stack down."""
    with _running_lock:
        stacks = list(_running)
    for stack in stacks:
        try:
            stack.stop()
        except Exception:
            logger.exception("stopping Gym stack %s failed", stack.config.name)
    stop_all_ray_heads()


def _track(stack: GymStack) -> None:
    with _running_lock:
        _running.add(stack)
    at_exit(stop_all_stacks)


def _untrack(stack: GymStack) -> None:
    with _running_lock:
        _running.discard(stack)
