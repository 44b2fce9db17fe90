"""`verifiers-nemo eval` end to end: the console script as a subprocess, the real Gym stack, a fake upstream.

Each test that starts a stack costs ~15-20 s, so there are four: replay, pass@k, and an interrupted run
plus its resume. The bad-input tests start no stack and must fail within seconds.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

pytestmark = pytest.mark.e2e

CLI = str(Path(sys.executable).with_name("verifiers-nemo"))
ENV = "example_multi_step"
CORRECT = [711, 407]  # what every example of example_multi_step's example.jsonl expects


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("OPENAI_API_KEY", None)
    env["COLUMNS"] = "120"
    return env


async def _cli(*args: str, cwd: Path, timeout: float = 120.0) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        CLI, *args, cwd=cwd, env=_child_env(), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return proc.returncode or 0, out.decode(), err.decode()


def _run_dir(output_dir: Path) -> Path:
    (metadata,) = output_dir.glob("*/*/metadata.json")
    return metadata.parent


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "results.jsonl").read_text().splitlines() if line.strip()]


def _text(content: Any) -> str:
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return str(content or "")


class SynonymPolicy:
    """A Responses server for example_multi_step whose answers depend only on the request.

    The first call of a rollout (no tool output in its input) answers ``extract_synonym_values``
    with the right values for the first ``correct[example]`` rollouts of that example and wrong ones
    after; the next call ends the rollout with a message. So each example's number of correct
    rollouts is fixed whatever the order in which rollouts arrive.
    """

    def __init__(
        self,
        examples: list[str],
        correct: list[int],
        delay: float = 0.0,
        replicas: int = 1,
        last_dies_after: int | None = None,
        last_hangs_after: int | None = None,
    ) -> None:
        self.examples = {text: index for index, text in enumerate(examples)}
        self.correct = correct
        self.delay = delay
        self.replicas = replicas
        self.first_calls: Counter[int] = Counter()
        self.calls_by_port: Counter[int] = Counter()
        self.in_flight = 0
        """Calls being answered: aiohttp finishes a handler whose client went away (an interrupted run's)."""
        self._runner: web.AppRunner | None = None
        self._sites: list[web.TCPSite] = []
        self.ports: list[int] = []
        self.last_dies_after = last_dies_after
        """The last replica dies on its call after this many: its port closes and every connection to it is
        dropped unanswered from then on, as when its process is killed."""
        self.dead_port: int | None = None
        self.last_hangs_after = last_hangs_after
        """The last replica hangs on its call after this many: it accepts connections and answers nothing (no call,
        no GET /models) from then on, as a frozen engine does."""
        self.hung_port: int | None = None

    @property
    def port(self) -> int:
        return self.ports[0]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def base_urls(self) -> str:
        """Every replica (one server, several ports: one shared state), as ``-b`` takes them."""
        return ",".join(f"http://127.0.0.1:{port}/v1" for port in self.ports)

    async def __aenter__(self) -> SynonymPolicy:
        app = web.Application()
        app.router.add_post("/v1/responses", self._responses)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        for _ in range(self.replicas):
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self._sites.append(site)
        self.ports = [int(address[1]) for address in self._runner.addresses]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        if int(request.transport.get_extra_info("sockname")[1]) == self.hung_port:  # type: ignore[union-attr]
            await asyncio.Event().wait()  # frozen: never answers
        return web.json_response({"object": "list", "data": [{"id": "fake/policy-1", "object": "model"}]})

    async def _responses(self, request: web.Request) -> web.Response:
        port = int(request.transport.get_extra_info("sockname")[1])  # type: ignore[union-attr]
        self.calls_by_port[port] += 1
        hangs = self.last_hangs_after is not None and port == self.ports[-1]
        if hangs and (port == self.hung_port or self.calls_by_port[port] > self.last_hangs_after):  # type: ignore[operator]
            self.hung_port = port
            await asyncio.Event().wait()  # frozen: this call and every later one wait forever
        dies = self.last_dies_after is not None and port == self.ports[-1]
        if dies and (port == self.dead_port or self.calls_by_port[port] > self.last_dies_after):  # type: ignore[operator]
            if self.dead_port is None:
                self.dead_port = port
                await self._sites[-1].stop()  # new connections are refused
            request.transport.abort()  # type: ignore[union-attr]  # this one is dropped unanswered
            raise web.HTTPServiceUnavailable()  # never sent: the connection is gone
        self.in_flight += 1
        try:
            return await self._answer(request)
        finally:
            self.in_flight -= 1

    async def _answer(self, request: web.Request) -> web.Response:
        body = await request.json()
        items = body["input"]
        if self.delay:
            await asyncio.sleep(self.delay)
        n = sum(self.first_calls.values())
        if any(item.get("type") == "function_call_output" for item in items):
            output = [
                {
                    "type": "message",
                    "id": f"msg_{n}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": "Done.", "annotations": []}],
                }
            ]
        else:
            user = next(_text(item.get("content")) for item in items if item.get("role") == "user")
            example = self.examples[user]
            values = CORRECT if self.first_calls[example] < self.correct[example] else [0]
            self.first_calls[example] += 1
            output = [
                {
                    "type": "function_call",
                    "id": f"fc_{n}",
                    "call_id": f"call_{n}",
                    "name": "extract_synonym_values",
                    "arguments": json.dumps({"synonym_values": values}),
                    "status": "completed",
                }
            ]
        return web.json_response(
            {
                "id": f"resp_{n}",
                "object": "response",
                "created_at": time.time(),
                "model": body.get("model"),
                "status": "completed",
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": body.get("tools") or [],
                "usage": {
                    "input_tokens": 100,
                    "input_tokens_details": {"cached_tokens": 0},
                    "output_tokens": 10,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": 110,
                },
            }
        )


