"""verifiers_nemo: run NVIDIA NeMo Gym environments inside Verifiers-style RL and eval stacks.

Public API (everything else is private):

* ``NeMoGymTaskset`` / ``Task`` - packaged Gym environments' JSONL tasks, or any JSONL file.
* ``NeMoGymHarness`` - runs tasks as rollouts through one shared real Gym stack per process.
* ``Endpoint`` - the OpenAI-compatible inference server (Responses or Chat Completions) of a rollout.
* ``RolloutResult`` - reward, metrics, completion, per-call trace, usage, timing, typed error.
* ``load_environment`` / ``NeMoGymEnv`` - the Verifiers-style environment factory.
* ``list_environments`` / ``get_environment`` - the catalogue of packaged environments.
"""

from ._catalogue import GymEnvironment, get_environment, list_environments
from ._endpoint import Endpoint
from ._environment import NeMoGymEnv, load_environment
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
from ._harness import NeMoGymHarness
from ._proxy import PolicyCall, Route, RoutingProxy
from ._replay import ReplayUpstream
from ._result import RolloutResult
from ._stack import GymStack, StackConfig
from ._taskset import NeMoGymTaskset, Task

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
