"""The real `verifiers` loads `nemo-gym-env` as a v1 environment and runs it on the real Gym stack.

Everything here runs in `.venv-vf` (verifiers 0.4.0, openai >= 2.54, no nemo-gym: the user's own venv);
the Gym runtime is `.venv`'s interpreter, named by VERIFIERS_NEMO_GYM_PYTHON. The policy is a local
server on 127.0.0.1 (the replay server, or a scripted policy speaking both APIs).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.e2e.policies import DualApiPolicy
from tests.e2e.train_engines import TrainEngines, train_client, vf_eval_config
from tests.realmodel.server import NotBuilt, find_build
from verifiers_nemo import NeMoGymTaskset

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
VF_PYTHON = ROOT / ".venv-vf" / "bin" / "python"
RUN_LIMIT_S = 300  # a cold stack start, vf-eval's 7-10 s import and a busy machine fit well inside
VF_PRE_PYTHON = ROOT / ".venv-vfpre" / "bin" / "python"
"""The newest verifiers and renderers pre-releases (pinned in .ci/setup-tests): the cheapest representative tests
of verifiers' side run in both venvs (``verifiers_python``)."""
VERIFIERS_RELEASES = {"verifiers-0.4.0": VF_PYTHON, "verifiers-pre": VF_PRE_PYTHON}


def verifiers_python(release: str) -> Path:
    """The interpreter of a ``VERIFIERS_RELEASES`` venv (the test fails, naming the set-up, where it is missing)."""
    python = VERIFIERS_RELEASES[release]
    if not python.exists():
        pytest.fail(f"{python} is missing: `bash .ci/setup-tests` builds the verifiers venvs these tests run in")
    return python


def setup_pins() -> list[str]:
    """The pre-release pins .ci/setup-tests installs into .venv-vfpre (``VF_PRE=(...)``)."""
    import re
    import shlex

    (line,) = re.findall(r"^VF_PRE=\((.*?)\)", (ROOT / ".ci" / "setup-tests").read_text(), re.MULTILINE)
    return shlex.split(line)


@pytest.fixture(scope="module")
def vf_python() -> Path:
    if not VF_PYTHON.exists():
        pytest.fail(f"{VF_PYTHON} is missing: `bash .ci/setup-tests` builds the verifiers venv these tests run in")
    return VF_PYTHON


@pytest.fixture(scope="module")
def engines(vf_python: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainEngines]:
    """Scripted engines for verifiers' training client (tests/e2e/train_engines.py), with the test model's real
    tokenizer (the real-model tier's build: `.ci/setup-tests` makes it)."""
    try:
        tokenizer = find_build().model
    except NotBuilt as exc:
        pytest.fail(str(exc), pytrace=False)
    engines = TrainEngines(vf_python, tokenizer, tmp_path_factory.mktemp("train-engines"))
    yield engines
    engines.stop()


def _train_config(tmp_path: Path, engines: TrainEngines, script: str) -> list[str]:
    """vf-eval's arguments for the training client (prime-rl's) sampling from scripted engine ``script``."""
    client = train_client(engines.base_url(f"script/{script}"), find_build().model)
    return ["@", str(vf_eval_config(tmp_path / f"{script}.toml", client, {"max_tokens": 120}))]


def _environ(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        VERIFIERS_NEMO_GYM_PYTHON=sys.executable,  # .venv's: the Gym runtime lives apart from verifiers
        POLICY_KEY="sk-policy-test",
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    env.update(extra or {})
    return env


async def _run(
    argv: list[str], tmp_path: Path, extra_env: dict[str, str] | None = None, limit: float = RUN_LIMIT_S
) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=tmp_path,
        env=_environ(extra_env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), limit)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        pytest.fail(f"{argv[:3]} did not finish within {limit:g}s")
    return proc.returncode or 0, out.decode(errors="replace")