@pytest.fixture(scope="module")
def example_prompts(gym_root: Path) -> list[str]:
    path = gym_root / "resources_servers" / ENV / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        assert row["expected_synonym_values"] == CORRECT
    return [
        next(_text(m["content"]) for m in row["responses_create_params"]["input"] if m["role"] == "user")
        for row in rows
    ]


# ---------------------------------------------------------------------------------------------
# With the stack


async def test_replay_reproduces_recorded_rewards_and_saves_them(tmp_path: Path, gym_root: Path) -> None:
    code, out, err = await _cli("eval", ENV, "-s", "-o", str(tmp_path / "out"), cwd=tmp_path)

    assert code == 0, err
    run_dir = _run_dir(tmp_path / "out")
    assert run_dir.parent.name == f"{ENV}--replay"
    recorded = [
        json.loads(line)["reward"]
        for line in (gym_root / "resources_servers" / ENV / "data" / "example_rollouts.jsonl").read_text().splitlines()
        if line.strip()
    ]
    lines = sorted(_lines(run_dir), key=lambda r: r["task_index"])
    assert [(r["task_index"], r["rollout_index"]) for r in lines] == [(i, 0) for i in range(5)]
    assert [r["reward"] for r in lines] == recorded == [1.0] * 5
    assert all(r["recorded_reward"] == r["reward"] and r["error"] is None for r in lines)
    assert all(r["completion"] and r["prompt"] and "trace" not in r for r in lines)
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "finished"
    assert metadata["summary"]["reward"]["avg"] == 1.0
    assert metadata["summary"]["replay"] == {"compared": 5, "reproduced": 5, "mismatches": []}
    assert "Reward       avg 1.000" in out
    assert "5/5 rewards equal the recorded ones" in out


def _expected_pass(correct: list[int], n: int) -> tuple[dict[str, float], dict[str, float]]:
    at, power = {}, {}
    for k in (1, 2, 4):
        at[str(k)] = sum(1 - math.comb(n - c, k) / math.comb(n, k) for c in correct) / len(correct)
        power[str(k)] = sum(math.comb(c, k) / math.comb(n, k) for c in correct) / len(correct)
    return at, power


