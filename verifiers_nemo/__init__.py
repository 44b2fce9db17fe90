"""verifiers_nemo: run NVIDIA NeMo Gym environments inside Verifiers-style RL and eval stacks."""

from ._endpoint import Endpoint
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

__all__ = [
    "ConfigurationError",
    "Endpoint",
    "GymAgentError",
    "GymRuntimeError",
    "GymServerDown",
    "InvalidResult",
    "MissingRequirementsError",
    "RolloutError",
    "RolloutTimeout",
    "RouteClosed",
    "StackStartError",
    "TasksetError",
    "UnknownEnvironmentError",
    "UpstreamError",
    "VerifiersNemoError",
]