async def vf_eval(
    vf_python: Path, tmp_path: Path, base_url: str, *args: str, extra_env: dict[str, str] | None = None
) -> tuple[int, str, list[dict]]:
    """Run `vf-eval nemo-gym-env` as a user would; return its exit code, output and episodes."""
    out_dir = tmp_path / "vf-out"
    argv = [
        str(vf_python.parent / "vf-eval"),
        "nemo-gym-env",
        "--no-push",
        "-m",
        "m",
        "--client.base-url",
        base_url,
        "--client.api-key-var",
        "POLICY_KEY",
        "-o",
        str(out_dir),
        *args,
    ]
    code, output = await _run(argv, tmp_path, extra_env)
    episodes = [json.loads(line) for path in out_dir.glob("*/traces.jsonl") for line in path.open()]
    return code, output, episodes


async def our_eval(python: Path, tmp_path: Path, base_url: str, api: str, out: Path, *args: str) -> tuple[int, str]:
    """Run our own `verifiers-nemo eval example_multi_step` from ``python``'s venv against ``base_url``."""
    argv = [str(python.parent / "verifiers-nemo"), "eval", "example_multi_step", "-b", base_url, "-m", "m"]
    argv += ["-k", "POLICY_KEY", "--api", api, "-o", str(out), *args]
    return await _run(argv, tmp_path)


