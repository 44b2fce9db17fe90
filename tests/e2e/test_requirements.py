"""An environment whose Gym server needs packages beyond nemo-gym starts without the user installing
anything: its requirements go into an environment derived from the Gym runtime, once, its server starts warm
(forked, as every other Gym process) in that environment, and its recorded rollouts replay through the real
stack."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from verifiers_nemo import NeMoGymHarness, NeMoGymTaskset, ReplayServer
from verifiers_nemo._gym import find_gym_runtime
from verifiers_nemo._gym.derived_env import derived_env
from verifiers_nemo._stack.requirements import missing_requirements

pytestmark = pytest.mark.e2e

ENV = "mcqa"  # its server needs tiktoken (small, with wheels), which nemo-gym does not bring


def test_env_with_extra_requirements_installs_them_once_and_replays_its_recordings(gym_root: Path) -> None:
    runtime = find_gym_runtime()
    requirements = ("tiktoken",)
    assert missing_requirements({ENV: requirements}, runtime), "the runtime has tiktoken: pick another env"
    tasks = NeMoGymTaskset(ENV, recorded=True, limit=2)
    replay = ReplayServer.from_tasks(tasks).start()
    harness = NeMoGymHarness(ENV, timeout=120)

    async def run() -> tuple[list, dict[Path, tuple[str, int]]]:
        async with harness:
            results = [r async for r in harness.run(tasks, replay.endpoint_for, concurrency=2)]
            return results, _virtual_envs(harness.stack.info().pids), harness.stack.launch.supervisor.pid

    try:
        harness.check()  # no longer refused before anything starts
        results, venvs, supervisor = asyncio.run(run())
    finally:
        replay.stop()

    for result, task in zip(sorted(results, key=lambda r: r.task_index), tasks, strict=True):
        assert result.error is None, result.error
        assert math.isclose(result.reward, task.recorded_reward)
    env = derived_env(runtime, requirements, base=gym_root / "resources_servers" / ENV)
    assert env.ready
    assert venvs[gym_root / "resources_servers" / ENV] == (str(env.path), supervisor)  # in it, forked warm
    assert venvs[gym_root / "responses_api_agents" / "simple_agent"] == (str(runtime.prefix), supervisor)
    assert missing_requirements({ENV: requirements}, runtime), "the shared runtime was altered"


def _virtual_envs(pids: tuple[int, ...]) -> dict[Path, tuple[str, int]]:
    """The venv (``VIRTUAL_ENV``) each Gym server process of ``pids`` runs in, and its parent's pid, by its
    folder (a server's launcher stands in its folder too: the server is the one that is not a launcher)."""
    venvs = {}
    for pid in pids:
        try:
            cwd = Path(f"/proc/{pid}/cwd").resolve()
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            stat = Path(f"/proc/{pid}/stat").read_text()
            launcher = "warm-launchers" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parent = int(stat[stat.rfind(")") + 2 :].split()[1])
        for item in environ:
            if item.startswith(b"VIRTUAL_ENV=") and not launcher:
                venvs[cwd] = (item.split(b"=", 1)[1].decode(), parent)
    return venvs


def test_prepare_installs_an_environments_packages_ahead_of_its_first_run(tmp_path: Path) -> None:
    """`verifiers-nemo prepare ENV` builds the derived environment its first start would build; a second
    call finds it; one that cannot be installed fails with uv's reason and the rest are still prepared."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "VERIFIERS_NEMO_CACHE_DIR": str(tmp_path / "cache")}
    command = [sys.executable, "-m", "verifiers_nemo._cli.main", "prepare"]
    first = subprocess.run([*command, ENV], env=env, capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    assert f"{ENV}: ready (extra packages in 1 server environment" in first.stderr
    assert len(list((tmp_path / "cache").glob("derived-envs/*/.verifiers-nemo-complete"))) == 1

    again = subprocess.run([*command, "evalplus", ENV], env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 1
    assert "evalplus: cannot be prepared" in again.stderr and "unsatisfiable" in again.stderr
    assert f"{ENV}: ready" in again.stderr
