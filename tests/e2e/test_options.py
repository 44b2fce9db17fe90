"""The eval flags that need a real run, tested on two shared runs of `verifiers-nemo eval` (the console
script's entry point in a subprocess, the real Gym stack, a fake chat upstream that keeps every request):

* ``flags``: one run with most eval flags at once; each test asserts one flag's effect on what the run
  wrote (``metadata.json``, ``results.jsonl``, stderr) or on what the upstream received.
* ``exact``: ``--exact-tokens -s`` (no ``-o``, no ``-v``): exact mode asks vLLM's scale-out routes.

The ``--env.*`` fields of the verifiers environment are loaded through verifiers' own CLI parsing in
``.venv-vf`` (no stack): what the taskset loads and what the harness is built with.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.unit.fake_upstream import FakeReply, FakeUpstream

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
ENV = "example_single_tool_call"  # 5 rows
KEY_VAR, KEY = "VN_OPTIONS_KEY", "sk-options-test-key"
ROLLOUT_TIMEOUT = 4.0


class CountingUpstream(FakeUpstream):
    """The fake chat upstream, answering every call after ``delay`` s, counting the calls in flight at once,
    and answering (404) and keeping any other path (vLLM's scale-out routes)."""

    def __init__(self, *args: Any, delay: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.delay = delay
        self.in_flight = 0
        self.max_in_flight = 0
        self.other_paths: list[str] = []

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        app.router.add_get("/v1/models", self._models)
        app.router.add_post("/{tail:.*}", self._other)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", 0).start()
        self._port = int(self._runner.addresses[0][1])

    async def _other(self, request: web.Request) -> web.Response:
        self.other_paths.append(request.path)
        return web.json_response({"error": {"message": f"{request.path} is not served"}}, status=404)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            return await super()._handle(request)
        finally:
            self.in_flight -= 1


@dataclass
class Run:
    code: int
    out: str
    err: str
    run_dir: Path
    metadata: dict[str, Any]
    rows: list[dict[str, Any]]
    upstream: CountingUpstream


async def _eval(args: list[str], cwd: Path, upstream: CountingUpstream) -> Run:
    env = {**os.environ, KEY_VAR: KEY, "COLUMNS": "120"}
    env.pop("OPENAI_API_KEY", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from verifiers_nemo._cli.main import main; sys.exit(main())",
        "eval", ENV, *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), 240)
    (metadata,) = cwd.rglob("metadata.json")
    rows = [json.loads(line) for line in (metadata.parent / "results.jsonl").read_text().splitlines() if line]
    return Run(
        proc.returncode or 0,
        out.decode(),
        err.decode(),
        metadata.parent,
        json.loads(metadata.read_text()),
        rows,
        upstream,
    )


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def runs(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[dict[str, Run]]:
    flags_dir, exact_dir = tmp_path_factory.mktemp("flags"), tmp_path_factory.mktemp("exact")
    async with (
        CountingUpstream("fake-policy", token_ids=True, delay=0.3) as flags_upstream,
        CountingUpstream("fake-policy", token_ids=True) as exact_upstream,
    ):
        # The first call never answers (--timeout ends its rollout); every other call asks for a tool, so only
        # -a max_steps ends the others.
        flags_upstream.script(FakeReply.hang(), FakeReply.call_tools(("get_weather", {"city": "Paris"}), times=10**6))
        flags = _eval(
            [
                *("-b", flags_upstream.base_url, "-m", "fake-policy", "-k", KEY_VAR, "--api", "chat"),
                *("--policy", "endpoint", "-n", "3", "-r", "2", "-c", "2", "--timeout", str(ROLLOUT_TIMEOUT)),
                *("-a", '{"max_steps": 2}', "-t", "33", "-T", "0.25", "-S", '{"top_p": 0.5, "temperature": 0.9}'),
                *("--return-tokens", "--save-trace", "--pass-threshold", "1.5", "-o", str(flags_dir / "out"), "-v"),
            ],
            flags_dir,
            flags_upstream,
        )
        exact = _eval(
            ["-b", exact_upstream.base_url, "-m", "fake-policy", "--api", "chat", "-n", "1", "--exact-tokens", "-s"],
            exact_dir,
            exact_upstream,
        )
        flags_run, exact_run = await asyncio.gather(flags, exact)
    yield {"flags": flags_run, "exact": exact_run}


@pytest.fixture(scope="module")
def flags(runs: dict[str, Run]) -> Run:
    run = runs["flags"]
    assert run.code == 0, run.err[-3000:]
    return run


@pytest.fixture(scope="module")
def exact(runs: dict[str, Run]) -> Run:
    return runs["exact"]


def _sent(run: Run) -> list[dict[str, Any]]:
    return [request.body for request in run.upstream.requests]


def _ok(run: Run) -> list[dict[str, Any]]:
    return [row for row in run.rows if row["error"] is None]


def test_env_model_and_output_dir_name_the_run_folder(flags: Run) -> None:
    assert flags.run_dir.parent.name == f"{ENV}--fake-policy"
    assert flags.run_dir.parents[1].name == "out"
    assert {body["model"] for body in _sent(flags)} == {"fake-policy"}


def test_api_key_var_is_the_key_the_upstream_received(flags: Run) -> None:
    assert {request.authorization for request in flags.upstream.requests} == {f"Bearer {KEY}"}
    assert flags.metadata["settings"]["api_key_var"] == KEY_VAR and KEY not in json.dumps(flags.metadata)


def test_api_chat_speaks_chat_completions_to_the_base_url(flags: Run) -> None:
    assert {request.path for request in flags.upstream.requests} == {"/v1/chat/completions"}


def test_num_examples_and_rollouts_per_example_are_the_rows_run(flags: Run) -> None:
    pairs = Counter((row["task_index"], row["rollout_index"]) for row in flags.rows)
    assert set(pairs) == {(t, r) for t in range(3) for r in range(2)} and set(pairs.values()) == {1}


def test_max_concurrent_bounds_the_calls_in_flight(flags: Run) -> None:
    assert flags.upstream.max_in_flight == 2  # 6 rollouts, each call 0.3 s: more would have overlapped


def test_timeout_ends_the_rollout_that_outlives_it(flags: Run) -> None:
    errors = [row["error"]["type"] for row in flags.rows if row["error"]]
    assert errors == ["timeout"]
    assert flags.metadata["settings"]["timeout"] == ROLLOUT_TIMEOUT


def test_env_args_max_steps_bounds_the_gym_agent_s_calls(flags: Run) -> None:
    ok = _ok(flags)
    assert len(ok) == 5 and all(len(row["trace"]) == 2 for row in ok)
    assert flags.metadata["settings"]["env_args"] == {"max_steps": 2}


def test_max_tokens_temperature_and_sampling_args_reach_the_upstream(flags: Run) -> None:
    for body in _sent(flags):
        assert body.get("max_tokens", body.get("max_completion_tokens")) == 33, body
        assert (body["temperature"], body["top_p"]) == (0.25, 0.5)


def test_return_tokens_asks_for_token_ids_and_records_them(flags: Run) -> None:
    assert all(body.get("logprobs") is True and body.get("return_token_ids") is True for body in _sent(flags))
    calls = [call for row in _ok(flags) for call in row["trace"]]
    assert calls and all(call["completion_token_ids"] and call["prompt_token_ids"] for call in calls)


def test_save_trace_saves_every_policy_call(flags: Run) -> None:
    assert all(isinstance(row.get("trace"), list) for row in flags.rows)
    assert flags.metadata["settings"]["save_trace"] is True


def test_pass_threshold_decides_which_rollouts_count_as_correct(flags: Run) -> None:
    rewards = [row["reward"] for row in _ok(flags)]
    assert rewards and min(rewards) == 1.0  # every task would pass under the default threshold 0.5
    assert flags.metadata["summary"]["pass_at_k"]["1"] == 0.0  # none reaches 1.5


def test_verbose_logs_what_the_quiet_run_does_not(flags: Run, exact: Run) -> None:
    assert "INFO verifiers_nemo" in flags.err
    assert "INFO verifiers_nemo" not in exact.err


def test_save_results_without_output_dir_saves_under_outputs(exact: Run) -> None:
    assert exact.run_dir.parts[-4:-2] == ("outputs", "evals"), exact.run_dir
    assert exact.rows


def test_exact_tokens_is_saved_and_asks_vllm_s_render_route(exact: Run) -> None:
    assert exact.metadata["settings"]["exact_tokens"] is True, "--exact-tokens was dropped (issue 29)"
    assert "/v1/chat/completions/render" in exact.upstream.other_paths


# -- the verifiers environment's --env.* fields, read by verifiers' own CLI parsing ------------------

VF_PYTHON = ROOT / ".venv-vf" / "bin" / "python"

_VF_SCRIPT = """
import asyncio, json, sys
from pydantic_config import cli
from verifiers.v1.cli.resolve import narrow_config, with_positional_taskset
from verifiers.v1.configs.cli.eval import EvalConfig
import verifiers.v1 as vf
from verifiers_nemo._verifiers_v1 import GymTaskset, _shared_harness

argv = with_positional_taskset(sys.argv[1:])
config_type = narrow_config(EvalConfig, argv)
sys.argv = ["vf-eval", *argv]
config = cli(config_type)
env = vf.load_environment(config.env)
taskset, harness_config = env.taskset, env.config.agent.harness
tasks = taskset.load()
harness = asyncio.run(_shared_harness(taskset.config.nemo_env, harness_config, gym_python=taskset.config.gym_python))
judge = harness.judges.endpoints.default
print(json.dumps({
    "rows": [t.data.example_id for t in tasks],
    "sources": sorted({t.data.source.rsplit(":", 1)[0].rsplit("/", 1)[-1] for t in tasks}),
    "task_config_is_the_taskset_s": all(t.config is taskset.config.task for t in tasks),
    "timeout": harness.timeout,
    "max_steps": harness.options.max_steps,
    "isolated_venvs": harness.options.isolated_venvs,
    "start_timeout": harness.options.start_timeout,
    "gym_python": harness.options.gym_python,
    "judge_api": judge.api if judge else None,
}))
"""


def _vf_load(*args: str, environ: dict[str, str] | None = None) -> dict[str, Any]:
    if not VF_PYTHON.exists():
        pytest.fail(f"{VF_PYTHON} is missing: `bash .ci/setup-tests` builds the verifiers venv")
    env = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": sys.executable, **(environ or {})}
    env.pop("VIRTUAL_ENV", None)
    argv = [str(VF_PYTHON), "-c", _VF_SCRIPT, "nemo-gym-env", "-m", "m", *args]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vf_rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Plain, shuffled and limited, and from a file: the rows the taskset loads (one process each)."""
    gym_root = Path(subprocess.check_output([sys.executable, "-c", "from verifiers_nemo._gym.runtime import gym_root;"
                                             "print(gym_root())"], text=True).strip())  # fmt: skip
    rows = gym_root / "resources_servers" / "example_multi_step" / "data" / "example.jsonl"
    two = tmp_path_factory.mktemp("vf") / "two.jsonl"
    two.write_text("".join(rows.read_text().splitlines(keepends=True)[:2]))
    missing = "/nonexistent/gym/python"
    base = ["--env.taskset.nemo-env", "example_multi_step"]
    return {
        "plain": _vf_load(*base),
        "options": _vf_load(
            *base,
            *("--env.taskset.shuffle", "true", "--env.taskset.seed", "3", "--env.taskset.limit", "4"),
            *("--env.taskset.gym-python", sys.executable, "--env.agent.harness.timeout", "7"),
            *("--env.agent.harness.max-steps", "5", "--env.agent.harness.isolated-venvs", "true"),
            *("--env.agent.harness.judge-base-url", "http://127.0.0.1:9/v1", "--env.agent.harness.judge-model", "j"),
            *("--env.agent.harness.judge-api", "chat", "--env.agent.harness.start-timeout", "900"),
            environ={"VERIFIERS_NEMO_GYM_PYTHON": missing},  # only --env.taskset.gym-python can find the runtime
        ),
        "file": _vf_load(*base, "--env.taskset.jsonl-path", str(two)),
        "dataset": _vf_load(
            "--env.taskset.nemo-env", "mcqa", "--env.taskset.dataset", "example_with_template_metadata"
        ),
    }


def test_vf_taskset_limit_shuffle_and_seed_pick_the_rows(vf_rows: dict[str, Any]) -> None:
    plain, chosen = vf_rows["plain"]["rows"], vf_rows["options"]["rows"]
    assert len(plain) == 5 and len(chosen) == 4 and set(chosen) <= set(plain)
    assert chosen != plain[:4]  # shuffled with seed 3 (a different seed, another order: test_taskset)


def test_vf_taskset_jsonl_path_and_dataset_pick_the_file(vf_rows: dict[str, Any]) -> None:
    assert vf_rows["plain"]["sources"] == ["example.jsonl"]
    assert vf_rows["file"]["sources"] == ["two.jsonl"] and len(vf_rows["file"]["rows"]) == 2
    assert vf_rows["dataset"]["sources"] == ["example_with_template_metadata.jsonl"]


def test_vf_taskset_task_config_reaches_every_task(vf_rows: dict[str, Any]) -> None:
    assert vf_rows["plain"]["task_config_is_the_taskset_s"] is True


def test_vf_harness_fields_build_the_harness(vf_rows: dict[str, Any]) -> None:
    plain, options = vf_rows["plain"], vf_rows["options"]
    assert (plain["timeout"], plain["max_steps"], plain["isolated_venvs"], plain["judge_api"]) == (
        600.0,
        100,
        False,
        None,
    )
    assert (options["timeout"], options["max_steps"], options["isolated_venvs"]) == (7.0, 5, True)
    assert options["judge_api"] == "chat" and options["gym_python"] == sys.executable
    assert (plain["start_timeout"], options["start_timeout"]) == (None, 900.0)  # None: the variable's, else 600 s


def test_start_timeout_bounds_the_stack_start(tmp_path: Path) -> None:
    """``-a '{"start_timeout": 1}'`` (``NeMoGymHarness(start_timeout=)``, which the CLI builds) ends a start that
    is not ready in time with an error naming the limit, in about that time, leaving no run folder: the server's
    app sleeps ten minutes at import, so no machine, warm start or not, starts it in 1 s."""
    import time

    from tests.own_envs import WEATHER_APP, write_weather_env

    folder = write_weather_env(tmp_path, "slow_start", app="import time\ntime.sleep(600)\n" + WEATHER_APP)
    cli = Path(sys.executable).with_name("verifiers-nemo")
    argv = [str(cli), "eval", str(folder), "-n", "1", "-o", "out", "-a", json.dumps({"start_timeout": 1})]
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode != 0 and re.search(r"within 1s|limit of 1s", proc.stderr), proc.stderr[-3000:]
    assert time.monotonic() - started < 60  # the limit, and stopping what had started; not the server's 600 s
    assert not list((tmp_path / "out").glob("*/*")), "a run that never started left its folder behind"
