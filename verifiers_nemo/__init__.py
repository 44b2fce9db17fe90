"""verifiers_nemo: run NVIDIA NeMo Gym environments inside Verifiers-style RL and eval stacks.

The public API is what this module exports; every other module is private.

* ``NeMoGymTaskset`` / ``Task`` - a Gym environment's JSONL tasks (packaged, or a folder of yours), or any JSONL file.
* ``NeMoGymHarness`` - runs tasks as rollouts through one shared real Gym stack per process.
* ``NeMoGymPool`` - the same over several stacks: a mix of environments, or Ray actors on many nodes.
* ``Endpoint`` - the OpenAI-compatible inference server (Responses or Chat Completions) of a rollout.
* ``Replicas`` - several endpoints serving one model, with health: a replica that does not connect leaves the
  rotation and its calls move to a live one; it is probed and rejoins.
* ``RolloutResult`` / ``PolicyCall`` / ``check_contiguity`` - what a rollout returns: reward, metrics,
  completion, the per-call trace with token IDs and logprobs, usage, timing, a typed error.
* ``training_samples`` / ``TrainingSamples`` / ``TrainingSample`` - a trace as the token sequences a trainer trains on
  (loss mask, logprobs), one when the rollout is contiguous (``Endpoint(exact_tokens=True)`` makes it so).
* ``SavedRun`` - a run folder of ``verifiers-nemo eval -s`` read back as ``RolloutResult`` objects.
* ``export_training_data`` / ``TrainingDataWriter`` / ``ExportReport`` / ``training_data_description`` /
  ``training_data_features`` - saved or live rollouts as training data (exact-token SFT samples, SFT conversations,
  preference pairs, rollout groups with GRPO advantages) in JSONL or Parquet, written in bounded memory; what a
  written file says it holds; a format's columns as ``datasets.Features``.
* ``load_environment`` / ``NeMoGymEnv`` - the environment factory (``environments/nemo_gym_env``).
* ``list_environments`` / ``get_environment`` / ``GymEnvironment`` - the catalogue: packaged environments and yours.
* Seams: ``RoutingProxy`` / ``ProxyConfig`` (``NeMoGymHarness(proxy=...)``), ``Upstream`` and
  ``FunctionUpstream`` (``rollout(..., upstream=...)``: a plain function answers), ``ReplayServer``
  (recorded rollouts served as a model: point an ``Endpoint`` at it).
* Exceptions: one tree under ``VerifiersNemoError`` (drawn in ``verifiers_nemo._exceptions``); the
  ``RolloutError`` leaves' ``type`` strings are the ``error.type`` of results.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._exceptions import (
    ConfigurationError,
    GymAgentError,
    GymEpisodeFailed,
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
    WorkerLost,
)

if TYPE_CHECKING:
    from ._endpoint import Endpoint
    from ._export.saved_run import SavedRun
    from ._export.schema import training_data_features
    from ._export.sinks import training_data_description
    from ._export.writer import ExportReport, TrainingDataWriter, export_training_data
    from ._factory import NeMoGymEnv, load_environment
    from ._gym import GymEnvironment, get_environment, list_environments
    from ._harness import NeMoGymHarness
    from ._replay import ReplayServer
    from ._replicas import Replicas
    from ._result import RolloutResult
    from ._routing import (
        PolicyCall,
        ProxyConfig,
        RoutingProxy,
        TrainingSample,
        TrainingSamples,
        check_contiguity,
        training_samples,
    )
    from ._scale import NeMoGymPool
    from ._tasks import NeMoGymTaskset, Task
    from ._upstreams import FunctionUpstream, Upstream

# Heavy modules (datasets, aiohttp, pydantic) load on first use, so `verifiers-nemo --help` stays fast.
_LAZY = {
    "Endpoint": "._endpoint",
    "ExportReport": "._export.writer",
    "FunctionUpstream": "._upstreams",
    "GymEnvironment": "._gym",
    "NeMoGymEnv": "._factory",
    "NeMoGymHarness": "._harness",
    "NeMoGymPool": "._scale",
    "NeMoGymTaskset": "._tasks",
    "PolicyCall": "._routing",
    "ProxyConfig": "._routing",
    "ReplayServer": "._replay",
    "Replicas": "._replicas",
    "RolloutResult": "._result",
    "RoutingProxy": "._routing",
    "SavedRun": "._export.saved_run",
    "Task": "._tasks",
    "Upstream": "._upstreams",
    "check_contiguity": "._routing",
    "training_samples": "._routing",
    "TrainingDataWriter": "._export.writer",
    "TrainingSample": "._routing",
    "TrainingSamples": "._routing",
    "export_training_data": "._export.writer",
    "training_data_description": "._export.sinks",
    "training_data_features": "._export.schema",
    "get_environment": "._gym",
    "list_environments": "._gym",
    "load_environment": "._factory",
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
    "ExportReport",
    "FunctionUpstream",
    "GymAgentError",
    "GymEnvironment",
    "GymRuntimeError",
    "GymEpisodeFailed",
    "GymServerDown",
    "InvalidResult",
    "MissingRequirementsError",
    "NeMoGymEnv",
    "NeMoGymHarness",
    "NeMoGymPool",
    "NeMoGymTaskset",
    "PolicyCall",
    "ProxyConfig",
    "ReplayServer",
    "Replicas",
    "RolloutError",
    "RolloutResult",
    "RolloutTimeout",
    "RoutingProxy",
    "SavedRun",
    "StackStartError",
    "Task",
    "TasksetError",
    "UnknownEnvironmentError",
    "Upstream",
    "UpstreamConnectionError",
    "UpstreamConversionError",
    "UpstreamError",
    "UpstreamHTTPError",
    "UpstreamInternalError",
    "UpstreamProtocolError",
    "UpstreamTimeout",
    "VerifiersNemoError",
    "WorkerLost",
    "check_contiguity",
    "training_samples",
    "TrainingDataWriter",
    "TrainingSample",
    "TrainingSamples",
    "export_training_data",
    "training_data_description",
    "training_data_features",
    "get_environment",
    "list_environments",
    "load_environment",
]
