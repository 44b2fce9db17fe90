"""The launch plan of a stack, as pure functions of its config (no processes, no files written): which
servers it runs, the policy entry of its Gym config, ng_run's argv, and the environment Gym processes get."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from .._exceptions import ConfigurationError
from .._gym import POLICY_MODEL, ServerInstance, merged_configs, server_instances
from .._gym.config import ENVIRONMENT_SERVERS, FLAT_RUN_SERVERS, RESPONSES_API_AGENTS
from .._offline import network_off_env
from .config import HOST, StackConfig

POLICY_IMPLEMENTATION = "verifiers_nemo_policy"
"""The implementation name of the placeholder ``policy_model`` server (whose host and port are the proxy's)."""
_SECRET_NAME = re.compile(r"(API_?KEY|TOKEN|SECRET|PASSWORD|CREDENTIAL)", re.IGNORECASE)


def stack_servers(config: StackConfig) -> list[ServerInstance]:
    """The servers the stack runs (its config's, less ``policy_model``); refuses a config without a Gym agent
    or one whose servers refer to a server it does not define (a judge model, say)."""
    for path in config.config_paths:
        if not Path(path).is_file():
            raise ConfigurationError(f"Gym config file {path} does not exist.")
    instances = server_instances(merged_configs([Path(p) for p in config.config_paths]))
    instances = [i for i in instances if i.name != POLICY_MODEL]
    if not any(i.server_type == "responses_api_agents" for i in instances):
        raise ConfigurationError(
            f"Gym config {', '.join(map(str, config.config_paths))} defines no Gym agent "
            "(a responses_api_agents entry); pass an environment config."
        )
    names = {i.name for i in instances} | {POLICY_MODEL} | {name for name, _ in config.model_placeholders}
    refuse_unknown_references(instances, config.config_paths, names)
    refuse_episode_servers(instances, config.config_paths)
    return instances


def refuse_episode_servers(instances: Sequence[ServerInstance], config_paths: Sequence[str | Path]) -> None:
    """Refuse a typed environment server that runs no one agent's rollouts (nemo-gym 0.7's ``nemo_user_sim``: a
    user and an assistant agent, several model servers): its agents would run without it, which is not the
    environment. Those that front one agent (``single_agent_turn``: its ``agent_server``) run as episodes."""
    agents = [i.name for i in instances if i.server_type == RESPONSES_API_AGENTS]
    for instance in instances:
        if instance.server_type != ENVIRONMENT_SERVERS or instance.implementation in FLAT_RUN_SERVERS:
            continue
        if any(instance.takes_episodes_of(agent) for agent in agents):
            continue
        raise ConfigurationError(
            f"Gym environment server {instance.name!r} (environment_servers/{instance.implementation}, in "
            f"{_config_defining(instance.name, config_paths)}) takes typed episodes at /run and names no one "
            "agent (agent_server) whose rollouts it runs, and verifiers-nemo drives only those: its agents would "
            "run without it. Run it with nemo-gym's own `gym eval run`, or pick a config whose environment server "
            f"fronts one agent (single_agent_turn, or one of {sorted(FLAT_RUN_SERVERS)})."
        )


def refuse_unknown_references(
    instances: Sequence[ServerInstance], config_paths: Sequence[str | Path], defined: set[str] | None = None
) -> None:
    """Refuse a server that refers to one the configs do not define: a typo of a resources server or agent name
    (said with the closest names and the config file), or a model server such as a judge that needs routing.
    ``defined`` is every name that counts as defined; None: the instances' and ``policy_model``, any model name."""
    import difflib

    known = {i.name for i in instances} | {POLICY_MODEL}
    for instance in instances:
        for server_type, ref in instance.references():
            if ref in (defined if defined is not None else known):
                continue
            if defined is None and server_type == "responses_api_models":
                continue  # a judge model server: the judges' check says what to do
            where = _config_defining(instance.name, config_paths)
            if server_type != "responses_api_models":
                same_kind = sorted(i.name for i in instances if i.server_type == server_type)
                close = difflib.get_close_matches(ref, same_kind, n=1, cutoff=0.6)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigurationError(
                    f"Gym server {instance.name!r} (in {where}) refers to {server_type}/{ref!r}, which no config "
                    f"of this environment defines.{hint} Fix: correct that name in {where} (its {server_type}: "
                    f"{', '.join(same_kind) or 'none'})."
                )
            raise ConfigurationError(
                f"Gym server {instance.name!r} (in {where}) refers to {server_type}/{ref!r}, which this stack "
                "does not define. Servers other than policy_model (e.g. a judge model) must be "
                "routed or configured explicitly; this environment cannot run as it is."
            )


def _config_defining(name: str, config_paths: Sequence[str | Path]) -> str:
    for path in config_paths:
        try:
            if name in merged_configs([Path(path)]):
                return str(path)
        except Exception:  # an unreadable config was refused already; name them all
            break
    return ", ".join(map(str, config_paths))


def policy_model_config(policy_url: str, placeholders: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The Gym config entries of ``policy_model`` and of ``placeholders`` (judges): placeholder servers
    whose host and port are the routing proxy's."""
    entries = {}
    for name, url in ((POLICY_MODEL, policy_url), *placeholders):
        address = urlsplit(url)
        entries[name] = {
            "responses_api_models": {
                POLICY_IMPLEMENTATION: {"entrypoint": "app.py", "host": address.hostname, "port": address.port}
            }
        }
    return entries


def ng_run_argv(
    start_command: Path | Sequence[str],
    config: StackConfig,
    *,
    policy_yaml: Path,
    head_port: int,
    servers: Mapping[str, tuple[ServerInstance, int]],
    venv_links: Path,
    uv_cache: Path,
    server_logs: Path,
    ray_head_address: str | None,
) -> list[str]:
    """The stack's command line: ``start_command`` (``GymRuntime.start_command``: ``ng_run``, or ``gym env start``;
    a path is ``ng_run``'s), then the overrides: the env's configs and ours, every server's host and port, our venvs
    and logs."""
    config_paths = ",".join(str(Path(p).resolve()) for p in (*config.config_paths, policy_yaml))
    command = [str(start_command)] if isinstance(start_command, Path) else list(start_command)
    argv = [
        *command,
        f"+config_paths=[{config_paths}]",
        "+skip_venv_if_present=true",
        f"+uv_venv_dir={venv_links}",
        f"+uv_cache_dir={uv_cache}",
        f"+nemo_gym_log_dir={server_logs}",  # each server's own output, for failure messages
        f"+default_host={HOST}",
        f"++head_server={{host:{HOST},port:{head_port}}}",
    ]
    for instance, port in servers.values():
        if overridable(instance):
            argv += [f"++{instance.override_prefix}.host={HOST}", f"++{instance.override_prefix}.port={port}"]
    if ray_head_address is not None:
        argv.append(f"+ray_head_node_address={ray_head_address}")
    return argv + list(config.overrides)


_DOTTED_KEY = re.compile(r"[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*")
"""A key Hydra's override grammar takes as a dotted path (a ``/`` makes it a config group, and more is refused)."""


def overridable(instance: ServerInstance) -> bool:
    """Whether ``instance``'s settings can be set with a ``++key=value`` override (not when a name in its path holds
    a ``/``, as ``conversational_tool_use/simulation`` does: Gym's parser refuses such a key)."""
    return _DOTTED_KEY.fullmatch(instance.override_prefix) is not None


def address_config(servers: Mapping[str, tuple[ServerInstance, int]]) -> dict[str, Any]:
    """The host and port of each server no override can address, as Gym config entries (merged after the env's
    configs, like ``policy_model``'s)."""
    entries: dict[str, Any] = {}
    for instance, port in servers.values():
        if not overridable(instance):
            kinds = entries.setdefault(instance.name, {}).setdefault(instance.server_type, {})
            kinds[instance.implementation] = {"host": HOST, "port": port}
    return entries


def joins_shared_ray(config: StackConfig) -> bool:
    """Whether the stack joins the process's Ray head (not when its overrides name a Ray cluster)."""
    return config.shared_ray and not any("ray_head_node_address" in o for o in config.overrides)


def child_env(environ: Mapping[str, str], bin_dir: Path, config: StackConfig) -> dict[str, str]:
    """The environment of Gym processes: no secrets (secret-looking names unless ``config.pass_env`` names
    them, and any variable holding one of ``config.secrets``), the runtime's ``bin_dir`` first on PATH."""
    env = {
        k: v
        for k, v in environ.items()
        if (not _SECRET_NAME.search(k) or k in config.pass_env) and v not in config.secrets
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # compiled bytecode halves each server's start
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["UV_PYTHON_DOWNLOADS"] = "never"
    env["RAY_USAGE_STATS_ENABLED"] = "0"
    # Ray's public switch for single-machine clusters: with it off, Ray takes the loopback address
    # as its node IP, so its GCS, raylet, agents and workers listen on 127.0.0.1 instead of every
    # interface (measured: 14 non-loopback listening sockets per stack without it, 0 with it).
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    env["PYTHONUNBUFFERED"] = "1"
    return env | network_off_env()  # an offline folder named: Gym's uv, pip and Hugging Face stay off the network


RUN_VAR = "VERIFIERS_NEMO_RUN"
"""Set in the environment of every process of a launch: its run folder (``<cache>/runs/<run id>``, see ``run_id``),
which ``verifiers-nemo ps`` reads."""


def run_id(name: str, pid: int, token: str) -> str:
    """A launch's folder name, ``<name>-<owner pid>-<token>``: swept once its owner is gone."""
    return f"{re.sub(r'[^A-Za-z0-9_.]+', '_', name) or '_'}-{pid}-{token}"
