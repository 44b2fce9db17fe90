"""Run by the verifiers venv: load every packaged environment's tasks (example and recorded data) the way
prime-rl's orchestrator and vf-eval do (``vf.resolve_env_config`` + ``vf.load_taskset``); print one JSON line."""

from __future__ import annotations

import json
import sys

import verifiers.v1 as vf

from verifiers_nemo import VerifiersNemoError, list_environments
from verifiers_nemo._gym import gym_root

loaded, refused, crashed = [], [], []
for env in list_environments(gym_root()):
    for recorded in (False, True) if env.has_example_rollouts else (False,):
        config = vf.resolve_env_config({"taskset": {"id": "nemo-gym-env", "nemo_env": env.name, "recorded": recorded}})
        try:
            tasks = vf.load_taskset(config.taskset).load()
        except VerifiersNemoError as exc:
            refused.append([env.name, recorded, type(exc).__name__, str(exc)])
        except Exception as exc:  # what the test is for: nothing may end up here
            crashed.append([env.name, recorded, type(exc).__name__, str(exc)[:2000]])
        else:
            loaded.append([env.name, recorded, len(tasks)])
json.dump({"loaded": loaded, "refused": refused, "crashed": crashed}, sys.stdout)
