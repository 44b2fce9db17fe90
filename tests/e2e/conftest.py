"""End-to-end fixtures: the real nemo-gym stack (real ng_run, servers, agents) on 127.0.0.1."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from verifiers_nemo._gym.runtime import gym_root as _gym_root

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="session")
def gym_root() -> Path:
    return _gym_root()


def env_config(root: Path, env: str) -> Path:
    return root / "resources_servers" / env / "configs" / f"{env}.yaml"


def wait_until(
    predicate: Callable[[], object], timeout: float, what: str = "condition", interval: float = 0.1
) -> object:
    """Poll ``predicate`` until it is truthy or ``timeout`` passes (then fail naming ``what`` and its last value)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout:g}s (last value {value!r})")
        time.sleep(interval)
