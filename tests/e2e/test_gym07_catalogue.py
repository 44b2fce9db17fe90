"""nemo-gym 0.7 as its users name it: its environments and benchmarks, Gym's prompts, repeats and metrics.

The runtime is `.venv-gym07` (TEST-ONLY build on Python 3.13.0: see `tests/e2e/test_gym07.py`). What Gym itself says
is asked of Gym, in its own interpreter: its catalogue (`nemo_gym.registry.discover_environment_catalog`), its prompt
templates, and its aggregation of the same rollouts (`nemo_gym.reward_profile.compute_aggregate_metrics` with the
resources server's own `compute_metrics` / `get_key_metrics`).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.policies import PolicyServer, message, user_text
from tests.e2e.test_gym07 import GYM07_PYTHON, _root, gym07_runtime
from verifiers_nemo import ConfigurationError, NeMoGymHarness, NeMoGymTaskset, ReplayServer, get_environment
from verifiers_nemo._gym import cache_dir

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
CLI = ROOT / ".venv" / "bin" / "verifiers-nemo"

GYM_CATALOGUE = """
import json
from nemo_gym.registry import discover_environment_catalog
print(json.dumps([[e.name, e.kind] for e in discover_environment_catalog()]))
"""


@pytest.fixture(scope="module")
def gym07() -> str:
    return gym07_runtime()


def _cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 900) -> Any:
    environ = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": str(GYM07_PYTHON), **(env or {})}
    return subprocess.run([str(CLI), *args], capture_output=True, text=True, cwd=cwd, env=environ, timeout=timeout)


async def _acli(*args: str, cwd: Path | None = None, timeout: float = 900) -> tuple[int, str, str]:
    """The CLI in a child process while this event loop serves the test's policy."""
    environ = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": str(GYM07_PYTHON)}
    process = await asyncio.create_subprocess_exec(
        str(CLI), *args, cwd=cwd, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode or 0, out.decode(), err.decode()


def test_envs_lists_every_environment_and_benchmark_gym_lists_with_its_kind(gym07: str, tmp_path: Path) -> None:
    gym_says = json.loads(
        subprocess.run(
            [gym07, "-c", GYM_CATALOGUE], capture_output=True, text=True, check=True, cwd=tmp_path
        ).stdout.splitlines()[-1]
    )
    expected = {(name, kind) for name, kind in gym_says if not name.startswith("resources_servers/")}

    listed = _cli("envs", "--json", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    ours = {(r["name"], r["kind"]) for r in rows if r["kind"] != "resources server"}
    flavors = {(name, kind) for name, kind in ours if kind == "environment" and "/" in name}

    assert ours - flavors == expected  # Gym's names, Gym's kinds: each one of them, nothing else
    assert {"aviary_bbh/config_bundled", "aviary_bbh/config_remote"} <= {name for name, _ in flavors}
    by_name = {(r["name"], r["kind"]): r for r in rows}
    aime = by_name[("aime25", "benchmark")]
    assert aime["num_repeats"] == 32 and aime["prompt_config"] == "benchmarks/prompts/generic/math.yaml"
    assert not aime["ready"] and "verifiers-nemo prepare aime25" in aime["ready_cell"]  # its data is not shipped
    # a resources server whose short name an environment claims is listed by the name that runs it
    assert ("blackjack", "environment") in by_name and ("resources_servers/blackjack", "resources server") in by_name
    assert sum(r["kind"] == "resources server" for r in rows) == 145
    user_sim = by_name[("nemo_user_sim", "environment")]  # a typed environment server of two agents: not driven here
    assert not user_sim["ready"] and "runs no one agent's rollouts" in user_sim["cannot_start"]
    assert user_sim["environment_server"] == "nemo_user_sim"
    assert by_name[("arc_agi", "environment")]["environment_server"] == "legacy_agent"  # Gym's relay to its agent
    environments = [r for r in rows if r["kind"] == "environment"]
    assert {r["environment_server"] for r in environments} == {"legacy_agent", "nemo_user_sim"}  # as the docs say

    table = _cli("envs", "--kind", "benchmark", cwd=tmp_path)
    assert table.returncode == 0, table.stderr
    lines = [line for line in table.stdout.splitlines()[1:] if line.strip() and not line.startswith(" ")]
    kinds = {line.split()[1] for line in lines[: lines.index(next(x for x in lines if x.startswith("nemo-gym")))]}
    assert kinds == {"benchmark"}
    assert "of 380 (51 environments, 184 benchmarks, 145 resources servers)" in table.stdout


def test_names_resolve_as_gym_s_combined_catalogue_resolves_them(gym07: str) -> None:
    root = _root(gym07)

    assert get_environment("blackjack", root).kind == "environment"
    explicit = get_environment("resources_servers/blackjack", root)
    assert explicit.kind == "resources server" and explicit.ref == "resources_servers/blackjack"
    assert get_environment("benchmarks/aime25", root).benchmark.num_repeats == 32  # type: ignore[union-attr]
    assert get_environment("example_multi_step", root).kind == "resources server"  # unclaimed: as on 0.4
    renamed = get_environment("reasoning_gym_hermes", root)  # Gym's deprecated alias
    assert renamed.name == "hermes_reasoning_gym" and renamed.alias_of == "hermes_reasoning_gym"
    nested = get_environment("nemotron_3.5_super/benchmark_configs/hle_no_tools", root)
    assert nested.kind == "benchmark"


def test_environments_replay_their_recordings_by_name_on_the_cli_and_in_python(gym07: str, tmp_path: Path) -> None:
    """Gym 0.7's `environments/NAME` run by the name Gym gives them: the CLI's replay reproduces every recorded
    reward of three of them (in one run, with each one's own Gym metrics), and Python's harness does for one named
    explicitly."""
    done = _cli("eval", "arc_agi,circle_count,circle_click", "-n", "3", cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "9/9 rewards equal the recorded ones" in done.stdout, done.stdout[-2000:]
    gym_lines = done.stdout.split("Gym metrics", 1)[-1].split("Errors", 1)[0]  # a mix: each env's stack asked
    for env in ("arc_agi", "circle_count", "circle_click"):
        assert f"{env} (" in gym_lines, done.stdout[-3000:]
    assert "not available" not in gym_lines, gym_lines

    tasks = NeMoGymTaskset("environments/circle_count", recorded=True, gym_python=gym07, limit=3)
    assert tasks.env is not None and tasks.env.kind == "environment"

    async def replay() -> list:
        with ReplayServer.from_tasks(tasks) as server:
            async with NeMoGymHarness(taskset=tasks) as harness:
                return [r async for r in harness.run(tasks, server.endpoint_for, concurrency=3)]

    results = sorted(asyncio.run(replay()), key=lambda r: r.task_index)
    assert [r.error for r in results] == [None] * 3
    assert [r.reward for r in results] == [t.recorded_reward for t in tasks]


def test_an_environment_of_your_own_in_gym_0_7_s_layout_runs_by_path_and_by_name(gym07: str, tmp_path: Path) -> None:
    """An `environments/NAME/` folder of an author's root (as `gym env init` lays it out: config.yaml composing a
    resources server, an agent and an environment server, with its data) runs by path and under --gym-root; a
    benchmark of the same name makes the short name ambiguous, and both explicit forms work."""
    packaged = _root(gym07) / "environments" / "circle_count"
    mine = tmp_path / "project" / "environments" / "my_count"
    shutil.copytree(packaged / "data", mine / "data")
    config = (packaged / "config.yaml").read_text().replace("environments/circle_count/", "environments/my_count/")
    (mine / "config.yaml").write_text(config)

    project = str(tmp_path / "project")
    alone = _cli("envs", "my_count", "--json", "--gym-root", project, cwd=tmp_path)
    assert [(r["name"], r["kind"]) for r in json.loads(alone.stdout)] == [("my_count", "environment")]  # by name

    by_path = _cli("eval", str(mine), "-n", "2", cwd=tmp_path)
    assert by_path.returncode == 0, by_path.stdout[-2000:] + by_path.stderr[-2000:]
    assert "2/2 rewards equal the recorded ones" in by_path.stdout

    benchmark = tmp_path / "project" / "benchmarks" / "my_count"
    benchmark.mkdir(parents=True)
    (benchmark / "config.yaml").write_text(_benchmark_config_of(config))
    listed = _cli("envs", "my_count", "--json", "--gym-root", project, cwd=tmp_path)
    assert {r["kind"] for r in json.loads(listed.stdout) if r["name"] == "my_count"} == {"environment", "benchmark"}
    ambiguous = _cli("eval", "my_count", "-n", "2", "--gym-root", project, cwd=tmp_path)
    assert ambiguous.returncode != 0
    assert "environments/my_count or benchmarks/my_count" in ambiguous.stderr
    explicit = _cli("eval", "environments/my_count", "-n", "2", "--gym-root", project, cwd=tmp_path)
    assert explicit.returncode == 0 and "2/2 rewards equal the recorded ones" in explicit.stdout


def _benchmark_config_of(environment_config: str) -> str:
    """The environment's config with its example dataset turned into the one dataset of type benchmark."""
    doc = yaml.safe_load(environment_config)
    for value in doc.values():
        for kind, inner in value.items():
            if kind != "responses_api_agents":
                continue
            for body in inner.values():
                body["datasets"] = [
                    {"name": "my_count", "type": "benchmark", "jsonl_fpath": "environments/my_count/data/example.jsonl"}
                ]
    return yaml.safe_dump(doc)


async def _math_policy(body: dict[str, Any], _request: Any) -> list[dict[str, Any]]:
    """Answers `a+b` right, except every third call (what a real model's spread looks like to pass@k/majority@k)."""
    _math_policy.calls = getattr(_math_policy, "calls", 0) + 1  # type: ignore[attr-defined]
    a, b = (int(x) for x in re.findall(r"(\d+)\+(\d+)", user_text(body))[0])
    answer = a + b if _math_policy.calls % 3 else a + b + 1  # type: ignore[attr-defined]
    return [message(f"So the answer is \\boxed{{{answer}}}.")]


def test_a_benchmark_runs_on_a_prepared_file_with_gym_s_prompt_repeats_and_metrics(gym07: str, tmp_path: Path) -> None:
    """aime25 on a prepared file of raw rows: each row prompted with the benchmark's own template, 32 rollouts a row
    (its num_repeats) unless -r says otherwise, and the environment's key metrics (pass@k, pass@1[avg-of-k],
    majority@k) in the summary and metadata.json equal to Gym's own aggregation of the same rollouts."""
    raw = tmp_path / "aime_prepared.jsonl"
    rows = [{"question": f"What is {a}+{b}?", "expected_answer": str(a + b)} for a, b in ((1, 1), (2, 3), (20, 22))]
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))

    async def run() -> tuple[tuple[int, str, str], tuple[int, str, str]]:
        async with PolicyServer(_math_policy) as policy:
            common = ("-b", policy.base_url, "-m", "scripted", "-a", json.dumps({"jsonl_path": str(raw)}), "-s")
            default = await _acli("eval", "aime25", *common, "--save-trace", "-o", str(tmp_path / "runs"), cwd=tmp_path)
            fewer = await _acli("eval", "aime25", *common, "-r", "2", "-o", str(tmp_path / "few"), cwd=tmp_path)
            return default, fewer

    (code, out, err), (few_code, few_out, few_err) = asyncio.run(run())
    assert code == 0, out[-2000:] + err[-2000:]
    run_dir = next((tmp_path / "runs").rglob("metadata.json")).parent
    metadata = json.loads((run_dir / "metadata.json").read_text())
    results = [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines()]
    assert metadata["settings"]["rollouts_per_example"] == 32 and len(results) == 3 * 32
    indices = sorted((r["task_index"], r["rollout_index"]) for r in results)
    assert indices == [(t, i) for t in range(3) for i in range(32)]

    template = yaml.safe_load((_root(gym07) / "benchmarks/prompts/generic/math.yaml").read_text())
    for record in results:
        sent = record["trace"][0]["request"]["input"]
        wanted = template["user"].format(**rows[record["task_index"]])
        assert [m["content"] for m in sent if m.get("role") == "user"] == [wanted]

    ours = metadata["summary"]["gym_metrics"]["aime25"]["aime25_math_with_judge_simple_agent"]
    gyms = _gym_s_own_aggregation(results)
    assert ours["key_metrics"] == gyms["key_metrics"] and ours["agent_metrics"] == gyms["agent_metrics"]
    assert {"pass@32/symbolic_accuracy", "pass@1[avg-of-32]/symbolic_accuracy", "majority@32/symbolic_accuracy"} <= set(
        ours["key_metrics"]
    )
    assert "Gym metrics" in out and "majority@32/symbolic_accuracy" in out

    assert few_code == 0, few_out[-2000:] + few_err[-2000:]
    few = json.loads(next((tmp_path / "few").rglob("metadata.json")).read_text())
    assert few["settings"]["rollouts_per_example"] == 2 and few["counts"]["done"] == 6
    assert (
        "pass@2/symbolic_accuracy"
        in few["summary"]["gym_metrics"]["aime25"]["aime25_math_with_judge_simple_agent"]["key_metrics"]
    )

    few_dir = next((tmp_path / "few").rglob("metadata.json")).parent
    compared = _cli("report", str(run_dir), str(few_dir), "-o", str(tmp_path / "compared.html"), cwd=tmp_path)
    assert compared.returncode == 0, compared.stderr[-2000:]
    page = (tmp_path / "compared.html").read_text()
    for name, value in ours["key_metrics"].items():  # each run's card: Gym's own numbers, named alike
        assert json.dumps({f"Gym {name}": round(value, 4)}, separators=(",", ":"))[1:-1] in page, name
    assert '"Gym pass@2/symbolic_accuracy"' in page


GYM_AGGREGATION = """
import json, sys
sys.path.insert(0, ".")
from app import LibraryJudgeMathResourcesServer
from nemo_gym.reward_profile import compute_aggregate_metrics

server = object.__new__(LibraryJudgeMathResourcesServer)  # its metric methods read no state
verify_responses = json.load(sys.stdin)
out = compute_aggregate_metrics(
    verify_responses,
    compute_metrics_fn=server.compute_metrics,
    get_key_metrics_fn=server.get_key_metrics,
    compute_repeat_metrics_fn=server.compute_repeat_metrics,
)
print(json.dumps(out.model_dump()))
"""


def _gym_s_own_aggregation(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Gym's aggregation of the saved rollouts (Gym's own record of each, `gym_result`, stripped as Gym strips it),
    run in the interpreter math_with_judge's server ran in (the runtime, with its extra packages)."""
    verify = []
    for record in results:
        gym = record["gym_result"]
        entry = {k: v for k, v in gym.items() if k not in ("response", "responses_create_params")}
        if (gym.get("response") or {}).get("usage") is not None:
            entry["response"] = {"usage": gym["response"]["usage"]}
        entry["_ng_task_index"], entry["_ng_rollout_index"] = record["task_index"], record["rollout_index"]
        verify.append(entry)
    server_dir = _root(str(GYM07_PYTHON)) / "resources_servers" / "math_with_judge"
    runtime_site = str(GYM07_PYTHON.parents[1] / "lib" / "python3.13" / "site-packages")
    python = next(  # this runtime's: the cache may hold others' (the offline tests build one for a copied runtime)
        p / "bin" / "python"
        for p in (cache_dir() / "derived-envs").iterdir()
        if list(p.glob("lib/python3.13/site-packages/math_verify"))
        and f"'{runtime_site}'" in "".join(f.read_text() for f in p.glob("lib/python3.13/site-packages/*.pth"))
    )
    done = subprocess.run(
        [str(python), "-c", GYM_AGGREGATION], input=json.dumps(verify), capture_output=True, text=True, cwd=server_dir
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_a_benchmark_without_its_data_ends_at_once_naming_how_to_prepare_it(gym07: str, tmp_path: Path) -> None:
    done = _cli("eval", "aime25", "-b", "http://127.0.0.1:9/v1", "-m", "m", cwd=tmp_path, timeout=300)
    assert done.returncode != 0
    errors = [line for line in done.stderr.splitlines() if "error" in line]
    assert len(errors) == 1, done.stderr
    assert "benchmark 'aime25' is not prepared" in errors[0]
    assert "verifiers-nemo prepare aime25" in errors[0] and '"jsonl_path"' in errors[0]
    with pytest.raises(ConfigurationError, match="is not prepared"):
        NeMoGymTaskset("aime25", gym_python=gym07)
