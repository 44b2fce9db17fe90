"""``StackOptions``: what a harness asks of the stacks it starts (runtime, venvs, step bound, Ray, timeouts),
and how an environment name becomes a ``StackConfig`` under them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .._exceptions import ConfigurationError
from .._gym import GymRuntime, find_gym_runtime, get_environment, gym_root, merged_configs, server_instances
from .config import StackConfig
from .own_servers import own_server_dirs

DEFAULT_MAX_STEPS = 100
_STEP_BOUNDED_AGENTS = frozenset({"simple_agent"})  # agents whose config has max_steps


@dataclass(frozen=True)
class StackOptions:
    """Plain data: the Gym runtime (``gym_python``, else ``gym_version`` of a managed one), nemo-gym's own
    venvs or ours, the step bound given to simple agents that set none, Ray, the start timeout, overrides."""

    gym_python: str | None = None
    gym_version: str | None = None
    isolated_venvs: bool = False
    max_steps: int | None = DEFAULT_MAX_STEPS
    start_timeout: float | None = None
    overrides: tuple[str, ...] = ()
    shared_ray: bool = True
    config_paths: tuple[Path, ...] | None = None
    """Explicit Gym config YAMLs; None: the environment's default config."""

    def runtime(self) -> GymRuntime:
        return find_gym_runtime(self.gym_python, gym_version=self.gym_version)

    def root(self) -> Path:
        return gym_root(self.gym_python, self.gym_version)

    def env_config_paths(self, env_name: str) -> tuple[Path, ...]:
        """The configs to run: the explicit ones, else the packaged environment's default config."""
        if self.config_paths:
            return self.config_paths
        env = get_environment(env_name, root=self.root())
        if env.broken:
            raise ConfigurationError(
                f"Gym environment {env_name} cannot run as nemo-gym {self.runtime().nemo_gym_version} packages it: "
                f"{env.broken}. Pick another release of nemo-gym (gym_version=, VERIFIERS_NEMO_GYM_VERSION) or fix "
                "its files and pass config_paths=."
            )
        if env.default_config is None:
            raise ConfigurationError(f"Gym environment {env_name} has no config file.")
        return (env.default_config.path,)

    def server_dirs(self, config_paths: Sequence[Path]) -> tuple[tuple[str, str], ...]:
        """The servers of ``config_paths`` that run from folders of yours (checked: ``own_server_dirs``)."""
        return own_server_dirs(config_paths, self.root())

    def step_bound_overrides(self, config_paths: Sequence[Path]) -> list[str]:
        """Bound the steps of simple agents that set no bound (nemo-gym's default is unbounded)."""
        if self.max_steps is None:
            return []
        return [
            f"++{instance.override_prefix}.max_steps={int(self.max_steps)}"
            for instance in server_instances(merged_configs(list(config_paths)))
            if instance.implementation in _STEP_BOUNDED_AGENTS and not instance.config.get("max_steps")
        ]

    def stack_config(
        self,
        name: str,
        config_paths: Sequence[Path],
        launched_paths: Sequence[Path],
        placeholders: tuple[tuple[str, str], ...],
        policy_url: str,
        secrets: frozenset[str],
    ) -> StackConfig:
        """The ``StackConfig`` of environment ``name`` (``launched_paths``: its configs as rewritten for the
        judges) with its policy at ``policy_url``."""
        return StackConfig(
            name=name,
            config_paths=tuple(launched_paths),
            server_dirs=self.server_dirs(config_paths),
            model_placeholders=placeholders,
            policy_url=policy_url,
            overrides=(*self.step_bound_overrides(config_paths), *self.overrides),
            gym_python=self.gym_python,
            gym_version=self.gym_version,
            isolated_venvs=self.isolated_venvs,
            shared_ray=self.shared_ray,
            start_timeout=self.start_timeout,
            secrets=secrets,
        )
