"""How a rollout whose /run the agent did not answer decides that the stack died (and so resubmits once
after the restart) — with fakes for the stack; the real SIGKILL case is tests/faults/test_stack_faults.py."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path

import pytest
from aiohttp import web

from tests.e2e.policies import LocalServer
from verifiers_nemo import GymServerDown
from verifiers_nemo._gym.config import ServerInstance
from verifiers_nemo._stack import GymStack, Launch, StackConfig
from verifiers_nemo._stack.agent_client import GymAgentClient
from verifiers_nemo._stack.deaths import Deaths

CONFIG = """\
tiny_agent:
  responses_api_agents:
    simple_agent:
      entrypoint: app.py
"""


class FakeStack:
    """A stack whose monitor reports a death after ``dies_after`` seconds (never if None) and whose own
    probe answers ``probe_alive``."""

    generation = 1

    def __init__(self, *, dies_after: float | None, probe_alive: bool) -> None:
        self.deaths = Deaths()
        self.deaths.begin(1)
        self.dies_after, self.probe_alive, self.probes = dies_after, probe_alive, 0

    def death_future(self, generation: int) -> asyncio.Future[str]:
        future = self.deaths.future(generation)
        if self.dies_after is not None:
            asyncio.get_running_loop().call_later(self.dies_after, self.deaths.die, generation, "agent exited")
        return future

    def probe_now(self, generation: int) -> bool:
        self.probes += 1
        return self.probe_alive


async def test_the_monitors_verdict_wins_over_a_probe_that_still_sees_the_dying_agent() -> None:
    stack = FakeStack(dies_after=0.05, probe_alive=True)
    assert await GymAgentClient().died(stack, 1)  # type: ignore[arg-type]
    assert stack.probes == 0


async def test_a_live_stack_that_dropped_a_request_is_not_called_dead() -> None:
    stack = FakeStack(dies_after=None, probe_alive=True)
    started = time.monotonic()
    assert not await GymAgentClient(death_grace=0.1).died(stack, 1)  # type: ignore[arg-type]
    assert stack.probes == 1 and time.monotonic() - started >= 0.1


async def test_a_probe_finding_a_server_gone_calls_the_stack_dead() -> None:
    client = GymAgentClient(death_grace=0.1)
    assert await client.died(FakeStack(dies_after=None, probe_alive=False), 1)  # type: ignore[arg-type]


class _Alive:
    pid = 0

    def poll(self) -> None:
        return None


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _starting_stack(tmp_path: Path) -> tuple[GymStack, Launch]:
    (tmp_path / "tiny.yaml").write_text(CONFIG)
    stack = GymStack(StackConfig("tiny", (tmp_path / "tiny.yaml",), "http://127.0.0.1:4321"))
    instance = ServerInstance("tiny_agent", "responses_api_agents", "simple_agent", {})
    launch = Launch(
        generation=1,
        supervisor=_Alive(),  # type: ignore[arg-type]
        run_dir=tmp_path / "run",
        log_path=tmp_path / "run" / "ng_run.log",
        head_port=_unused_port(),
        servers={"tiny_agent": (instance, _unused_port())},  # nothing listens there yet
        started_at=time.monotonic(),
    )
    stack.begin_generation(launch)  # what start() has done before waiting for readiness
    return stack, launch


def test_a_generation_still_starting_is_not_handed_out_nor_probed_dead(tmp_path: Path) -> None:
    stack, launch = _starting_stack(tmp_path)
    assert not stack.running  # a rollout asking now waits for start() instead of posting to a closed port
    assert not stack.probe_now(1) and not stack.is_dead(1)  # a probe does not kill the start
    launch.ready = True
    assert stack.running
    assert not stack.probe_now(1) and stack.is_dead(1)  # ready, yet its agent refuses: dead
    assert "refused connections" in (stack.dead_reason or "")


class _BreaksMidAnswer(LocalServer):
    """A Gym agent whose /run answer stops after its headers and a few bytes (the process died mid-write)."""

    async def _run(self, request: web.Request) -> web.StreamResponse:
        answer = web.StreamResponse(status=200, headers={"Content-Length": "1000"})
        await answer.prepare(request)
        await answer.write(b'{"reward": ')
        assert request.transport is not None
        request.transport.close()
        return answer

    def add_routes(self, app: web.Application) -> None:
        app.router.add_post("/run", self._run)


class _Attempt:
    body: dict = {"responses_create_params": {"input": "hi"}}
    abandoned = 0

    def abandon(self) -> None:
        self.abandoned += 1


async def test_an_answer_cut_off_mid_body_is_a_typed_failure_not_an_exception() -> None:
    """The agent's connection breaking after its headers is an unanswered /run like any other: the stack is
    asked whether it died (here it lives) and the rollout fails typed, its route given up."""
    stack = FakeStack(dies_after=None, probe_alive=True)

    async def running_stack() -> FakeStack:
        return stack

    async with _BreaksMidAnswer() as agent:
        client = GymAgentClient(agent_urls={"a": f"http://127.0.0.1:{agent.port}"}, death_grace=0.1)
        attempt = _Attempt()
        with pytest.raises(GymServerDown, match="unreachable"):
            await client.run(running_stack, "a", lambda: attempt)  # type: ignore[arg-type]
        await client.close_session()
    assert attempt.abandoned == 1 and stack.probes == 1