@contextlib.asynccontextmanager
async def replay_server(
    vf_python: Path, nemo_env: str, tmp_path: Path, extra_env: dict[str, str] | None = None
) -> AsyncIterator[str]:
    """`verifiers-nemo replay-server ENV` from the verifiers venv, as a user starts it; yields its base URL."""
    port_file = tmp_path / f"replay-{nemo_env.replace('/', '--')}.url"
    server = await asyncio.create_subprocess_exec(
        str(vf_python.parent / "verifiers-nemo"),
        "replay-server",
        nemo_env,
        "--port-file",
        str(port_file),
        env=_environ(extra_env),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        deadline = asyncio.get_running_loop().time() + 120
        while not port_file.exists():
            assert server.returncode is None, "replay-server exited"
            assert asyncio.get_running_loop().time() < deadline, "replay-server printed no URL within 120 s"
            await asyncio.sleep(0.1)
        yield port_file.read_text()
    finally:
        server.terminate()
        assert await asyncio.wait_for(server.wait(), 30) == 0


def _results(out: Path) -> list[dict]:
    return [json.loads(line) for path in out.rglob("results.jsonl") for line in path.open()]


def _traces(episodes: list[dict]) -> list[dict]:
    return [trace for episode in episodes for trace in episode["traces"]]


def _reward(trace: dict) -> float | None:
    reward = (trace.get("rewards") or {}).get("nemo_gym")
    return reward["score"] if isinstance(reward, dict) else reward


# -- replay through verifiers ------------------------------------------------------------------------


async def test_vf_eval_replay_on_ray_actors_reproduces_recorded_rewards(vf_python: Path, tmp_path: Path) -> None:
    """`verifiers-nemo replay-server ENV` (from the verifiers venv) is the model; vf-eval runs the
    recorded rows (multi-step tool use, each row named to the server in a header that verifiers'
    interception forwards) on a Gym stack owned by a Ray actor (a cluster started for the run, with the
    verifiers venv's own Ray); every recorded reward comes back."""
    nemo_env = "example_multi_step"
    recorded = list(NeMoGymTaskset(nemo_env, recorded=True))
    async with replay_server(vf_python, nemo_env, tmp_path) as base_url:
        code, output, episodes = await vf_eval(
            vf_python,
            tmp_path,
            base_url,
            "--env.taskset.nemo-env",
            nemo_env,
            "--env.taskset.recorded",
            "true",
            "--env.agent.harness.ray",
            "local",
            "--env.agent.harness.ray-workers",
            "1",
            "-c",
            "8",
        )
    assert code == 0, output[-3000:]
    traces = _traces(episodes)
    assert len(traces) == len(recorded)
    by_row = {t["task"]["data"]["recorded_row"]: t for t in traces}
    for row, task in enumerate(recorded):
        trace = by_row[row]
        assert trace["ok"], trace["errors"]
        assert _reward(trace) == pytest.approx(float(task.recorded_reward)), f"row {row}"
        assert trace["calls"], "verifiers' interception recorded no model call"
    workers = {trace["info"]["nemo_gym"]["worker"] for trace in traces}
    assert len(workers) == 1 and next(iter(workers)).startswith("ray:"), workers  # one Ray actor ran them all


# -- a judge-scored environment through verifiers ------------------------------------------------------


async def test_vf_eval_sends_judge_calls_to_the_configured_judge_with_its_own_key(
    vf_python: Path, tmp_path: Path, engines: TrainEngines
) -> None:
    """simpleqa in vf-eval under verifiers' training client (prime-rl's): the policy (scripted, through verifiers'
    interception and its renderer) always answers Paris; its judge (Chat Completions) is the one named with
    --env.agent.harness.judge-*, with the judge's key, and no judge call is a turn of the rollout's graph."""
    from tests.e2e.test_judges import ChatJudge

    async with ChatJudge() as judge:
        code, output, episodes = await vf_eval(
            vf_python,
            tmp_path,
            engines.base_url("script/paris"),
            "--env.taskset.nemo-env",
            "simpleqa",
            "--env.agent.harness.judge-base-url",
            judge.base_url,
            "--env.agent.harness.judge-model",
            "jud",
            "--env.agent.harness.judge-api-key-var",
            "JUDGE_KEY",
            "-n",
            "5",
            "-r",
            "1",
            *_train_config(tmp_path, engines, "paris"),
            extra_env={"JUDGE_KEY": "sk-judge-test"},
        )
    assert code == 0, output[-3000:]
    traces = _traces(episodes)
    assert len(traces) == 5 and all(t["ok"] for t in traces), [t.get("errors") for t in traces]
    assert sorted(_reward(t) for t in traces) == [0.0, 0.0, 0.0, 0.0, 1.0]  # only "capital of France" is Paris
    assert judge.calls == 5 and judge.authorizations == {"Bearer sk-judge-test"} and judge.models == {"jud"}
    seen = engines.seen()
    assert seen["calls"]["script/paris"] == 5 and "Bearer sk-judge-test" not in seen["authorizations"]["script/paris"]
    for trace in traces:  # one policy turn each, one branch: the judge's calls are not in the graph
        assert [n["message"]["role"] for n in trace["nodes"]] == ["user", "assistant"], trace["nodes"]
        assert trace["nodes"][-1]["sampled"] and trace["nodes"][-1]["message"]["content"] == "Paris"


# -- the same tasks through verifiers and through our own CLI (for chat, where the newest openai is installed) --

LATEST_PYTHON = ROOT / ".venv-latest" / "bin" / "python"


def _latest_python() -> Path:
    if not LATEST_PYTHON.exists():
        pytest.fail(f"{LATEST_PYTHON} is missing: `bash .ci/setup-tests` builds the newest-dependencies venv")
    return LATEST_PYTHON


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_vf_eval_matches_our_cli_and_records_every_call(vf_python: Path, tmp_path: Path, api: str) -> None:
    """The same tasks through vf-eval and through our CLI give the same rewards and metrics per task. Our CLI runs
    from the suite's venv for the Responses API and, for Chat Completions, from `.venv-latest`, next to the newest
    openai (3.x): its chat conversion and the Gym-schema check of every reply under the newest openai types (the
    passthrough path shares that check; vf-eval runs it with verifiers' openai)."""
    ours_python = Path(sys.executable) if api == "responses" else _latest_python()
    if api == "chat":
        probe = await _run([str(ours_python), "-c", "import openai; print(openai.__version__)"], tmp_path)
        assert probe[0] == 0 and int(probe[1].split(".")[0]) >= 3, probe
    async with DualApiPolicy() as policy:
        code, output, episodes = await vf_eval(
            vf_python,
            tmp_path,
            policy.base_url,
            "--env.taskset.nemo-env",
            "example_multi_step",
            "--env.agent.harness.api",
            api,
            "-n",
            "5",
            "-r",
            "2",
            "-c",
            "8",
        )
        assert code == 0, output[-3000:]
        vf_calls = list(policy.calls)

        ours_dir = tmp_path / "ours"
        code, ours_output = await our_eval(
            ours_python, tmp_path, policy.base_url, api, ours_dir, "-n", "5", "-r", "2", "-c", "8"
        )
        assert code == 0, ours_output[-3000:]

    traces = _traces(episodes)
    assert len(traces) == 10
    assert all(t["ok"] for t in traces), [t["errors"] for t in traces if not t["ok"]]
    ours = _results(ours_dir)
    assert len(ours) == 10 and all(r["error"] is None for r in ours)

    def by_example(rows: list[tuple[str, float, dict[str, float]]]) -> dict[str, set]:
        out: dict[str, set] = {}
        for example, reward, metrics in rows:
            out.setdefault(example, set()).add((reward, tuple(sorted(metrics.items()))))
        return out

    gym_metrics = ("set_overlap", "accuracy", "original_term_minefield_hit")
    vf_rows = [(t["task"]["data"]["id"], _reward(t), {k: t["metrics"][k] for k in gym_metrics}) for t in traces]
    our_rows = [(str(r["example_id"]), r["reward"], {k: float(r["metrics"][k]) for k in gym_metrics}) for r in ours]
    assert by_example(vf_rows) == by_example(our_rows)
    assert {r for _, r, _ in vf_rows} == {0.0, 1.0}, "the policy should score differently per task"

    # Every call of the Gym agent went through verifiers' interception, under this rollout's trace,
    # carrying this rollout's task (no cross-routing), with the real key swapped in by verifiers.
    assert {c["api"] for c in vf_calls} == {api}
    assert {c["authorization"] for c in vf_calls} == {"Bearer sk-policy-test"}
    assert len(vf_calls) == sum(len(t["calls"]) for t in traces)
    for trace in traces:
        assert len(trace["calls"]) == trace["info"]["nemo_gym"]["policy_calls"] in (3, 4)
        nodes = trace["nodes"]
        parents = {node.get("parent") for node in nodes}
        leaves = [i for i in range(len(nodes)) if i not in parents]
        assert len(leaves) == 1, "each call should extend the previous one: one branch per rollout"
        prompt = trace["task"]["data"]["prompt"]
        user = next(m["content"] for m in prompt if m["role"] == "user")
        users = [n["message"]["content"] for n in nodes if (n.get("message") or {}).get("role") == "user"]
        assert users == [user], "a call recorded under another rollout's trace"
        assert sum(bool(n.get("sampled")) for n in nodes) == len(trace["calls"])


# -- bad input through verifiers ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "environ", "expected"),
    [
        (["--env.taskset.nemo-env", "example_multi_stpe"], {}, "example_multi_step"),
        (["--env.taskset.nemo-env", "equivalence_llm_judge"], {}, "judge"),
        (
            ["--env.taskset.nemo-env", "example_multi_step"],
            {"VERIFIERS_NEMO_GYM_PYTHON": "/nonexistent/python3"},
            "/nonexistent/python3",
        ),
    ],
    ids=["unknown-env", "judge-env", "missing-gym-runtime"],
)
async def test_vf_eval_bad_input_fails_with_one_clear_error(
    vf_python: Path, tmp_path: Path, args: list[str], environ: dict[str, str], expected: str
) -> None:
    code, output, episodes = await vf_eval(vf_python, tmp_path, "http://127.0.0.1:9/v1", *args, extra_env=environ)
    assert code != 0
    assert expected in output, output[-3000:]
    assert not any(t["ok"] for t in _traces(episodes))


