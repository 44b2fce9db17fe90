"""How a Gym stack tells rollouts and itself that it died, without a real Gym stack.

Plain processes and sockets stand in for ng_run's supervisor and the servers, so these tests pin the rules:
one death future per (generation, loop) resolved from any thread, a stale generation is dead at once, a
server's death is seen from its process's exit at once, and the probe fallback strikes only a server that
refuses connections, never a slow one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo._gym.config import ServerInstance
from verifiers_nemo._stack import Launch
from verifiers_nemo._stack.deaths import Deaths
from verifiers_nemo._stack.logs import KEEP_FAILED_LOGS, SERVER_LOGS, failure_summary, sweep_run_dirs
from verifiers_nemo._stack.monitor import Monitor
from verifiers_nemo._stack.procs import port_state, sweep_dead_owners


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield sock
    sock.close()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(tmp_path: Path, ports: dict[str, int]) -> Launch:
    instance = ServerInstance("tiny_agent", "responses_api_agents", "simple_agent", {})
    return Launch(
        generation=1,
        supervisor=None,  # type: ignore[arg-type]  # not used by what these tests read
        run_dir=tmp_path / "run",
        log_path=tmp_path / "run" / "ng_run.log",
        head_port=_free_port(),
        servers={name: (instance, port) for name, port in ports.items()},
        started_at=time.monotonic(),
    )


def _watch(servers: dict[str, int], deaths: Deaths, generation: int = 1, **kwargs: object) -> Monitor:
    return Monitor(
        "tiny",
        processes={},
        servers=servers,
        sid=os.getsid(0),
        on_death=lambda reason: deaths.die(generation, reason),
        **kwargs,  # type: ignore[arg-type]
    )


def test_agent_url_comes_from_the_launch_table(tmp_path: Path) -> None:
    launch = _launch(tmp_path, {"tiny_agent": 23456})
    assert launch.agent_url(None, "tiny") == "http://127.0.0.1:23456"
    assert launch.agent_url("tiny_agent", "tiny") == "http://127.0.0.1:23456"


def test_a_rollout_goes_through_the_environment_server_that_relays_to_its_agent(tmp_path: Path) -> None:
    launch = _launch(tmp_path, {"tiny_agent": 23456})
    assert launch.run_url(None, "tiny") == "http://127.0.0.1:23456/run"  # nemo-gym 0.4: no environment server

    relay = ServerInstance(
        "tiny_environment_server",
        "environment_servers",
        "legacy_agent",
        {"agent_server": {"type": "responses_api_agents", "name": "tiny_agent"}},
    )
    other = ServerInstance(
        "user_sim", "environment_servers", "nemo_user_sim", {"assistant_agent": {"name": "tiny_agent"}}
    )
    launch.servers["user_sim"] = (other, 34567)  # runs no one agent's rollouts: not in front of it
    launch.servers["tiny_environment_server"] = (relay, 45678)
    assert launch.run_url(None, "tiny") == "http://127.0.0.1:45678/run"
    assert launch.episode_taskset(None, "tiny") is None  # a relay takes rows
    assert launch.agent_url(None, "tiny") == "http://127.0.0.1:23456"


def test_a_rollout_of_an_agent_behind_a_typed_environment_server_goes_there_as_an_episode(tmp_path: Path) -> None:
    launch = _launch(tmp_path, {"tiny_agent": 23456})
    refs = {"agent_server": {"type": "responses_api_agents", "name": "tiny_agent"}}
    refs["resources_server"] = {"type": "resources_servers", "name": "tiny_resources"}
    typed = ServerInstance("tiny_episodes", "environment_servers", "single_agent_turn", refs)
    launch.servers["tiny_episodes"] = (typed, 45679)
    assert launch.run_url(None, "tiny") == "http://127.0.0.1:45679/run"
    assert launch.episode_taskset(None, "tiny") == "tiny_resources"  # as Gym's legacy adapter names a row's task


async def test_death_future_is_shared_and_resolved_from_another_thread() -> None:
    deaths = Deaths()
    deaths.begin(1)
    first = deaths.future(1)
    assert deaths.future(1) is first
    assert not first.done()
    threading.Thread(target=deaths.die, args=(1, "agent gone")).start()
    assert await asyncio.wait_for(first, 5) == "agent gone"


async def test_death_future_of_a_past_or_dead_generation_is_already_resolved() -> None:
    deaths = Deaths()
    deaths.begin(2)
    stale = deaths.future(1)
    assert stale.done()
    deaths.die(2, "boom")
    assert deaths.future(2).result() == "boom"


async def test_stopping_the_stack_resolves_its_death_futures() -> None:
    deaths = Deaths()
    deaths.begin(1)
    waiting = deaths.future(1)
    await asyncio.to_thread(deaths.end, "the Gym stack was stopped")
    assert "stopped" in await asyncio.wait_for(waiting, 5)
    assert deaths.is_over(1) and not deaths.died


def test_a_server_is_dead_the_moment_its_process_exits(tmp_path: Path) -> None:
    port = _free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.create_server(('127.0.0.1',{port})); print(1,flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert server.stdout is not None and server.stdout.readline()  # listening
        deaths = Deaths()
        deaths.begin(1)
        died = threading.Event()
        deaths.on_death(lambda generation, reason: died.set())
        monitor = _watch({"tiny_agent": port}, deaths).start()
        assert monitor.watched_pids == 1 and monitor.probed == {}  # held by a pidfd, not probed
        server.kill()
        killed = time.monotonic()
        assert died.wait(5)
        assert time.monotonic() - killed < 0.5  # no probe interval, no strikes
        assert "tiny_agent" in (deaths.reason or "")
        monitor.stop()
    finally:
        server.kill()
        server.wait()


def test_a_watched_process_exit_is_its_reason() -> None:
    child = subprocess.Popen(["sleep", "60"])
    deaths = Deaths()
    deaths.begin(1)
    died = threading.Event()
    deaths.on_death(lambda generation, reason: died.set())
    monitor = Monitor(
        "tiny", processes={child.pid: "the launcher exited"}, servers={}, sid=None, on_death=lambda r: deaths.die(1, r)
    ).start()
    child.kill()
    assert died.wait(5) and deaths.reason == "the launcher exited"
    monitor.stop()
    child.wait()


def test_port_state_tells_open_from_refused_from_timeout(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert port_state("127.0.0.1", listener.getsockname()[1]) == "open"
    assert port_state("127.0.0.1", _free_port()) == "refused"

    def slow(*args: object, **kwargs: object) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", slow)
    assert port_state("127.0.0.1", 1) == "timeout"


def test_monitor_never_strikes_a_server_that_is_only_slow() -> None:
    deaths = Deaths()
    deaths.begin(1)
    probes: list[int] = []

    def slow(host: str, port: int) -> str:
        probes.append(port)
        return "timeout"

    monitor = _watch({"tiny_agent": 23456}, deaths, probe=slow).start()  # nothing to hold: probed
    time.sleep(1.8)  # three probes: a refused server would be struck out after two
    monitor.stop()
    assert len(probes) >= 3
    assert not deaths.is_over(1)


def test_monitor_marks_a_refusing_server_dead() -> None:
    deaths = Deaths()
    deaths.begin(1)
    seen: list[tuple[int, str]] = []
    deaths.on_death(lambda generation, reason: seen.append((generation, reason)))
    monitor = _watch({"tiny_agent": _free_port()}, deaths).start()
    assert monitor.probed  # nothing listens: no process to hold, the probe fallback watches it
    monitor.join(5)
    assert deaths.is_over(1)
    assert seen == [(1, seen[0][1])] and "tiny_agent" in seen[0][1]


def test_sweep_removes_run_folders_of_dead_owners_only(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    gone, alive, foreign = (
        tmp_path / f"env-{dead.pid}-aaaa",
        tmp_path / f"env-{os.getpid()}-cccc",
        tmp_path / "not-a-run",
    )
    for path in (gone, alive, foreign):
        (path / "responses_api_models").mkdir(parents=True)

    assert sweep_run_dirs(tmp_path) == [gone]  # at once: failure logs live elsewhere
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, foreign))


def test_logs_of_dead_owners_keep_only_the_newest(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    logs = tmp_path / "logs"
    old = [logs / f"env-{dead.pid}-{i:04x}" for i in range(KEEP_FAILED_LOGS + 3)]
    for age, path in enumerate(old):  # old[0] is the newest
        (path / "servers").mkdir(parents=True)
        os.utime(path, (time.time() - age * 60, time.time() - age * 60))
    head_log = logs / f"ray-head-{dead.pid}-ffff.log"
    head_log.write_text("old")
    os.utime(head_log, (time.time() - 3600 * 24, time.time() - 3600 * 24))
    mine = logs / f"env-{os.getpid()}-beef"
    mine.mkdir()
    os.utime(mine, (0, 0))  # the oldest of all, but its owner lives

    removed = sweep_dead_owners(logs, keep_newest=KEEP_FAILED_LOGS)

    assert sorted(removed) == sorted([*old[KEEP_FAILED_LOGS:], head_log])
    assert sorted(logs.iterdir()) == sorted([*old[:KEEP_FAILED_LOGS], mine])


BCB_SERVER_LOG = """\
Connecting to Ray cluster at specified address: 127.0.0.1:23216
2026-11-22 21:00:33,044\tINFO worker.py:1841 -- Connecting to existing Ray cluster at address: 127.0.0.1:23216...
error: Failed to inspect Python interpreter from search path at `/root/.pyenv/shims/python3.10`
  cause: Querying Python at `/root/.pyenv/shims/python3.10` failed with exit status exit status: 127

         [stderr]
         pyenv: python3.10: command not found
