"""An eval's environment as verifiers' env config for ``nemo-gym-env``: the ``taskset`` and ``agent.harness`` tables a
user writes for ``vf-eval nemo-gym-env`` or prime-rl's ``[[orchestrator.train.source]]``, from the eval's settings."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._eval.settings import ENV_PACKAGE
from .._exceptions import ConfigurationError

_TASKSET_ARGS = ("gym_python",)
_HARNESS_ARGS = ("max_steps", "isolated_venvs")


def verifiers_env_config(
    nemo_env: str,
    env_args: Mapping[str, Any],
    *,
    recorded: bool,
    timeout: float,
    judges: Mapping[str, Mapping[str, Any]],
) -> dict[str, Any]:
    """The env config of ``nemo_env`` (``judges``: the eval's, at most one under verifiers: ``*``)."""
    taskset: dict[str, Any] = {"id": ENV_PACKAGE, "nemo_env": nemo_env, "recorded": recorded}
    taskset.update({k: env_args[k] for k in _TASKSET_ARGS if env_args.get(k) is not None})
    harness: dict[str, Any] = {"id": ENV_PACKAGE, "timeout": timeout}
    harness.update({k: env_args[k] for k in _HARNESS_ARGS if env_args.get(k) is not None})
    if judges:
        if set(judges) != {"*"}:
            raise ConfigurationError(
                "--client-type train takes one judge for every judge name (--judge-base-url URL --judge-model M), as "
                "verifiers' nemo-gym-env harness does; --judge NAME=... names one."
            )
        harness.update(judge_fields(judges["*"]))
    return {"taskset": taskset, "agent": {"harness": harness}}


def judge_fields(judge: Mapping[str, Any]) -> dict[str, Any]:
    """A judge as the nemo-gym-env harness's ``judge_*`` keys."""
    fields = {
        "judge_base_url": judge["base_url"],
        "judge_model": judge["model"],
        "judge_api": judge.get("api") or "responses",
    }
    if judge.get("api_key_var"):
        fields["judge_api_key_var"] = judge["api_key_var"]
    return fields
