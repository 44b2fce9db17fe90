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

from ._exceptions import (
    ConfigurationError,
    GymAgentError,
    GymRuntimeError,
    GymServerDown,
    InvalidResult,
    MissingRequirementsError,
    RolloutError,
    RolloutTimeout,
    StackStartError,
    TasksetError,
    UnknownEnvironmentError,
    UpstreamConnectionError,
    UpstreamConversionError,
    UpstreamError,
    UpstreamHTTPError,
    UpstreamInternalError,
    UpstreamProtocolError,
    UpstreamTimeout,
    VerifiersNemoError,
)

if TYPE_CHECKING:
    from ._endpoint import Endpoint
    from ._environment import NeMoGymEnv, load_environment
    from ._gym.catalogue import GymEnvironment, get_environment, list_environments
    from ._harness import NeMoGymHarness
    from ._result import RolloutResult
    from ._routing import ProxyConfig
    from ._routing.proxy import PolicyCall, Route, RoutingProxy
    from ._stack import GymStack, StackConfig
    from ._tasks import NeMoGymTaskset, Task
    from ._upstreams.replay import ReplayUpstream

# Heavy modules (datasets, openai, aiohttp) load on first use, so `verifiers-nemo --help` stays fast.
_LAZY = {
    "Endpoint": "._endpoint",
    "GymEnvironment": "._gym.catalogue",
    "GymStack": "._stack",
    "NeMoGymEnv": "._environment",
    "NeMoGymHarness": "._harness",
    "NeMoGymTaskset": "._tasks",
    "PolicyCall": "._routing.proxy",
    "ProxyConfig": "._routing",
    "ReplayUpstream": "._upstreams.replay",
    "RolloutResult": "._result",
    "Route": "._routing.proxy",
    "RoutingProxy": "._routing.proxy",
    "StackConfig": "._stack",
    "Task": "._tasks",
    "get_environment": "._gym.catalogue",
    "list_environments": "._gym.catalogue",
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
    "ProxyConfig",
    "ReplayUpstream",
    "RolloutError",
    "RolloutResult",
    "RolloutTimeout",
    "Route",
    "RoutingProxy",
    "StackConfig",
    "StackStartError",
    "Task",
    "TasksetError",
    "UnknownEnvironmentError",
    "UpstreamConnectionError",
    "UpstreamConversionError",
    "UpstreamError",
    "UpstreamHTTPError",
    "UpstreamInternalError",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "VerifiersNemoError",
    "get_environment",
    "list_environments",
    "load_environment",
]