async def test_scripted_upstream_gives_the_right_pass_at_k_when_a_replica_dies_mid_run(
    tmp_path: Path, example_prompts: list[str]
) -> None:
    """Over two replicas of the model (-b URL1,URL2), the second dying after its 8th call: each gets its share of the
    calls until then, the calls it drops move to the live one, every rollout is scored as if nothing happened,
    and the summary names the dead replica."""
    correct = [4, 3, 2, 1, 0]
    async with SynonymPolicy(example_prompts, correct, replicas=2, last_dies_after=8) as policy:
        code, out, err = await _cli(
            "eval", ENV, "-b", policy.base_urls, "-m", "fake/policy-1", "-n", "5", "-r", "4", "-c", "8", "-s",
            "-o", str(tmp_path / "out"), "-T", "0.7", cwd=tmp_path,
        )  # fmt: skip

    assert code == 0, err
    run_dir = _run_dir(tmp_path / "out")
    assert run_dir.parent.name == f"{ENV}--fake--policy-1"
    lines = _lines(run_dir)
    assert len(lines) == 20 and all(r["error"] is None for r in lines)
    per_task = Counter(r["task_index"] for r in lines if r["reward"] == 1.0)
    assert [per_task[i] for i in range(5)] == correct
    summary = json.loads((run_dir / "metadata.json").read_text())["summary"]
    at, power = _expected_pass(correct, 4)
    assert at == pytest.approx({"1": 0.5, "2": 2 / 3, "4": 0.8})  # hand-computed
    assert power == pytest.approx({"1": 0.5, "2": 1 / 3, "4": 0.2})
    assert summary["pass_at_k"] == pytest.approx(at)
    assert summary["pass_power_k"] == pytest.approx(power)
    assert summary["reward"]["avg"] == pytest.approx(0.5)
    assert summary["usage"]["total_tokens"] == 20 * 2 * 110
    assert "pass@1 0.500 · pass@2 0.667 · pass@4 0.800" in out
    assert "pass^1 0.500 · pass^2 0.333 · pass^4 0.200" in out
    assert policy.first_calls == Counter({i: 4 for i in range(5)})
    assert sorted(policy.calls_by_port) == sorted(policy.ports)
    live, dead = policy.ports
    assert policy.dead_port == dead and policy.calls_by_port[live] == 40 - 8  # 40 calls answered in all
    dead_label = f"fake/policy-1@http://127.0.0.1:{dead}/v1"
    moved = [r for r in lines if r.get("failed_over")]
    assert moved and all(r["failed_over"] == [dead_label] and r["endpoint"].endswith(f":{live}/v1") for r in moved)
    [replica] = summary["replicas"]
    assert replica["replica"] == dead_label and replica["still_down"] and replica["seconds"] > 0
    assert f"{dead_label} out of the rotation 1 time" in out
    assert f"replica {dead_label} is out of the rotation" in err


async def test_a_replica_that_hangs_mid_run_leaves_the_rotation_and_every_rollout_is_scored(
    tmp_path: Path, example_prompts: list[str]
) -> None:
    """Over two replicas, the second freezing after its 8th call (its connections accepted, nothing answered, GET
    /models neither): the hang watch takes it out while it hangs, its waiting calls move to the live one, and every
    rollout is scored as if nothing happened, long before the 120 s budget of a call; the summary names it, hung."""
    correct = [4, 3, 2, 1, 0]
    async with SynonymPolicy(example_prompts, correct, replicas=2, last_hangs_after=8) as policy:
        code, out, err = await _cli(
            "eval", ENV, "-b", policy.base_urls, "-m", "fake/policy-1", "-n", "5", "-r", "4", "-c", "8", "-s",
            "-o", str(tmp_path / "out"), "--timeout", "120", cwd=tmp_path,
        )  # fmt: skip

    assert code == 0, err
    run_dir = _run_dir(tmp_path / "out")
    lines = _lines(run_dir)
    assert len(lines) == 20 and all(r["error"] is None for r in lines), [r["error"] for r in lines]
    per_task = Counter(r["task_index"] for r in lines if r["reward"] == 1.0)
    assert [per_task[i] for i in range(5)] == correct
    live, hung = policy.ports
    assert policy.hung_port == hung
    hung_label = f"fake/policy-1@http://127.0.0.1:{hung}/v1"
    moved = [r for r in lines if r.get("failed_over")]
    assert moved and all(r["failed_over"] == [hung_label] and r["endpoint"].endswith(f":{live}/v1") for r in moved)
    assert all(r["timing"]["total_s"] < 120 for r in moved)  # moved while it hung, not at the end of a call's budget
    [replica] = json.loads((run_dir / "metadata.json").read_text())["summary"]["replicas"]
    assert replica["replica"] == hung_label and replica["still_down"]
    assert replica["reason"].startswith("hung: ") and "no answer to GET /models" in replica["reason"]
    assert f"replica {hung_label} is out of the rotation (hung: " in err
    assert f"{hung_label} out of the rotation 1 time" in out


