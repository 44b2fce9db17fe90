"""The replay policy through the real stack reproduces the rewards recorded in nemo-gym's own data."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo import (
    NeMoGymHarness,
    NeMoGymTaskset,
    ReplayServer,
    RolloutResult,
    get_environment,
    list_environments,
)
from verifiers_nemo._gym import gym_root
from verifiers_nemo._replay import unreproducible_reason

pytestmark = pytest.mark.e2e

NAMED = ["example_single_tool_call", "example_session_state_mgmt", "example_multi_step"]
OFFLINE = sorted(e.name for e in list_environments() if e.runs_offline_with_nemo_gym_only)
RUNNABLE = [name for name in OFFLINE if unreproducible_reason(name) is None]
BATCH = 9  # environments per stack: ~2 servers each, ~4 GB together
STACKS_AT_ONCE = 2
JUDGED = sorted(
    e.name
    for e in list_environments()
    if e.needs_judge
    and e.has_example_rollouts
    and not e.needs_external
    and not e.requirements
    and unreproducible_reason(e.name) is None
)
"""Judge environments whose recordings carry the judge's I/O: the replay answers their judge calls too."""
CANNOT_START_HERE = {
    # Environments with extra packages (and no external service) that do not start on this machine.
    "aviary": "downloads gsm8k from huggingface.co at start (this machine reaches package registries only)",
    "code_fim": "imports human_eval_infilling, which its requirements.txt does not list",
    "equivalence_llm_judge": "needs datasets==4.0.0, whose dill<0.3.9 conflicts with nemo-gym's dill>=0.4.1",
    "evalplus": "evalplus==0.3.1 needs a protobuf version nemo-gym's pins exclude (uv: unsatisfiable)",
    "longmt_eval": "a git+https requirement (this machine reaches package registries only)",
    "openenv": "a git+https requirement (this machine reaches package registries only)",
    "tales": "a git+https requirement (this machine reaches package registries only)",
}
PACKAGED = sorted(
    e.name
    for e in list_environments()
    if e.requirements and e.has_example_rollouts and not e.needs_external and unreproducible_reason(e.name) is None
)
"""Environments that need packages beyond nemo-gym, with recordings that are not known not to reproduce."""
WITH_PACKAGES = [
    name
    for name in PACKAGED
    if name not in CANNOT_START_HERE and name != "mcqa"  # test_requirements.py replays mcqa after its install
]
"""Environments that need packages beyond nemo-gym (installed for them into derived venvs), judge-scored
ones included: the replay answers their policy and judge calls."""


async def _replay_batch(
    envs: list[str], gym_python: str | None = None
) -> dict[tuple[str, int], tuple[RolloutResult, float]]:
    """Replay ``envs`` on one stack; each judge name (unique in the batch) gets its env's replayed judge.
    ``gym_python``: the Gym runtime (default: the suite's, nemo-gym 0.4)."""
    root = gym_root(gym_python) if gym_python else None
    tasks, replays, judges = [], {}, {}
    for env in envs:
        env_tasks = NeMoGymTaskset(env, recorded=True, root=root)
        replays[env] = ReplayServer.from_tasks(env_tasks).start()
        judges |= {name: replays[env].judge_endpoint(name) for name in get_environment(env, root).judge_models}
        tasks += env_tasks
    recorded = {(t.env, t.task_index): float(t.recorded_reward) for t in tasks}
    harness = NeMoGymHarness(
        f"replay-{envs[0]}",
        config_paths=[get_environment(e, root).default_config.path for e in envs],
        gym_python=gym_python,
        timeout=120,
        start_timeout=600,  # a first start installs extra packages
        judge=judges or None,
    )
    try:
        async with harness:
            results = [r async for r in harness.run(tasks, lambda t: replays[t.env].endpoint_for(t), concurrency=16)]
    finally:
        for replay in replays.values():
            replay.stop()
    return {(r.env, r.task_index): (r, recorded[(r.env, r.task_index)]) for r in results}