def test_auto_api_is_chat_under_a_training_client_and_responses_is_refused_there(vf_python: Path) -> None:
    script = (
        "import verifiers.v1 as vf; from verifiers_nemo._verifiers_v1 import resolve_api;"
        "train = vf.ModelContext(model='m', client=vf.TrainClientConfig());"
        "ev = vf.ModelContext(model='m', client=vf.EvalClientConfig());"
        "print(resolve_api('auto', train), resolve_api('auto', ev), resolve_api('responses', ev));"
        "resolve_api('responses', train)"
    )
    import subprocess

    out = subprocess.run([str(vf_python), "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.split() == ["chat", "responses", "responses"], out.stderr[-2000:]
    assert out.returncode != 0 and "ConfigurationError" in out.stderr
    assert "Chat Completions only" in out.stderr and "--env.agent.harness.api" in out.stderr


async def test_vf_eval_max_turns_bounds_gym_steps_so_rollouts_still_verify(vf_python: Path, tmp_path: Path) -> None:
    async with DualApiPolicy() as policy:
        code, output, episodes = await vf_eval(
            vf_python,
            tmp_path,
            policy.base_url,
            "--env.taskset.nemo-env",
            "example_multi_step",
            "--env.agent.max-turns",
            "2",
            "-n",
            "2",
        )
    assert code == 0, output[-3000:]
    traces = _traces(episodes)
    assert len(traces) == 2
    for trace in traces:
        # Cut off after two calls (before the policy's last): Gym still verified, so a real 0.
        assert trace["ok"], trace["errors"]
        assert len(trace["calls"]) == 2
        assert _reward(trace) == 0.0
    # Row 0 looked up two values and never extracted them; row 1 extracted one of the two expected.
    assert sorted(t["metrics"]["set_overlap"] for t in traces) == [0.0, 0.5]
    log = "".join(path.read_text() for path in (tmp_path / "vf-out").rglob("eval.log"))
    assert "Gym stack example_multi_step ready" in log, "our log lines should reach vf-eval's log"


@pytest.mark.parametrize("release", VERIFIERS_RELEASES)
async def test_vf_eval_an_engine_in_vllm_0_32_s_shape_fails_each_rollout_in_one_line_unless_renderers_reads_it(
    release: str, tmp_path: Path, engines: TrainEngines
) -> None:
    """Under verifiers' training client, an engine answering generate in vLLM 0.32's shape: renderers 0.1.12
    (verifiers 0.4.0's) cannot read it, and every rollout fails at once with one line naming the cause and the fix,
    never retried (the interception answers 502, a status otherwise retried), never a reward of 0; renderers
    0.1.13.dev17 (the pre-release's) reads it, and every rollout is scored."""
    before = engines.seen()["calls"].get("script/vllm-0.32", 0)  # the engines serve the whole module
    _code, output, episodes = await vf_eval(
        verifiers_python(release),
        tmp_path,
        engines.base_url("script/vllm-0.32"),
        "--env.taskset.nemo-env",
        "example_single_tool_call",
        "-n",
        "2",
        *_train_config(tmp_path, engines, "vllm-0.32"),
    )
    traces = _traces(episodes)
    assert len(traces) == 2, output[-3000:]
    assert engines.seen()["calls"]["script/vllm-0.32"] - before == 2  # one generate call per rollout: no retry
    for trace in traces:
        if release == "verifiers-pre":
            assert trace["ok"] and not trace["errors"], trace["errors"]
            assert trace["info"]["nemo_gym"]["error"] is None and _reward(trace) is not None
            continue
        assert not trace["ok"]
        assert _reward(trace) is None, "a failed rollout must carry no reward"
        assert [e["type"] for e in trace["errors"]] == ["HarnessError"], trace["errors"]
        error = trace["info"]["nemo_gym"]["error"]
        assert error["type"] == "upstream_http" and trace["info"]["nemo_gym"]["reward"] is None
        assert "\n" not in error["message"]
        assert '{"token_id": N}' in error["message"] and "Fix: serve the policy with prime-rl's" in error["message"]
