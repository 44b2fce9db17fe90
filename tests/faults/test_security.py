"""Security on the real stack: loopback-only sockets, unguessable route keys, and an API key that
never leaves the proxy (a canary key searched for in every place a copy could end up)."""

from __future__ import annotations

import ast
import base64
import inspect
import json
import logging
import os
import re
import urllib.request
from collections import Counter
from pathlib import Path

import pytest

from tests.e2e.policies import PolicyServer, counter_policy
from tests.faults.helpers import (
    CANARY,
    CANARY_ENV_VAR,
    COUNTER_ENV,
    ListeningSocket,
    cmdline_of,
    environ_of,
    listening_sockets,
    listening_sockets_of,
    record_figures,
    socket_inodes,
    tagged_counter_rows,
)
from tests.unit.fake_upstream import FakeReply, FakeUpstream
from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset
from verifiers_nemo._routing import route_key as route_key_module

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="package")]

KEY_GENERATOR = re.compile(r"secrets\.(token_urlsafe|token_hex|token_bytes)\((\d+)\)")
RAY_SESSION_DIR = re.compile(r"(/[^\s=]*/session_\d{4}-\d\d-\d\d_[^/\s]+)")  # /tmp/ray/... or the shared head's


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _program(command: str) -> str:
    """A short name for a process: Ray's title (ray::X), its binary, or the Python script it runs."""
    words = command.split()
    if not words:
        return "?"
    if words[0].startswith("ray::"):
        return words[0]
    script = next((w for w in words[1:] if w.endswith(".py") or w.endswith("ng_run")), words[0])
    return script.rsplit("/", 1)[-1]


def _stack_sockets(harness: NeMoGymHarness) -> list[tuple[int, str, ListeningSocket]]:
    return listening_sockets_of(harness.stack.info().pids)  # the stack's and its Ray head's processes


async def test_gym_servers_and_the_proxy_listen_on_loopback_only(harness: NeMoGymHarness) -> None:
    info = harness.stack.info()
    gym_ports = {"head_server": _port(info.head_url)} | {name: _port(url) for name, url in info.server_urls.items()}
    sockets = _stack_sockets(harness)
    by_port = {sock.port: (pid, sock) for pid, _, sock in sockets}

    table = listening_sockets()
    proxy_sockets = [table[inode] for inode in socket_inodes(os.getpid()) if inode in table]
    proxy_bound = [s for s in proxy_sockets if s.port == harness.proxy.port]

    for name, port in gym_ports.items():
        assert port in by_port, f"{name} (port {port}) is not a listening socket of the stack's processes"
        assert by_port[port][1].loopback, f"{name} binds {by_port[port][1]}"
    assert proxy_bound and all(s.loopback for s in proxy_bound), proxy_bound
    record_figures(
        "sockets: Gym servers and proxy",
        gym_servers_checked=len(gym_ports),
        proxy_sockets=[str(s) for s in proxy_bound],
        non_loopback=sum(not by_port[p][1].loopback for p in gym_ports.values()),
    )


async def test_every_listening_socket_of_the_stack_including_rays_binds_loopback(harness: NeMoGymHarness) -> None:
    sockets = _stack_sockets(harness)
    exposed = [f"pid {pid} {command[:90]!r} on {sock}" for pid, command, sock in sockets if not sock.loopback]
    kinds = Counter("ray" if "ray" in command else "gym" for _, command, _ in sockets)
    record_figures(
        "sockets: every process of the stack (Ray included)",
        listening_sockets=len(sockets),
        by_kind=dict(kinds),
        non_loopback=len(exposed),
        exposed=exposed or "none",
        sockets=sorted(f"{_program(command)}@{sock}" for _, command, sock in sockets),
    )
    assert len(sockets) >= 4  # head server, resources server, agent, Ray's GCS at least
    assert exposed == []


async def test_route_keys_carry_at_least_128_bits_from_a_csprng(harness: NeMoGymHarness) -> None:
    endpoint = Endpoint(base_url="http://127.0.0.1:9/v1", model="m")
    routes = [harness.proxy.open_route(endpoint) for _ in range(10_000)]
    keys = [r.key for r in routes]
    for route in routes:
        route.close()

    raw = [base64.urlsafe_b64decode(k.removeprefix("vnr-") + "=" * (-len(k) % 4)) for k in keys]
    bits = {8 * len(r) for r in raw}
    ones = sum(bin(int.from_bytes(r)).count("1") for r in raw) / sum(8 * len(r) for r in raw)
    source = inspect.getsource(route_key_module.new_route_key)  # what RoutingProxy.open_route keys routes with
    generators = KEY_GENERATOR.findall(source)  # e.g. secrets.token_urlsafe(24): 24 random bytes
    module_imports = {
        alias.name
        for node in ast.walk(ast.parse(inspect.getsource(route_key_module)))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in node.names
    }
    record_figures(
        "route keys",
        keys=len(keys),
        unique=len(set(keys)),
        bits=sorted(bits),
        share_of_one_bits=round(ones, 4),
        generated_by=[f"secrets.{name}({size})" for name, size in generators],
    )
    assert len(set(keys)) == len(keys) == 10_000
    assert min(bits) >= 128
    assert 0.49 < ones < 0.51  # 1.9M bits: a fair source lands within +-0.1%
    assert len(generators) == 1 and "secrets" in module_imports  # the CSPRNG, not `random`
    assert 8 * int(generators[0][1]) >= 128
    assert harness.proxy.open_routes == 0


