"""How GymStack tells rollouts and itself that it died, without a real Gym stack.

The launch is faked (a sleeping process stands in for ng_run's supervisor, plain sockets for the servers), so
these tests pin the rules: one death future per (generation, loop) resolved from any thread, a stale generation
is dead at once, and the monitor strikes only a server that refuses connections, never a slow one.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo._stack import procs as _procs
from verifiers_nemo._stack import stack as _stack
from verifiers_nemo._gym.config import ServerInstance
from verifiers_nemo._stack.procs import port_state
from verifiers_nemo._stack.stack import GymStack, StackConfig, _Launch

CONFIG = """\
tiny_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
      model_server:
        type: responses_api_models
        name: policy_model
"""


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


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[GymStack]:
    path = tmp_path / "tiny.yaml"
    path.write_text(CONFIG)
    stack = GymStack(StackConfig("tiny", (path,), "http://127.0.0.1:9"))
    yield stack
    launch = stack._launch
    if launch is not None and launch.supervisor.poll() is None:
        launch.supervisor.kill()
        launch.supervisor.wait()


def _fake_launch(stack: GymStack, tmp_path: Path, ports: dict[str, int]) -> _Launch:
    # like the real supervisor, it exits when its stdin (the owner's pipe) closes
    supervisor = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)
    instance = ServerInstance("tiny_agent", "responses_api_agents", "simple_agent", {})
    stack._generation += 1
    stack._launch = _Launch(
        generation=stack._generation,
        supervisor=supervisor,
        run_dir=tmp_path / "run",
        log_path=tmp_path / "run" / "ng_run.log",
        head_port=_free_port(),
        servers={name: (instance, port) for name, port in ports.items()},
        started_at=time.monotonic(),
    )
    return stack._launch


def test_agent_url_comes_from_the_launch_table(stack: GymStack, tmp_path: Path) -> None:
    _fake_launch(stack, tmp_path, {"tiny_agent": 23456})
    assert stack.agent_url() == "http://127.0.0.1:23456"
    assert stack.agent_url("tiny_agent") == "http://127.0.0.1:23456"


async def test_death_future_is_shared_and_resolved_from_another_thread(stack: GymStack, tmp_path: Path) -> None:
    launch = _fake_launch(stack, tmp_path, {"tiny_agent": 23456})
    first = stack.death_future(launch.generation)
    assert stack.death_future(launch.generation) is first
    assert not first.done()
    threading.Thread(target=stack._mark_dead, args=(launch, "agent gone")).start()
    assert await asyncio.wait_for(first, 5) == "agent gone"


async def test_death_future_of_a_past_or_dead_generation_is_already_resolved(stack: GymStack, tmp_path: Path) -> None:
    launch = _fake_launch(stack, tmp_path, {"tiny_agent": 23456})
    stale = stack.death_future(launch.generation - 1)
    assert stale.done()
    stack._mark_dead(launch, "boom")
    assert stack.death_future(launch.generation).result() == "boom"


async def test_stopping_the_stack_resolves_its_death_futures(stack: GymStack, tmp_path: Path) -> None:
    launch = _fake_launch(stack, tmp_path, {"tiny_agent": 23456})
    waiting = stack.death_future(launch.generation)
    await asyncio.to_thread(stack.stop)
    assert "stopped" in await asyncio.wait_for(waiting, 5)


def test_port_state_tells_open_from_refused_from_timeout(
    listener: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert port_state("127.0.0.1", listener.getsockname()[1]) == "open"
    assert port_state("127.0.0.1", _free_port()) == "refused"

    def slow(*args: object, **kwargs: object) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(socket, "create_connection", slow)
    assert port_state("127.0.0.1", 1) == "timeout"


def test_monitor_never_strikes_a_server_that_is_only_slow(
    stack: GymStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch = _fake_launch(stack, tmp_path, {"tiny_agent": 23456})
    monkeypatch.setattr(_stack, "port_state", lambda host, port: "timeout")
    stop = threading.Event()
    watcher = threading.Thread(target=stack._watch, args=(launch, stop), daemon=True)
    watcher.start()
    time.sleep(1.8)  # three probes: a refused server would be struck out after two
    stop.set()
    watcher.join(2)
    assert not stack.is_dead(launch.generation)


def test_monitor_marks_a_refusing_server_dead(stack: GymStack, tmp_path: Path) -> None:
    launch = _fake_launch(stack, tmp_path, {"tiny_agent": _free_port()})
    deaths: list[tuple[int, str]] = []
    stack.on_death(lambda generation, reason: deaths.append((generation, reason)))
    stop = threading.Event()
    watcher = threading.Thread(target=stack._watch, args=(launch, stop), daemon=True)
    watcher.start()
    watcher.join(5)
    stop.set()
    assert stack.is_dead(launch.generation)
    assert deaths == [(launch.generation, deaths[0][1])] and "tiny_agent" in deaths[0][1]


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

    assert _stack.sweep_run_dirs(tmp_path) == [gone]  # at once: failure logs live elsewhere
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in (alive, foreign))


def test_logs_of_dead_owners_keep_only_the_newest(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    logs = tmp_path / "logs"
    old = [logs / f"env-{dead.pid}-{i:04x}" for i in range(_stack.KEEP_FAILED_LOGS + 3)]
    for age, path in enumerate(old):  # old[0] is the newest
        (path / "servers").mkdir(parents=True)
        os.utime(path, (time.time() - age * 60, time.time() - age * 60))
    head_log = logs / f"ray-head-{dead.pid}-ffff.log"
    head_log.write_text("old")
    os.utime(head_log, (time.time() - 3600 * 24, time.time() - 3600 * 24))
    mine = logs / f"env-{os.getpid()}-beef"
    mine.mkdir()
    os.utime(mine, (0, 0))  # the oldest of all, but its owner lives

    removed = _procs.sweep_dead_owners(logs, keep_newest=_stack.KEEP_FAILED_LOGS)

    assert sorted(removed) == sorted([*old[_stack.KEEP_FAILED_LOGS :], head_log])
    assert sorted(logs.iterdir()) == sorted([*old[: _stack.KEEP_FAILED_LOGS], mine])


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


def _failed_launch(stack: GymStack, tmp_path: Path, server_log: str | None) -> _Launch:
    launch = _fake_launch(stack, tmp_path, {"bigcodebench": _free_port()})
    launch.log_path = tmp_path / "logs" / "run" / "ng_run.log"
    (launch.log_path.parent / _stack.SERVER_LOGS).mkdir(parents=True)
    # ng_run's own log interleaves the server's unprefixed output with everything else
    launch.log_path.write_text(NG_RUN_LOG if server_log is None else server_log + NG_RUN_LOG)
    if server_log is not None:
        (launch.log_path.parent / _stack.SERVER_LOGS / "bigcodebench.log").write_text(server_log)
    return launch


def test_start_failure_summary_carries_the_crashed_servers_own_output(stack: GymStack, tmp_path: Path) -> None:
    summary = stack._failure_summary(_failed_launch(stack, tmp_path, BCB_SERVER_LOG))

    assert summary.startswith("Gym server bigcodebench exited while the stack started. Its last lines:\n")
    assert "pyenv: python3.10: command not found" in summary  # the cause
    assert "subprocess.CalledProcessError: Command" in summary  # what it led to
    assert "File " not in summary and "Traceback" not in summary  # frames stay in the full log
    assert "INFO worker.py" not in summary and "Connecting to Ray" not in summary  # routine chatter


def test_start_failure_summary_of_a_silent_server_says_it_printed_nothing(stack: GymStack, tmp_path: Path) -> None:
    summary = stack._failure_summary(_failed_launch(stack, tmp_path, ""))

    assert summary == "Gym server bigcodebench exited while the stack started, without any output of its own."
