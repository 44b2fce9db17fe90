"""Every option a user can set has a test of its effect (``tests/options_registry.py``), and the options
whose effect needs no Gym stack are tested here: what a fake upstream received, what a command wrote,
what a proxy did. The ones that need a stack or a run are in ``tests/e2e/test_options.py``."""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.options_registry import EFFECT_TESTS, ROOT, all_options
from tests.unit.fake_upstream import FakeReply, FakeUpstream
from verifiers_nemo import (
    Endpoint,
    FunctionUpstream,
    NeMoGymHarness,
    ProxyConfig,
    RoutingProxy,
    UpstreamError,
    load_environment,
)
from verifiers_nemo._cli import build_parser, main
from verifiers_nemo._routing import ROUTE_METADATA_KEY, STATUS_UPSTREAM_FAILED

ENV = "example_multi_step"

# -- the registry is complete ---------------------------------------------------------------------


def test_every_option_has_a_registered_effect_test() -> None:
    options = all_options()
    assert len(options) == len(set(options)), "an option generated twice"
    missing = sorted(set(options) - set(EFFECT_TESTS))
    stale = sorted(set(EFFECT_TESTS) - set(options))
    assert missing == [], (
        f"options with no effect test (add one, and its entry in tests/options_registry.py): {missing}"
    )
    assert stale == [], f"registry entries for options that no longer exist: {stale}"


def _test_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names |= {f"{node.name}::{item.name}" for item in node.body if isinstance(item, ast.FunctionDef)}
    return names


def test_every_registered_effect_test_exists() -> None:
    absent = []
    files: dict[str, set[str]] = {}
    for option, reference in EFFECT_TESTS.items():
        path, _, name = reference.partition("::")
        if path not in files:
            files[path] = _test_names(ROOT / path) if (ROOT / path).is_file() else set()
        if not name.startswith("test_") or name not in files[path]:
            absent.append(f"{option}: {reference}")
    assert absent == []


# -- CLI: every command's -v, envs, prepare, replay-server, report ---------------------------------


def _commands() -> list[str]:
    parser = build_parser()
    return sorted(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]


# Each command with arguments that fail fast after the flags are read (nothing runs).
_FAILING_FAST = {
    "eval": ["eval", "no_such_env_xyz"],
    "envs": ["envs", "no_such_env_xyz"],
    "prepare": ["prepare", "no_such_env_xyz"],
    "replay-server": ["replay-server", "no_such_env_xyz"],
    "report": ["report", "no/such/run"],
    "export": ["export", "no/such/run"],
    "ps": ["ps", "--json"],
}


