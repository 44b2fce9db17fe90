"""verifiers_nemo: run NVIDIA NeMo Gym environments inside Verifiers-style RL and eval stacks.

Public API (everything else is private):

* ``NeMoGymTaskset`` / ``Task`` - packaged Gym environments' JSONL tasks, or any JSONL file.
* ``NeMoGymHarness`` - runs tasks as rollouts through one shared real Gym stack per process.
* ``Endpoint`` - the OpenAI-compatible inference server (Responses or Chat Completions) of a rollout.
* ``RolloutResult`` - reward, metrics, completion, per-call trace, usage, timing, typed error.
* ``load_environment`` / ``NeMoGymEnv`` - the Verifiers-style environment factory.
* ``list_environments`` / ``get_environment`` - the catalogue of packaged environments.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._errors import (
    ConfigurationError,
    GymAgentError,
    GymRuntimeError,
    GymServerDown,
    InvalidResult,
    MissingRequirementsError,
    RolloutError,
    RolloutTimeout,
    RouteClosed,
    StackStartError,
    TasksetError,
    UnknownEnvironmentError,
    UpstreamError,
    VerifiersNemoError,
)

if TYPE_CHECKING:
    from ._catalogue import GymEnvironment, get_environment, list_environments
    from ._endpoint import Endpoint
    from ._environment import NeMoGymEnv, load_environment
    from ._harness import NeMoGymHarness
    from ._proxy import PolicyCall, Route, RoutingProxy
    from ._replay import ReplayUpstream
    from ._result import RolloutResult
    from ._stack import GymStack, StackConfig
    from ._taskset import NeMoGymTaskset, Task

# Heavy modules (datasets, openai, aiohttp) load on first use, so `verifiers-nemo --help` stays fast.
_LAZY = {
    "Endpoint": "._endpoint",
    "GymEnvironment": "._catalogue",
    "GymStack": "._stack",
    "NeMoGymEnv": "._environment",
    "NeMoGymHarness": "._harness",
    "NeMoGymTaskset": "._taskset",
    "PolicyCall": "._proxy",
    "ReplayUpstream": "._replay",
    "RolloutResult": "._result",
    "Route": "._proxy",
    "RoutingProxy": "._proxy",
    "StackConfig": "._stack",
    "Task": "._taskset",
    "get_environment": "._catalogue",
    "list_environments": "._catalogue",
    "load_environment": "._environment",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'verifiers_nemo' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "ConfigurationError",
    "Endpoint",
    "GymAgentError",
    "GymEnvironment",
    "GymRuntimeError",
    "GymServerDown",
    "GymStack",
    "InvalidResult",
    "MissingRequirementsError",
    "NeMoGymEnv",
    "NeMoGymHarness",
    "NeMoGymTaskset",
    "PolicyCall",
    "ReplayUpstream",
    "RolloutError",
    "RolloutResult",
    "RolloutTimeout",
    "Route",
    "RouteClosed",
    "RoutingProxy",
    "StackConfig",
    "StackStartError",
    "Task",
    "TasksetError",
    "UnknownEnvironmentError",
    "UpstreamError",
    "VerifiersNemoError",
    "get_environment",
    "list_environments",
    "load_environment",
]