async def test_interrupted_run_resumes_exactly_the_missing_rollouts(tmp_path: Path, example_prompts: list[str]) -> None:
    out_dir = tmp_path / "out"
    async with SynonymPolicy(example_prompts, [4] * 5, delay=0.4) as policy:
        args = ["eval", ENV, "-b", policy.base_url, "-n", "5", "-r", "4", "-c", "2", "-s", "-o", str(out_dir)]
        proc = await asyncio.create_subprocess_exec(
            CLI,
            *args,
            cwd=tmp_path,
            env=_child_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        deadline = time.monotonic() + 90
        while True:  # wait until some rollouts are saved, then interrupt
            results = list(out_dir.glob("*/*/results.jsonl"))
            if results and len(results[0].read_text().splitlines()) >= 3:
                break
            assert proc.returncode is None and time.monotonic() < deadline, "no rollouts saved in time"
            await asyncio.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 130, err.decode()
        assert "Resume with" in err.decode()
        run_dir = _run_dir(out_dir)
        first = _lines(run_dir)
        assert 3 <= len(first) < 20
        assert json.loads((run_dir / "metadata.json").read_text())["status"] == "interrupted"
        with open(run_dir / "results.jsonl", "a") as f:  # as if killed in the middle of a write
            f.write('{"task_index": 4, "rollout_index": 3, "rew')

        policy.delay = 0
        # The interrupted run's last calls may still be in their delay: count them before the resume starts.
        deadline = time.monotonic() + 30
        while policy.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        calls_before = sum(policy.first_calls.values())
        code, out2, err2 = await _cli("eval", "-R", str(run_dir), "-c", "8", cwd=tmp_path)

    assert code == 0, err2
    lines = _lines(run_dir)
    pairs = Counter((r["task_index"], r["rollout_index"]) for r in lines)
    assert set(pairs) == {(t, r) for t in range(5) for r in range(4)}
    assert set(pairs.values()) == {1}
    assert sum(policy.first_calls.values()) - calls_before == 20 - len(first)
    metadata = json.loads((run_dir / "metadata.json").read_text())
    assert metadata["status"] == "finished"
    assert metadata["counts"] == {"expected": 20, "done": 20, "missing": 0}
    assert metadata["summary"]["rollouts"]["total"] == 20
    assert metadata["summary"]["pass_at_k"]["4"] == 1.0
    assert len(metadata["sessions"]) == 2
    assert "api_key" not in json.dumps(metadata["settings"]).replace("api_key_var", "")
    assert f"{len(first)} of 20 rollouts already done" in err2
    assert "Rollouts     20 of 20" in out2


# ---------------------------------------------------------------------------------------------
# Bad input: no stack, one clear message, non-zero status, within seconds


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


UNSET_KEY = "VN_TEST_UNSET_KEY"
# case: (args after `eval`, exit status, what the message says); more cases in tests/unit/test_cli_args.py
BAD_INPUT = {
    "bad-json": ([ENV, "-S", "{temperature: 1}"], 2, "-S/--sampling-args: not valid JSON"),
    "zero-c": ([ENV, "-c", "0"], 2, "-c/--max-concurrent: must be at least 1"),
    "unknown-env": (["example_mult_step"], 2, "Closest: example_multi_step"),
    "missing-key": ([ENV, "-b", "http://127.0.0.1:9/v1", "-m", "m", "-k", UNSET_KEY], 2, f"${UNSET_KEY}"),
    "unreachable": ([ENV, "-b", "http://127.0.0.1:{closed}/v1", "-m", "m"], 1, "Cannot reach the endpoint"),
    "model-not-served": ([ENV, "-b", "{fake}", "-m", "fake/policy-2"], 2, "'fake/policy-2' is not served"),
}


async def test_bad_input_fails_fast_with_one_clear_message(tmp_path: Path) -> None:
    two_at_a_time = asyncio.Semaphore(2)

    async def case(name: str, args: list[str], fake_url: str) -> tuple[str, int, str, str, float]:
        args = [a.replace("{closed}", str(_closed_port())).replace("{fake}", fake_url) for a in args]
        (tmp_path / name).mkdir()
        async with two_at_a_time:
            started = time.monotonic()
            status, out, err = await _cli("eval", *args, cwd=tmp_path / name, timeout=60)
            return name, status, out, err, time.monotonic() - started

    async with SynonymPolicy([], []) as policy:  # serves fake/policy-1 only
        outcomes = await asyncio.gather(*(case(n, a, policy.base_url) for n, (a, _, _) in BAD_INPUT.items()))

    for name, status, out, err, seconds in outcomes:
        _, code, message = BAD_INPUT[name]
        assert (status, message in err) == (code, True), f"{name}: {err}"
        assert "Traceback" not in err and out == "", f"{name}: {err}"
        assert len([line for line in err.splitlines() if "error" in line]) == 1, f"{name}: {err}"
        assert "Starting the Gym stack" not in err and not (tmp_path / name / "outputs").exists()
        assert seconds < 20, f"{name} took {seconds:.1f}s"  # ~3-6 s, mostly importing; no stack


EVAL_FLAGS = (
    *("-m", "--model", "-b", "--api-base-url", "-k", "--api-key-var", "--api", "--policy"),
    *("-n", "--num-examples", "-r", "--rollouts-per-example", "-c", "--max-concurrent", "--timeout"),
    *("-t", "--max-tokens", "-T", "--temperature", "-S", "--sampling-args", "-a", "--env-args"),
    *(
        "-s",
        "--save-results",
        "-o",
        "--output-dir",
        "-R",
        "--resume",
        "--save-trace",
        "--pass-threshold",
        "-v",
    ),
)


async def test_help_documents_every_flag(tmp_path: Path) -> None:
    status, out, _ = await _cli("eval", "--help", cwd=tmp_path)

    assert status == 0
    for flag in EVAL_FLAGS:
        assert f" {flag}" in out, flag


async def test_envs_lists_the_catalogue_and_filters_runnable(tmp_path: Path) -> None:
    (status, out, _), (status_table, table, _), (status_named, named, _) = await asyncio.gather(
        _cli("envs", "--runnable", "--json", cwd=tmp_path),
        _cli("envs", "example_", cwd=tmp_path),
        _cli("envs", "--json", "resources_servers/arc_agi", cwd=tmp_path),  # the explicit form, as eval takes it
    )
    assert status_named == 0 and [(r["name"], r["kind"]) for r in json.loads(named)] == [
        ("resources_servers/arc_agi", "resources server")
    ]

    assert status == 0 and status_table == 0
    rows = json.loads(out)
    names = {row["name"] for row in rows}
    assert {"example_multi_step", "example_single_tool_call"} <= names
    assert all(row["runnable"] and not row["needs"] and not row["extra_deps"] for row in rows)
    assert all(row["ready"] and row["not_ready_because"] == [] for row in rows)
    assert all(row["environment_server"] is None for row in rows)  # nemo-gym 0.4: rollouts go to the agent
    assert all(row["network_cell"] in ("-", "download?") for row in rows)  # runnable: nothing to install or call
    assert table.splitlines()[0].split() == [
        "NAME",
        "KIND",
        "AGENT",
        "DATASETS",
        "EXTRA",
        "DEPS",
        "NEEDS",
        "VARIABLES",
        "READY",
        "NETWORK",
        "RECORDED",
        "FROM",
    ]
    assert any(line.startswith("example_multi_step ") and "simple_agent" in line for line in table.splitlines())