def _replay_all(
    batches: list[list[str]], gym_python: str | None = None
) -> dict[tuple[str, int], tuple[RolloutResult, float]]:
    """Every batch, ``STACKS_AT_ONCE`` stacks at a time (one stack's start waits on Gym's readiness polls
    while the other's servers import)."""

    async def run() -> dict[tuple[str, int], tuple[RolloutResult, float]]:
        gate = asyncio.Semaphore(STACKS_AT_ONCE)

        async def one(batch: list[str]) -> dict[tuple[str, int], tuple[RolloutResult, float]]:
            async with gate:
                return await _replay_batch(batch, gym_python)

        results: dict[tuple[str, int], tuple[RolloutResult, float]] = {}
        for part in await asyncio.gather(*(one(batch) for batch in batches)):
            results.update(part)
        return results

    return asyncio.run(run())


def _batches(envs: list[str], root: Path | None = None) -> list[list[str]]:
    """Batches of at most BATCH environments in which no two share a judge name (each is one judge port)."""
    batches: list[tuple[list[str], set[str]]] = []
    for env in envs:
        names = set(get_environment(env, root).judge_models)
        batch = next((b for b in batches if not b[1] & names and len(b[0]) < BATCH), None)
        if batch is None:
            batches.append(([env], names))
        else:
            batch[0].append(env)
            batch[1].update(names)
    return [b[0] for b in batches]


@pytest.fixture(scope="module")
def replayed() -> Iterator[dict[tuple[str, int], tuple[RolloutResult, float]]]:
    """Every replayable environment (offline, judged, with extra packages) on as few stacks as fit. Judged
    envs first: their judge names spread over the batches; packaged ones apart: their stacks install first."""
    yield _replay_all(_batches(JUDGED + RUNNABLE) + _batches(WITH_PACKAGES))


def test_every_exclusion_of_an_environment_with_packages_names_one_that_needs_them() -> None:
    """The lists of envs left out (cannot start here, do not reproduce) hold no stale or misplaced names,
    and what is left to replay is most of them."""
    from verifiers_nemo._replay import PACKAGES_UNREPRODUCIBLE

    assert set(CANNOT_START_HERE) <= set(PACKAGED)
    assert "mcqa" in PACKAGED
    with_packages = {e.name for e in list_environments() if e.requirements}
    assert {key.split("#")[0] for key in PACKAGES_UNREPRODUCIBLE} <= with_packages
    assert len(WITH_PACKAGES) >= 15


@pytest.mark.parametrize("env", WITH_PACKAGES)
def test_replay_with_extra_packages_installed_reproduces_every_recorded_reward(env: str, replayed: dict) -> None:
    _check_rows(env, replayed)


def test_the_three_named_environments_are_replayable() -> None:
    assert set(NAMED) <= set(RUNNABLE)


def test_exclusions_name_only_offline_environments() -> None:
    from verifiers_nemo._replay import KNOWN_UNREPRODUCIBLE

    assert {key.split("#")[0] for key in KNOWN_UNREPRODUCIBLE} <= set(OFFLINE)


@pytest.mark.parametrize("env", RUNNABLE)
def test_replay_reproduces_every_recorded_reward(env: str, replayed: dict) -> None:
    _check_rows(env, replayed)


def test_judge_environments_with_recorded_judge_io_are_replayable() -> None:
    assert {"aalcr", "abstention", "frontierscience_judge", "inverse_if", "xstest"} <= set(JUDGED)


@pytest.mark.parametrize("env", JUDGED)
def test_replay_with_the_judge_replayed_reproduces_every_recorded_reward(env: str, replayed: dict) -> None:
    _check_rows(env, replayed)


def _check_rows(env: str, replayed: dict, gym_version: str | None = None) -> None:
    rows = sorted((index, pair) for (name, index), pair in replayed.items() if name == env)
    assert rows, f"no recorded rollouts replayed for {env}"
    checked = 0
    for index, (result, recorded) in rows:
        if unreproducible_reason(env, index, gym_version):
            continue
        assert result.error is None, f"{env} row {index}: {result.error.type}: {result.error.message}"
        assert math.isclose(result.reward, recorded), f"{env} row {index}: {result.reward} != {recorded}"
        assert result.trace and result.completion
        checked += 1
    assert checked >= 3  # simpleqa: 2 of its 5 recordings are known not to reproduce