class CanarySearch:
    """Counts the places searched for the canary and where it was found."""

    def __init__(self, canary: str) -> None:
        self.needle = canary.encode()
        self.places = 0
        self.found: list[str] = []

    def text(self, where: str, data: bytes | str) -> None:
        self.places += 1
        if self.needle in (data.encode(errors="replace") if isinstance(data, str) else data):
            self.found.append(where)

    def tree(self, root: Path) -> None:
        for directory, _, files in os.walk(root):  # links (the server venvs) are not followed
            for name in files:
                path = Path(directory, name)
                if not path.is_symlink() and path.is_file():
                    self.text(str(path), path.read_bytes())


async def test_the_api_key_never_reaches_gym_configs_processes_logs_or_results(
    harness: NeMoGymHarness, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert os.environ[CANARY_ENV_VAR] == CANARY  # the key is in this process's environment too
    caplog.set_level(logging.DEBUG, logger="verifiers_nemo")
    expected = tagged_counter_rows(tmp_path / "tasks.jsonl", 6)
    tasks = list(NeMoGymTaskset(COUNTER_ENV, jsonl_path=tmp_path / "tasks.jsonl"))
    async with PolicyServer(counter_policy) as responses, FakeUpstream("chat") as chat, FakeUpstream("401") as refuses:
        # retried; the error message echoes the key. (Unscripted, a FakeUpstream would answer with the
        # Authorization header it received as the model's text.)
        chat.script(FakeReply.error(503, f"overloaded; key {CANARY} throttled"), FakeReply.say("done", times=100))
        refuses.script(FakeReply.error(401, f"Incorrect API key provided: {CANARY}", times=100))
        endpoints = [
            Endpoint(base_url=responses.base_url, model="m", api_key=CANARY),
            Endpoint(base_url=chat.base_url, model="m", api_key=CANARY, api="chat"),
            Endpoint(base_url=refuses.base_url, model="m", api_key=CANARY),
        ]
        results = [r async for r in harness.run(tasks, lambda t: endpoints[min(t.task_index, 4) // 2], concurrency=6)]
    by_index = {r.task_index: r for r in results}

    # the upstreams did get the key, so a clean search below means something
    assert responses.authorizations == {f"Bearer {CANARY}"}
    assert {r.authorization for r in [*chat.requests, *refuses.requests]} == {f"Bearer {CANARY}"}
    assert [by_index[i].reward for i in (0, 1)] == expected[:2]
    assert by_index[2].error is None and by_index[3].error is None
    assert max(c.attempts for i in (2, 3) for c in by_index[i].trace) == 2
    assert by_index[4].error is not None and by_index[4].error.type == "upstream_http"
    assert "***" in by_index[4].error.message  # the echoed key is redacted, the rest of the message kept

    search = CanarySearch(CANARY)
    launch = harness.stack.launch
    search.tree(launch.run_dir)  # Gym config files, ng_run.log with every server's output
    pids = harness.stack.info().pids  # the stack's and its Ray head's processes
    ray_dirs = set()
    for pid in pids:
        search.text(f"/proc/{pid}/environ", environ_of(pid))
        command = cmdline_of(pid)
        search.text(f"/proc/{pid}/cmdline", command)
        ray_dirs.update(RAY_SESSION_DIR.findall(command))
    assert ray_dirs, "no Ray session folder found on the processes' command lines"
    for ray_dir in ray_dirs:
        search.tree(Path(ray_dir))  # Ray's logs of this stack's processes
    with urllib.request.urlopen(harness.stack.info().head_url + "/global_config_dict_yaml", timeout=10) as reply:
        search.text("head server /global_config_dict_yaml", reply.read())
    for record in caplog.records:
        search.text(f"log record {record.name}:{record.lineno}", record.getMessage() + (record.exc_text or ""))
    for r in results:
        saved = json.dumps(r.to_dict(include_trace=True, include_gym_result=True), default=str)
        search.text(f"result {r.task_index} (trace and Gym result included)", saved)
        search.text(f"result {r.task_index} repr", repr(r))
        for call in r.trace:
            search.text(f"result {r.task_index} trace call {call.index}", json.dumps(call.to_dict(), default=str))
    search.text("endpoint repr", repr(endpoints))

    record_figures(
        "canary API key (harness)",
        places_checked=search.places,
        gym_processes=len(pids),
        ray_session_dirs=len(ray_dirs),
        log_records=len(caplog.records),
        leaks=len(search.found),
    )
    assert ray_dirs and len(pids) > 3 and caplog.records
    assert search.found == []
