"""Fault-injection suite fixtures: one shared Gym stack (example_session_state_mgmt) behind a routing
proxy whose per-call bound is known, with a canary API key planted in this process's environment."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio

from tests.faults.helpers import (
    BACKOFF,
    BACKOFF_MAX,
    CANARY,
    CANARY_ENV_VAR,
    COUNTER_ENV,
    FIGURES,
    MAX_RETRIES,
    ROLLOUT_TIMEOUT,
    UPSTREAM_TIMEOUT,
    format_figures,
)
from verifiers_nemo import NeMoGymHarness, RoutingProxy


@pytest.fixture(scope="session")
def gym_root() -> Path:
    from verifiers_nemo._gym.runtime import gym_root as _gym_root

    return _gym_root()


@pytest_asyncio.fixture(scope="package", loop_scope="package")
async def harness() -> AsyncIterator[NeMoGymHarness]:
    """The suite's one stack, started with the canary in the environment (as a trainer's own key
    would be) and with its own RoutingProxy (``proxy=``), so that its bounds hold whatever ran before
    in this process."""
    proxy = RoutingProxy(
        upstream_timeout=UPSTREAM_TIMEOUT, max_retries=MAX_RETRIES, backoff=BACKOFF, backoff_max=BACKOFF_MAX
    ).start()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(CANARY_ENV_VAR, CANARY)
        h = NeMoGymHarness(COUNTER_ENV, timeout=ROLLOUT_TIMEOUT, proxy=proxy)
        try:
            await h.astart()
            yield h
        finally:
            await h.aclose()
            proxy.stop()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not FIGURES:
        return
    terminalreporter.section("fault-injection figures")
    for test, figures in FIGURES:
        terminalreporter.write_line(f"{test}: {format_figures(figures)}")
