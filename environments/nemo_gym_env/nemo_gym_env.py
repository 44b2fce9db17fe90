"""Every packaged NVIDIA NeMo Gym environment as a verifiers v1 environment (id ``nemo-gym-env``).

With ``verifiers`` installed this module exports, for ``vf-eval nemo-gym-env`` and prime-rl's env
server, one ``vf.Taskset`` (``GymTaskset``), one ``vf.Harness`` (``GymHarness``) and one ``vf.Env``
(``GymEnv``); verifiers is imported only when one of them is first used. Without verifiers it still
exports our own factory::

    from nemo_gym_env import load_environment
    env = load_environment(nemo_env="example_multi_step")
    results = env.run_sync(None, endpoint, concurrency=32)
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

from verifiers_nemo import NeMoGymEnv, load_environment

_VERIFIERS_CLASSES = ("GymTaskset", "GymHarness", "GymEnv")


def __getattr__(name: str) -> Any:
    if name in _VERIFIERS_CLASSES:
        value = getattr(importlib.import_module("verifiers_nemo._verifiers_v1"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'nemo_gym_env' has no attribute {name!r}")


__all__ = ["NeMoGymEnv", "load_environment"]
if importlib.util.find_spec("verifiers") is not None:
    __all__ += list(_VERIFIERS_CLASSES)
