"""One launch of a Gym stack's processes: its folders, port table, policy placeholder and supervised ``ng_run``
(``spawn``), and the wait until every server answers (``wait_ready``).

What to launch is ``plan.py``'s (servers, argv, environment); ``GymStack`` decides when, and watches, restarts and
stops what a launch started. Each launch is a generation of the stack: a restart is a new launch.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from .._exceptions import ConfigurationError, StackStartError
from .._gym import GymRuntime, ServerInstance, cache_dir
from .._gym.env_vars import config_variable_names
from .._signals import before_forced_exit
from .config import HOST, StackConfig
from .launchers import launcher_unusable, launcher_venv
from .logs import KEEP_FAILED_LOGS, SERVER_LOGS, failure_summary, log_tail, logs_dir, server_lines, sweep_run_dirs
from .plan import POLICY_IMPLEMENTATION, RUN_VAR, address_config, child_env, ng_run_argv, policy_model_config, run_id
from .procs import (
    PortReservation,
    http_ok,
    remove_legacy_port_locks,
    remove_path,
    reserve_ports,
    sweep_dead_owners,
)
from .ray_head import RayHead
from .supervisor import GYM_SIDE, Supervised, start_supervised
from .waiting import SAY_EVERY_S, START_TIMEOUT_ENV_VAR, Deadline, machine_load
from .warm_parent import WarmParent, WarmStartUnavailable, say_unavailable

logger = logging.getLogger(__name__)


@dataclass
class Launch:
    """One run of the stack's processes: its supervisor, folders and port table."""

    generation: int
    supervisor: Supervised
    """Plain (``subprocess.Popen``) or forked by the warm parent (``WarmSupervisor``)."""
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
    warm_refused: str | None = None
    """Why the warm parent could not fork this launch's supervisor (it started the plain way), if it could not."""
    own_paths: tuple[str, ...] = ()
    """The folders of servers of yours (absolute, and as the run folder links them): a traceback frame in one of them
    is named in failure messages."""
    warm_retry: bool = False
    """That failure was the warm parent not answering (not a refusal of this stack): a restart asks again."""
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
        relay = next(
            (n for n, (i, _) in self.servers.items() if i.relays_run_of(name) or i.takes_episodes_of(name)), name
        )
        return f"http://{HOST}:{self.servers[relay][1]}/run"

    def episode_taskset(self, agent: str | None, stack_name: str) -> str | None:
        """The taskset of the typed environment server that runs ``agent``'s rollouts as episodes, or None when
        its rollouts are rows (posted to the agent, or to a relay that takes rows)."""
        name = self._agent_name(agent, stack_name)
        typed = (i for i, _ in self.servers.values() if i.takes_episodes_of(name))
        return next((i.episode_taskset for i in typed), None)

    def _agent_name(self, agent: str | None, stack_name: str) -> str:
        names = self.agent_names
        if agent is None:
            if len(names) != 1:
                raise ConfigurationError(f"Gym stack {stack_name} has several agents {list(names)}; name one.")
            agent = names[0]
        if agent not in names:
            raise ConfigurationError(f"Gym stack {stack_name} has no agent {agent!r}; it has {list(names)}.")
        return agent


