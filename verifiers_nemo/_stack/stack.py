"""GymStack: one NeMo Gym server stack (head server, resources server, Gym agent), run by ng_run.

The stack is launched with nemo-gym's own launcher from the Gym runtime interpreter, under a small
supervisor (``supervisor.py``) that leads its own process session: stopping the stack, or the death
of the owning process by any signal, takes down every process of that session.

The ``policy_model`` entry of the Gym config is a placeholder process whose host and port are the
routing proxy's, so Gym agents send their policy calls straight to the proxy. What to launch is
``plan.py``'s; launching it (one generation of processes) and waiting for it to answer, ``launch.py``'s; how a
death is seen, ``monitor.py``'s; how it is told, ``deaths.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from .._exceptions import StackStartError
from .._gym import GymRuntime, find_gym_runtime
from .._signals import at_exit
from . import waiting
from .config import HOST, StackConfig, StackInfo
from .deaths import Deaths
from .launch import Launch, spawn, wait_ready
from .logs import last_server_error, log_tail
from .monitor import Monitor
from .plan import child_env, joins_shared_ray, stack_servers
from .procs import port_accepts, remove_path, rss_bytes, session_pids
from .ray_head import RayHead, acquire_ray_head, join_env_without_token, release_ray_head, stop_all_ray_heads
from .registry import Registry
from .requirements import server_venvs
from .supervisor import stop_supervised
from .warm_parent import (
    WarmParent,
    WarmStartUnavailable,
    acquire_warm_parent,
    release_warm_parent,
    say_plain_servers,
    say_unavailable,
    stop_all_warm_parents,
    warm_start_wanted,
)

logger = logging.getLogger(__name__)

_START_ATTEMPTS = 3
_RAY_UNREACHED = "Failed to connect to Ray cluster"
"""How ``ray.init`` in a Gym server says it gave up on the head it was pointed at."""


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
        self._warm_parent: WarmParent | None = None
        self._warm_refused: str | None = None
        """Why the warm parent refused this stack (its own variables, say): later starts do not ask again."""
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
        limit = waiting.deadline(self.config.start_timeout)  # the whole start's, retries included
        for attempt in range(1, _START_ATTEMPTS + 1):
            warm = self._join_warm_parent(self.runtime)  # it prepares while the Ray head starts
            head = self._join_ray_head(self.runtime, limit)
            launch = spawn(self.config, self._instances, self.runtime, head, venvs, self._generation, warm, limit)
            if launch.warm_retry:  # the warm parent did not answer: the next start asks one that does
                self._leave_warm_parent()
            else:  # a refusal of this stack holds for its restarts
                self._warm_refused = self._warm_refused or launch.warm_refused
            self.begin_generation(launch)
            try:
                wait_ready(self._launch, self.config.name, limit)
                say_plain_servers(self.config.name, self._launch.log_path)
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
                    self._leave_warm_parent()
                    raise
                logger.warning(
                    "Gym stack %s: %s while starting; retrying",
                    self.config.name,
                    "its Ray head was not reached" if unreached else "a port was taken or the Ray head died",
                )
            except BaseException:
                self._stop_locked(keep_logs=True)
                self._leave_ray_head()
                self._leave_warm_parent()
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
            self._leave_warm_parent()

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
    def warm_parent(self) -> WarmParent | None:
        """The machine's warm parent this stack's processes are forked from, if any."""
        return self._warm_parent

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
        for shared in (self._ray_head, self._warm_parent):
            if shared is not None:
                pids += tuple(session_pids(shared.pid))
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

    def episode_taskset(self, agent: str | None = None) -> str | None:
        """The taskset of the typed environment server (nemo-gym 0.7's ``single_agent_turn``) that runs ``agent``'s
        rollouts as episodes, or None when they are rows (see ``Launch.episode_taskset``)."""
        return self._running_launch().episode_taskset(agent, self.config.name)

    @property
    def log_path(self) -> Path | None:
        return self._launch.log_path if self._launch else None

    def last_server_error(self) -> str | None:
        """The newest exception a resources server (or any server but the agents) of the running launch logged, in
        one line naming its file (see ``logs.last_server_error``); None when none did."""
        launch = self._launch
        if launch is None:
            return None
        return last_server_error(launch.log_path, skip=launch.agent_names, own=launch.own_paths)

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
        return server_venvs(
            self.config.name,
            self._instances,
            runtime,
            isolated_venvs=self.config.isolated_venvs,
            server_dirs=dict(self.config.server_dirs),
        )

    def _join_ray_head(self, runtime: GymRuntime, limit: waiting.Deadline) -> RayHead | None:
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
            self._ray_head = acquire_ray_head(runtime, child_env(os.environ, runtime.bin_dir, own), deadline=limit)
        return self._ray_head

    def _join_warm_parent(self, runtime: GymRuntime) -> WarmParent | None:
        """The machine's warm parent this launch forks from (kept across restarts while it lives), or None for a
        plain start: turned off (``StackConfig.warm_start``, ``VERIFIERS_NEMO_WARM_START=0``) or unavailable
        (said once)."""
        if not warm_start_wanted(self.config.warm_start) or self._warm_refused is not None:
            return None
        parent = self._warm_parent
        if parent is not None and not parent.alive:
            self._leave_warm_parent()
        if self._warm_parent is None:
            # The machine's, shared with other processes' stacks: none of this stack's own variables reach it
            # (each stack's supervisor gets its own environment).
            try:
                self._warm_parent = acquire_warm_parent(runtime, warm_parent_env(self.config, runtime))
            except WarmStartUnavailable as exc:
                say_unavailable(str(exc))
                return None
        return self._warm_parent

    def _leave_warm_parent(self) -> None:
        parent, self._warm_parent = self._warm_parent, None
        if parent is not None:
            release_warm_parent(parent)

    def _leave_ray_head(self) -> None:
        head, self._ray_head = self._ray_head, None
        if head is not None:
            release_ray_head(head)

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


def warm_parent_env(config: StackConfig, runtime: GymRuntime) -> dict[str, str]:
    """The environment of the warm parent a stack of ``config`` forks from: what its Gym processes get, less the
    stack's own variables (each stack's supervisor gets its own environment) and the Ray head's token (read only
    when a driver connects), with Ray's authentication mode, which Ray reads when it is imported."""
    env = child_env(os.environ, runtime.bin_dir, replace(config, pass_env=()))
    if joins_shared_ray(config):
        env |= join_env_without_token()
    return env


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
    stop_all_warm_parents()


def _track(stack: GymStack) -> None:
    with _running_lock:
        _running.add(stack)
    at_exit(stop_all_stacks)


def _untrack(stack: GymStack) -> None:
    with _running_lock:
        _running.discard(stack)