def _run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = int(exc.code or 0)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.parametrize("command", _commands())
def test_verbose_makes_info_logs_reach_stderr(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = _FAILING_FAST[command]
    probe = logging.getLogger("verifiers_nemo.options_probe")
    try:
        _run_cli(argv, capsys)
        probe.info("quiet-probe")
        quiet = capsys.readouterr().err
        _run_cli([argv[0], "-v", *argv[1:]], capsys)
        probe.info("verbose-probe")
        verbose = capsys.readouterr().err
    finally:
        logging.getLogger().handlers.clear()
        logging.getLogger("verifiers_nemo").setLevel(logging.NOTSET)
    assert "quiet-probe" not in quiet
    assert "INFO verifiers_nemo.options_probe: verbose-probe" in verbose


def test_envs_filter_and_recorded_narrow_the_list(capsys: pytest.CaptureFixture[str]) -> None:
    rows = {
        name: json.loads(_run_cli(argv, capsys)[1])
        for name, argv in {
            "all": ["envs", "--json"],
            "filtered": ["envs", "--json", "tool_call"],
            "recorded": ["envs", "--json", "--recorded"],
        }.items()
    }
    every = {row["name"] for row in rows["all"]}
    filtered = {row["name"] for row in rows["filtered"]}
    assert filtered and filtered == {name for name in every if "tool_call" in name} and filtered < every
    recorded = {row["name"] for row in rows["recorded"]}
    assert recorded == {row["name"] for row in rows["all"] if row["recorded"]} and recorded < every


def test_prepare_uses_the_gym_python_it_is_given(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    code, _, err = _run_cli(["prepare", ENV, "--gym-python", str(missing)], capsys)

    assert code != 0 and str(missing) in err


def test_replay_server_serves_the_jsonl_file_it_is_given(gym_root: Path, tmp_path: Path) -> None:
    recordings = (gym_root / "resources_servers" / ENV / "data" / "example_rollouts.jsonl").read_text().splitlines()
    assert len([line for line in recordings if line.strip()]) == 5
    path = tmp_path / "two.jsonl"
    path.write_text("\n".join(recordings[:2]) + "\n")
    port_file = tmp_path / "url"
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [sys.executable, "-m", "verifiers_nemo._cli.main", "replay-server", ENV, "--jsonl-path", str(path)]
    proc = subprocess.Popen([*argv, "--port-file", str(port_file)], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "Replaying 2 recorded rollouts at http://127.0.0.1:" in first, first
    finally:
        proc.terminate()
        proc.wait(30)
    assert port_file.read_text().startswith("http://127.0.0.1:")


@pytest.fixture
def gym_root() -> Path:
    from verifiers_nemo._gym.runtime import gym_root as _gym_root

    return _gym_root()


def test_report_writes_its_title_where_output_says(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("plotly")
    from tests.unit.report_runs import write_run

    run = write_run(tmp_path / "run", 3, 2)
    out = tmp_path / "elsewhere" / "mine.html"
    code, _, err = _run_cli(["report", str(run), "--title", "Options under test", "-o", str(out)], capsys)

    assert code == 0, err
    assert "<title>Options under test" in out.read_text() and not (run / "report.html").exists()


# -- a proxy and a fake upstream: Endpoint, ProxyConfig, RoutingProxy, FunctionUpstream -------------


def _body(key: str, text: str = "hi", **extra: Any) -> dict[str, Any]:
    return {"model": key, "metadata": {ROUTE_METADATA_KEY: key}, "input": [{"role": "user", "content": text}], **extra}


async def _post(proxy: RoutingProxy, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    async with aiohttp.ClientSession() as session, session.post(f"{proxy.base_url}/responses", json=body) as resp:
        return resp.status, await resp.json()


@pytest.fixture
async def fake() -> AsyncIterator[FakeUpstream]:
    async with FakeUpstream("u0", token_ids=True) as upstream:
        yield upstream


class Recorder:
    """An upstream on 127.0.0.1 that answers every POST after ``delay`` seconds (chat or Responses) and
    keeps the path, the peer port and how many requests were in flight at once."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.paths: list[str] = []
        self.peer_ports: list[int] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.runner: web.AppRunner | None = None

    async def answer(self, request: web.Request) -> web.Response:
        self.paths.append(request.path)
        self.peer_ports.append(int(request.transport.get_extra_info("peername")[1]))  # type: ignore[union-attr]
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self.in_flight -= 1
        if not request.path.endswith("/responses"):
            return web.json_response({"error": {"message": f"no route {request.path}"}}, status=404)
        item = {"id": "m", "type": "message", "role": "assistant", "status": "completed"}
        item["content"] = [{"type": "output_text", "text": "ok", "annotations": []}]
        return web.json_response(
            {"id": "r", "object": "response", "created_at": 0, "model": "m", "status": "completed", "output": [item]}
        )

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_post("/{tail:.*}", self.answer)
        self.runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.2)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def base_url(self) -> str:
        assert self.runner is not None
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}/v1"


async def test_endpoint_api_chooses_the_protocol_the_upstream_is_spoken_to(fake: FakeUpstream) -> None:
    with RoutingProxy() as proxy:
        for api in ("chat", "responses"):
            route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api=api))
            assert (await _post(proxy, _body(route.key)))[0] == 200
    assert [r.path for r in fake.requests] == ["/v1/chat/completions", "/v1/responses"]


async def test_endpoint_name_is_how_a_failed_call_is_logged(
    fake: FakeUpstream, caplog: pytest.LogCaptureFixture
) -> None:
    fake.script(FakeReply.error(400, "bad request"))
    with RoutingProxy(max_retries=0) as proxy, caplog.at_level(logging.INFO, "verifiers_nemo"):
        route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", name="replica-seven"))
        await _post(proxy, _body(route.key))
    assert "replica-seven" in caplog.text


@pytest.mark.parametrize("api", ["chat", "responses"])
async def test_endpoint_return_tokens_asks_vllm_for_token_ids_and_records_them(fake: FakeUpstream, api: str) -> None:
    with RoutingProxy() as proxy:
        plain = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api=api))
        tokens = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api=api, return_tokens=True))
        await _post(proxy, _body(plain.key))
        await _post(proxy, _body(tokens.key))
    asked_plain, asked = (r.body for r in fake.requests)
    if api == "chat":
        assert (asked.get("logprobs"), asked.get("return_token_ids")) == (True, True)
        assert "logprobs" not in asked_plain and "return_token_ids" not in asked_plain
        assert tokens.calls[0].completion_token_ids and not plain.calls[0].completion_token_ids
    else:
        assert asked.get("enable_response_messages") is True and asked.get("include")
        assert "enable_response_messages" not in asked_plain


async def test_endpoint_exact_tokens_renders_on_vllm_s_scale_out_routes() -> None:
    async with Recorder() as upstream:
        with RoutingProxy(max_retries=0) as proxy:
            plain = proxy.open_route(Endpoint(base_url=upstream.base_url, model="m", api="chat"))
            exact = proxy.open_route(Endpoint(base_url=upstream.base_url, model="m", api="chat", exact_tokens=True))
            await _post(proxy, _body(plain.key))
            plain_paths = list(upstream.paths)
            await _post(proxy, _body(exact.key))
    assert plain_paths == ["/v1/chat/completions"]
    assert upstream.paths[1:] == ["/v1/chat/completions/render"]


async def test_proxy_host_and_port_are_where_it_listens() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with RoutingProxy(ProxyConfig(host="127.0.0.2", port=port)) as proxy:
        assert proxy.base_url == f"http://127.0.0.2:{port}/v1"
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.2:{port}/health") as resp:
                assert resp.status == 200
            with pytest.raises(aiohttp.ClientConnectionError):
                await session.get(f"http://127.0.0.1:{port}/health")


async def test_proxy_upstream_timeout_bounds_a_call_over_all_attempts(fake: FakeUpstream) -> None:
    fake.script(FakeReply.hang(times=10))
    with RoutingProxy(upstream_timeout=0.5, max_retries=5, backoff=0.01) as proxy:
        route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        started = time.monotonic()
        status, _ = await _post(proxy, _body(route.key))
    assert status == STATUS_UPSTREAM_FAILED and time.monotonic() - started < 3
    assert route.error is not None and route.error.type == "upstream_timeout"


async def test_proxy_connect_timeout_bounds_each_connection_attempt() -> None:
    # A listener whose accept queue is full: the kernel drops further SYNs, so a connect hangs.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        await asyncio.sleep(0.2)
        with RoutingProxy(connect_timeout=0.5, upstream_timeout=30, max_retries=0) as proxy:
            route = proxy.open_route(Endpoint(base_url=f"http://127.0.0.1:{port}/v1", model="m"))
            started = time.monotonic()
            await _post(proxy, _body(route.key))
            elapsed = time.monotonic() - started
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert route.error is not None and "connection not established within 0.5 s" in route.error.message
    assert elapsed < 5


async def test_proxy_max_retries_backoff_and_backoff_max_shape_the_retries() -> None:
    async def failing_call(**options: Any) -> tuple[int, float]:
        async with FakeUpstream("failing") as fake:
            fake.script(FakeReply.error(503, times=3), FakeReply.say("ok"))
            with RoutingProxy(upstream_timeout=30, **options) as proxy:
                route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
                started = time.monotonic()
                await _post(proxy, _body(route.key))
                return len(fake.requests), time.monotonic() - started

    attempts_once, _ = await failing_call(max_retries=1, backoff=0.01)
    attempts, slow = await failing_call(max_retries=2, backoff=0.4, backoff_max=10)
    _, capped = await failing_call(max_retries=2, backoff=0.4, backoff_max=0.02)
    assert (attempts_once, attempts) == (2, 3)
    assert slow >= 0.6  # retry 1 waits 0.2-0.4 s, retry 2 0.4-0.8 s
    assert capped < 0.3  # each wait at most backoff_max


async def test_proxy_connector_limits_bound_the_connections_to_upstreams() -> None:
    async def in_flight(**options: Any) -> int:
        async with Recorder(delay=0.3) as upstream:
            with RoutingProxy(**options) as proxy:
                routes = [proxy.open_route(Endpoint(base_url=upstream.base_url, model="m")) for _ in range(5)]
                await asyncio.gather(*(_post(proxy, _body(route.key)) for route in routes))
        return upstream.max_in_flight

    assert await in_flight() == 5
    assert await in_flight(connector_limit=2) == 2
    assert await in_flight(connector_limit=0, connector_limit_per_host=3) == 3


async def test_proxy_keepalive_timeout_closes_idle_upstream_connections() -> None:
    async def peer_ports(**options: Any) -> list[int]:
        async with Recorder() as upstream:
            with RoutingProxy(**options) as proxy:
                route = proxy.open_route(Endpoint(base_url=upstream.base_url, model="m"))
                await _post(proxy, _body(route.key))
                await asyncio.sleep(0.6)
                await _post(proxy, _body(route.key))
        return upstream.peer_ports

    kept = await peer_ports()
    closed = await peer_ports(keepalive_timeout=0.1)
    assert kept[0] == kept[1]
    assert closed[0] != closed[1]


async def test_proxy_max_request_bytes_refuses_bigger_bodies(fake: FakeUpstream) -> None:
    with RoutingProxy(max_request_bytes=4096) as proxy:
        route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        small, _ = await _post(proxy, _body(route.key, "x" * 100))
        async with aiohttp.ClientSession() as session:
            body = _body(route.key, "x" * 8192)
            async with session.post(f"{proxy.base_url}/responses", json=body) as resp:
                big = resp.status
    assert (small, big) == (200, 413)


async def test_proxy_tombstones_bound_how_many_closed_keys_are_told_apart(fake: FakeUpstream) -> None:
    with RoutingProxy(tombstones=1) as proxy:
        older = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        newer = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
        older.close()
        newer.close()
        (forgotten, _), (remembered, _) = await _post(proxy, _body(older.key)), await _post(proxy, _body(newer.key))
    assert (forgotten, remembered) == (404, 410)


def _listen_backlog(port: int) -> int:
    out = subprocess.run(["ss", "-Hltn", f"sport = :{port}"], capture_output=True, text=True, check=True).stdout
    (line,) = out.splitlines()
    return int(line.split()[2])  # State Recv-Q Send-Q: a listener's Send-Q is its backlog


def test_proxy_backlog_is_the_listen_queue_of_its_socket() -> None:
    with RoutingProxy(backlog=77) as proxy:
        assert _listen_backlog(proxy.port) == 77


@pytest.mark.parametrize("use_uvloop", [True, False])
async def test_proxy_use_uvloop_picks_the_loop_its_upstreams_run_on(use_uvloop: bool) -> None:
    loops = []

    def answer(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        loops.append(type(asyncio.get_running_loop()).__module__)
        item = {"id": "m", "type": "message", "role": "assistant", "status": "completed"}
        return {"output": [{**item, "content": [{"type": "output_text", "text": "ok", "annotations": []}]}]}

    with RoutingProxy(use_uvloop=use_uvloop) as proxy:
        route = proxy.open_route(Endpoint(base_url="http://unused:1/v1", model="m"), upstream=FunctionUpstream(answer))
        await _post(proxy, _body(route.key))
    assert loops and loops[0].startswith("uvloop") is use_uvloop


async def test_proxy_shutdown_grace_bounds_how_long_stop_waits_for_requests_in_flight() -> None:
    def stop_seconds(grace: float) -> float:
        proxy = RoutingProxy(shutdown_grace=grace).start()
        # A request whose body is still arriving: its handler is in flight when the proxy stops.
        with socket.create_connection(("127.0.0.1", proxy.port)) as slow:
            slow.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: 100\r\n\r\n{")  # fmt: skip
            time.sleep(0.2)
            started = time.monotonic()
            proxy.stop(10)
            return time.monotonic() - started

    quick, patient = stop_seconds(0.1), stop_seconds(2.0)
    assert quick < 1.0 and patient >= 1.5, (quick, patient)


async def test_proxy_context_overflow_as_incomplete_decides_what_an_overflow_is(fake: FakeUpstream) -> None:
    overflow = FakeReply.error(400, "This model's maximum context length is 4096 tokens. However, ...")
    outcomes = []
    for as_incomplete in (True, False):
        fake.script(overflow)
        with RoutingProxy(ProxyConfig(context_overflow_as_incomplete=as_incomplete)) as proxy:
            route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))
            status, _ = await _post(proxy, _body(route.key))
            outcomes.append((status, route.error is None))
    assert outcomes == [(200, True), (STATUS_UPSTREAM_FAILED, False)]


async def test_proxy_record_requests_decides_whether_calls_keep_the_conversation(fake: FakeUpstream) -> None:
    kept = []
    for record in (True, False):
        with RoutingProxy(ProxyConfig(record_requests=record)) as proxy:
            route = proxy.open_route(Endpoint(base_url=fake.base_url, model="m"))
            await _post(proxy, _body(route.key))
            kept.append("input" in route.calls[0].request)
    assert kept == [True, False]


async def test_routing_proxy_upstreams_replace_the_upstream_of_an_api(fake: FakeUpstream) -> None:
    def answer(endpoint: Endpoint, body: dict[str, Any]) -> dict[str, Any]:
        item = {"id": "m", "type": "message", "role": "assistant", "status": "completed"}
        return {"output": [{**item, "content": [{"type": "output_text", "text": "from-function", "annotations": []}]}]}

    with RoutingProxy(upstreams={"chat": FunctionUpstream(answer)}) as proxy:
        chat = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="chat"))
        responses = proxy.open_route(Endpoint(base_url=fake.base_url, model="m", api="responses"))
        _, chat_reply = await _post(proxy, _body(chat.key))
        await _post(proxy, _body(responses.key))
    assert chat_reply["output"][-1]["content"][0]["text"] == "from-function"
    assert [r.path for r in fake.requests] == ["/v1/responses"]


async def test_function_upstream_chat_answers_a_judge_s_chat_calls() -> None:
    endpoint = Endpoint(base_url="http://unused:1/v1", model="judge")
    reply = {"choices": [{"message": {"role": "assistant", "content": "verdict"}}]}
    with_chat = FunctionUpstream(lambda e, b: {}, chat=lambda e, b: reply)
    async with aiohttp.ClientSession() as session:
        answered = await with_chat.pass_chat(session, endpoint, {"messages": []})
        with pytest.raises(UpstreamError, match="chat=handler"):
            await FunctionUpstream(lambda e, b: {}).pass_chat(session, endpoint, {"messages": []})
    assert answered.response == reply


# -- load_environment and NeMoGymHarness options that act before any stack -------------------------


def test_load_environment_arguments_shape_the_tasks_and_reach_the_harness(tmp_path: Path) -> None:
    env = load_environment(ENV, num_examples=3, rollouts_per_example=2, timeout=7.0, max_steps=4)
    tasks = list(env.taskset)
    assert [(t.task_index, t.rollout_index) for t in tasks] == [(i, r) for i in range(3) for r in range(2)]
    assert env.harness.timeout == 7.0 and env.harness.options.max_steps == 4

    shuffled = [t.example_id for t in load_environment(ENV, shuffle=True, seed=3).taskset]
    other_seed = [t.example_id for t in load_environment(ENV, shuffle=True, seed=4).taskset]
    plain = [t.example_id for t in load_environment(ENV).taskset]
    assert sorted(shuffled) == sorted(plain) and len({tuple(shuffled), tuple(other_seed), tuple(plain)}) == 3

    recorded = list(load_environment(ENV, recorded=True).taskset)
    assert recorded and all(t.recorded and t.recorded_reward is not None for t in recorded)
    assert not any(t.recorded for t in tasks)

    rows = tmp_path / "rows.jsonl"
    first = next(line for line in (Path(tasks[0].source.rsplit(":", 1)[0])).read_text().splitlines() if line.strip())
    rows.write_text(first + "\n")
    assert len(list(load_environment(ENV, jsonl_path=rows).taskset)) == 1
    assert load_environment("example_single_tool_call").taskset.env_name == "example_single_tool_call"


def test_dataset_picks_another_dataset_of_the_environment() -> None:
    from verifiers_nemo import NeMoGymTaskset

    other = "example_with_template_metadata"
    assert NeMoGymTaskset("mcqa").path.name == "example.jsonl"
    assert NeMoGymTaskset("mcqa", dataset=other).path.name == f"{other}.jsonl"
    assert load_environment("mcqa", dataset=other).taskset.path.name == f"{other}.jsonl"


def _stack_config(harness: NeMoGymHarness) -> Any:
    """The StackConfig the harness's start would launch (its plan, nothing started)."""
    paths = harness.options.env_config_paths(ENV)
    return harness.options.stack_config(ENV, paths, paths, (), "http://127.0.0.1:1/v1", frozenset())


def test_isolated_venvs_reaches_the_stack_the_harness_launches() -> None:
    assert not _stack_config(NeMoGymHarness(ENV)).isolated_venvs
    assert _stack_config(NeMoGymHarness(ENV, isolated_venvs=True)).isolated_venvs


async def test_death_grace_is_how_long_a_harness_waits_before_probing_a_stack() -> None:
    from tests.unit.test_stack_death_check import FakeStack

    harness = NeMoGymHarness(ENV, death_grace=0.3)
    started = time.monotonic()
    assert not await harness.agents.died(FakeStack(dies_after=None, probe_alive=True), 1)  # type: ignore[arg-type]
    assert 0.3 <= time.monotonic() - started < 1.5  # the default grace is 2 s


def test_shared_ray_false_makes_the_stack_start_its_own_ray() -> None:
    from verifiers_nemo._stack.plan import joins_shared_ray

    assert joins_shared_ray(_stack_config(NeMoGymHarness(ENV)))
    assert not joins_shared_ray(_stack_config(NeMoGymHarness(ENV, shared_ray=False)))


def test_judge_flags_are_the_judges_the_run_s_harness_sends_calls_to(monkeypatch: pytest.MonkeyPatch) -> None:
    from verifiers_nemo._cli import new_settings
    from verifiers_nemo._eval import Evaluation

    monkeypatch.setenv("VN_JUDGE_KEY", "sk-judge")
    argv = ["eval", "simpleqa", "-b", "http://127.0.0.1:1/v1", "-m", "m", "-n", "1"]
    argv += ["--judge-base-url", "http://127.0.0.1:8001/v1", "--judge-model", "J", "--judge-api", "chat"]
    argv += ["--judge-api-key-var", "VN_JUDGE_KEY", "--judge", "genrm_model=http://127.0.0.1:8002/v1,Q"]
    evaluation = Evaluation(new_settings(build_parser().parse_args(argv)))
    evaluation.load()
    judges = evaluation.harness.judges.endpoints

    assert judges.default is not None and judges.default.base_url == "http://127.0.0.1:8001/v1"
    assert (judges.default.model, judges.default.api, judges.default.api_key) == ("J", "chat", "sk-judge")
    named = judges.for_name("genrm_model")
    assert named is not None and (named.base_url, named.model) == ("http://127.0.0.1:8002/v1", "Q")