def spawn(
    config: StackConfig,
    instances: Sequence[ServerInstance],
    runtime: GymRuntime,
    ray_head: RayHead | None,
    venvs: dict[str, Path | None],
    generation: int,
    warm: WarmParent | None = None,
    deadline: Deadline | None = None,
) -> Launch:
    """Start generation ``generation`` of the stack's processes (not waiting for them to answer): forked from
    the warm parent ``warm`` when given (the servers on the runtime through its launcher venv), else plain.

    A warm request that fails (said once) is followed by a plain launch of its own: other folders, other ports.
    The warm parent may have forked a supervisor for the request before the failure (its answer lost): that one
    sees its owner's pipe closed and removes its folders, which therefore must not be the plain launch's."""
    sweep_run_dirs(cache_dir() / "runs")
    sweep_dead_owners(logs_dir(), keep_newest=KEEP_FAILED_LOGS)
    remove_legacy_port_locks(cache_dir() / "ports")
    refused, retry = None, False
    if warm is not None:
        links = _link_venvs(runtime, instances, _warm_venvs(runtime, venvs), launcher_venv(runtime), config.server_dirs)
        try:
            with before_forced_exit():  # a second Ctrl-C now would leave the folders: the supervisor removes them
                return _new_launch(config, instances, runtime, ray_head, links, generation, warm, deadline)
        except WarmStartUnavailable as exc:
            say_unavailable(str(exc))
            refused, retry = str(exc), exc.transient
    links = _link_venvs(runtime, instances, venvs, None, config.server_dirs)
    with before_forced_exit():
        launch = _new_launch(config, instances, runtime, ray_head, links, generation, None)
    launch.warm_refused, launch.warm_retry = refused, retry
    return launch


def _warm_venvs(runtime: GymRuntime, venvs: dict[str, Path | None]) -> dict[str, Path | None]:
    """``venvs`` for a warm launch: each environment derived from the runtime as its launcher venv (the server is
    then forked too, where the warm parent can stand for that environment; else its launcher starts it plain)."""
    return {
        name: launcher_venv(runtime, venv) if venv is not None and launcher_unusable(runtime, venv) is None else venv
        for name, venv in venvs.items()
    }


def _link_venvs(
    runtime: GymRuntime,
    instances: Sequence[ServerInstance],
    venvs: dict[str, Path | None],
    launcher: Path | None,
    server_dirs: tuple[tuple[str, str], ...] = (),
) -> Path:
    """Point each server's ``.venv`` at the runtime (or, started warm, at its ``launcher`` venv), or at its own
    venv in ``venvs`` (nemo-gym then skips building one); not for servers whose venv is None there (isolated:
    nemo-gym builds it, in a folder of its own so that no link of a non-isolated stack takes its place). Stacks
    running servers of your folders (``server_dirs``) link in a folder of those folders' own: a folder of yours named
    like a packaged server (or like another of yours) may need another venv, and no stack's link takes another's."""
    links = cache_dir() / "server-venvs" / hashlib.sha256(str(runtime.prefix).encode()).hexdigest()[:12]
    if server_dirs:
        links = links.with_name(links.name + "-" + hashlib.sha256(repr(sorted(server_dirs)).encode()).hexdigest()[:8])
    if None in venvs.values():
        links = links.with_name(links.name + "-isolated")
    if launcher is not None:
        links = links.with_name(links.name + "-warm")
    on_runtime = launcher or runtime.prefix
    targets = {i.rel_dir: venvs.get(i.name, on_runtime) for i in instances}
    targets[Path("responses_api_models", POLICY_IMPLEMENTATION)] = on_runtime
    for rel, target in targets.items():
        link = links.joinpath(*rel.parts[-2:], ".venv")  # where nemo-gym looks: the server folder's last two names
        if target is None or (link.is_symlink() and link.resolve() == target.resolve()):
            continue
        link.parent.mkdir(parents=True, exist_ok=True)
        tmp = link.with_name(f".venv.tmp-{secrets.token_hex(4)}")
        tmp.symlink_to(target, target_is_directory=True)
        os.replace(tmp, link)  # atomic: concurrent stacks may do the same
    return links


