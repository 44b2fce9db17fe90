"""What a Gym stack runs (``StackConfig``, plain data built by the harness or the CLI) and what a running one
reports (``StackInfo``); ``GymStack`` runs the one and returns the other, as uvicorn's Server runs its Config."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HOST = "127.0.0.1"
"""Every Gym server of a stack, and its Ray head, listens on the loopback address only."""


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
    model_placeholders: tuple[tuple[str, str], ...] = ()
    """``(instance name, URL)`` of model servers the configs refer to that are addresses of ours (the
    routing proxy's judge ports): each gets a placeholder entry there, like ``policy_model``."""
    gym_python: str | None = None
    gym_version: str | None = None
    """The nemo-gym series of a managed runtime (``0.7``, ``0.4``; None: the newest this machine runs)."""
    isolated_venvs: bool = False
    """Let nemo-gym build its own venv (from PyPI) for servers whose requirements the runtime lacks."""
    pass_env: tuple[str, ...] = ()
    """Environment variables with secret-looking names that Gym processes may still see."""
    secrets: frozenset[str] = field(default=frozenset(), repr=False)
    """Values Gym processes must never see (API keys): environment variables holding one are dropped."""
    server_dirs: tuple[tuple[str, str], ...] = ()
    """``(relative folder, folder)`` of each server that runs from a folder of yours rather than the Gym install
    (``resources_servers/my_env`` → ``/home/me/project/resources_servers/my_env``): linked into the launch's working
    folder, where Gym looks first."""
    shared_ray: bool = True
    """Join the machine's one Ray head for Gym stacks (see ``ray_head``: shared by every process through leases)
    instead of letting ng_run start a Ray cluster per stack. Ignored when ``overrides`` name a
    ``ray_head_node_address`` of their own."""
    warm_start: bool | None = None
    """Start the stack's Gym processes as forks of the machine's warm parent of the runtime (``warm_parent``: no
    interpreter start-up, shared memory) instead of fresh interpreters. None: ``VERIFIERS_NEMO_WARM_START``
    (on unless ``0``). Where it cannot serve, the stack starts the plain way and the log says why, once."""
    start_timeout: float | None = None
    """The limit on each start, in seconds (Ray head, warm parent and servers together): None:
    ``VERIFIERS_NEMO_START_TIMEOUT``, else 600 (``waiting``)."""
    stop_timeout: float = 10.0


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
    """The stack's processes, and those of the Ray head it joined (the machine's, shared with other stacks and
    other processes: its memory is not this stack's alone)."""
    rss_bytes: int = 0