Traceback (most recent call last):
  File "resources_servers/bigcodebench/app.py", line 174, in <module>
    BigCodeBenchResourcesServer.run_webserver()
  File "/usr/lib/python3.12/subprocess.py", line 413, in check_call
    raise CalledProcessError(retcode, cmd)
subprocess.CalledProcessError: Command '['uv', 'venv', '--seed', '--python', '3.10']' returned non-zero exit status 2.
"""
NG_RUN_LOG = """\
(bigcodebench_simple_agent) INFO:     Started server process [4996]
2 / 3 servers ready. Waiting for servers to spin up: ['bigcodebench']
RuntimeError: Process `bigcodebench` finished unexpectedly!
(bigcodebench_simple_agent) INFO:     Shutting down
"""


def _failed_launch_log(tmp_path: Path, server_log: str | None) -> Path:
    log_path = tmp_path / "logs" / "run" / "ng_run.log"
    (log_path.parent / SERVER_LOGS).mkdir(parents=True)
    # ng_run's own log interleaves the server's unprefixed output with everything else
    log_path.write_text(NG_RUN_LOG if server_log is None else server_log + NG_RUN_LOG)
    if server_log is not None:
        (log_path.parent / SERVER_LOGS / "bigcodebench.log").write_text(server_log)
    return log_path


def test_start_failure_summary_carries_the_crashed_servers_own_output(tmp_path: Path) -> None:
    summary = failure_summary(_failed_launch_log(tmp_path, BCB_SERVER_LOG), "bigcodebench")

    assert summary.startswith("Gym server bigcodebench exited while the stack started. Its last lines:\n")
    assert "pyenv: python3.10: command not found" in summary  # the cause
    assert "subprocess.CalledProcessError: Command" in summary  # what it led to
    assert "File " not in summary and "Traceback" not in summary  # frames stay in the full log
    assert "INFO worker.py" not in summary and "Connecting to Ray" not in summary  # routine chatter


def test_start_failure_summary_of_a_silent_server_says_it_printed_nothing(tmp_path: Path) -> None:
    summary = failure_summary(_failed_launch_log(tmp_path, ""), "bigcodebench")

    assert summary == "Gym server bigcodebench exited while the stack started, without any output of its own."


def test_start_failure_summary_keeps_the_failing_frame_of_a_server_of_yours(tmp_path: Path) -> None:
    log = (
        "Traceback (most recent call last):\n"
        '  File "/home/me/project/resources_servers/mine/app.py", line 3, in <module>\n'
        "    import helper\n"
        '  File "/home/me/project/resources_servers/mine/helper.py", line 1, in <module>\n'
        "    import no_such_module\n"
        '  File "<frozen importlib._bootstrap>", line 1, in _find_and_load\n'
        "ModuleNotFoundError: No module named 'no_such_module'\n"
    )
    own = ("/home/me/project/resources_servers/mine/", "resources_servers/mine/")
    summary = failure_summary(_failed_launch_log(tmp_path, log), "bigcodebench", own)

    assert '  File "/home/me/project/resources_servers/mine/helper.py", line 1, in <module>' in summary
    assert "    import no_such_module" in summary and "ModuleNotFoundError" in summary
    assert "app.py" not in summary and "frozen" not in summary and "Traceback" not in summary
    assert "File " not in failure_summary(_failed_launch_log(tmp_path / "packaged", log), "bigcodebench")