def _new_launch(
    config: StackConfig,
    instances: Sequence[ServerInstance],
    runtime: GymRuntime,
    ray_head: RayHead | None,
    links: Path,
    generation: int,
    warm: WarmParent | None,
    deadline: Deadline | None = None,
) -> Launch:
    """A launch under a new name (``run_id``): its supervisor forked by ``warm`` when given (``WarmStartUnavailable``
    when it cannot be, its folders and ports given up), else started plain."""
    name = run_id(config.name, os.getpid(), secrets.token_hex(4))
    run_dir = cache_dir() / "runs" / name
    log_dir = logs_dir() / name
    (log_dir / SERVER_LOGS).mkdir(parents=True)
    policy_dir = run_dir / "responses_api_models" / POLICY_IMPLEMENTATION
    policy_dir.mkdir(parents=True)
    for rel, folder in config.server_dirs:  # your own servers: where Gym looks first (the run folder is its cwd)
        link = run_dir / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(folder, target_is_directory=True)
    shutil.copy(GYM_SIDE / "policy_server.py", policy_dir / "app.py")
    (policy_dir / "requirements.txt").write_text("# served by verifiers_nemo's routing proxy\n")
    reservation = reserve_ports(1 + len(instances))
    head_port, *ports = reservation.ports
    servers = {i.name: (i, port) for i, port in zip(instances, ports, strict=True)}
    policy_yaml = run_dir / "policy_model.yaml"
    ours = policy_model_config(config.policy_url, config.model_placeholders) | address_config(servers)
    policy_yaml.write_text(yaml.safe_dump(ours))
    argv = ng_run_argv(
        runtime.start_command,
        config,
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
        "grace_s": max(1.0, config.stop_timeout - 3.0),
        "ports": [[HOST, port] for _, port in servers.values()],
        "remove": [str(run_dir)],
        "logs": [str(log_dir)],
    }
    logger.debug("Launching Gym stack %s: %s", config.name, argv)
    own = config_variable_names(config.config_paths)  # the env's own variables reach its servers only
    env = child_env(os.environ, runtime.bin_dir, replace(config, pass_env=(*config.pass_env, *own)))
    env |= ray_head.env() if ray_head is not None else {}
    env[RUN_VAR] = str(run_dir)  # every process of the launch says which run it is of (``verifiers-nemo ps``)
    if warm is None:
        supervisor: Supervised = start_supervised(runtime.python, spec, cwd=run_dir, env=env)
    else:
        try:
            supervisor = warm.supervise(spec, env, run_dir, deadline)
        except WarmStartUnavailable:
            reservation.release()
            remove_path(run_dir)
            remove_path(log_dir)
            raise
    return Launch(
        generation=generation,
        supervisor=supervisor,
        run_dir=run_dir,
        log_path=log_path,
        head_port=head_port,
        servers=servers,
        started_at=time.monotonic(),
        ports=reservation,
        own_paths=tuple(p for rel, folder in config.server_dirs for p in (f"{folder}/", f"{rel}/")),
    )


def wait_ready(launch: Launch, stack_name: str, deadline: Deadline) -> None:
    """Wait until every server of ``launch`` answers; ``StackStartError`` when ng_run exits or the start's
    ``deadline`` passes. Every 30 s it says which servers are waited for."""
    start_timeout = deadline.limit
    said_at = time.monotonic()
    pending = {"head_server": launch.head_port} | {n: p for n, (_, p) in launch.servers.items()}
    while pending:
        if launch.supervisor.poll() is not None:
            summary = failure_summary(launch.log_path, stack_name, launch.own_paths)
            raise StackStartError(f"{summary}\n(full log: {launch.log_path})")
        for name, port in list(pending.items()):
            if http_ok(port, HOST):
                del pending[name]
        if not pending:
            break
        now = time.monotonic()
        if now - said_at >= SAY_EVERY_S:
            said_at = now
            logger.warning(
                "Gym stack %s: %s still starting after %.0fs: %s; waiting up to %.0fs more (%s)",
                stack_name,
                ", ".join(sorted(pending)),
                now - launch.started_at,
                machine_load(),
                max(0.0, deadline.at - now),
                START_TIMEOUT_ENV_VAR,
            )
        if now > deadline.at:
            waiting = "\n".join(
                f"{name}'s last lines:\n"
                + "\n".join(f"  {line}" for line in server_lines(launch.log_path, name, 10, launch.own_paths))
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
