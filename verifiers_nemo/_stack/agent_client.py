"""``GymAgentClient``: how a row reaches a Gym agent's ``/run`` and its answer comes back, across stack deaths.

One aiohttp session per event loop (a harness may be used from several), at most ``connections`` per
agent. When the agent does not answer (the connection is refused or dropped) the client asks the stack
whether it died; if so it waits for the restart and resubmits the row once, on a fresh attempt (a new
route: a retry never shares a trace with a dead attempt).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

import aiohttp

from .._exceptions import ConfigurationError, GymAgentError, GymServerDown, InvalidResult
from .._result import is_retryable_failure
from .episodes import episode_record, episode_request
from .stack import GymStack

DEATH_GRACE_S = 2.0
"""How long a request in flight when its stack died may take to fail by itself, and how long a caller
whose request was not answered waits for the monitor's verdict before probing the servers itself."""
AGENT_CONNECTIONS = 1024
"""Connections to one Gym agent at most (Gym's own client default per host). Rollouts beyond it wait,
route open, as in ng_collect_rollouts; without a cap, thousands of connects at once overflow the agent's
listen queue (uvicorn's backlog is 2,048) and the kernel drops them."""


class Attempt(Protocol):
    """One try at a rollout: the body to post, and how to give up its route."""

    body: dict[str, Any]

    def abandon(self) -> None: ...


class Attempts(Protocol):
    """The tries of one rollout: a fresh one each ``new()``, Gym's episode attempt index beside them."""

    episode_attempt: int

    def new(self) -> Attempt: ...


EPISODE_ATTEMPTS = 3
"""Tries of an episode Gym failed without calling it terminal: Gym's own cap (``NEMO_GYM_MAX_ROLLOUT_ATTEMPTS``'s
default), which its collector spends across resumed runs and this client within the rollout."""


class GymAgentClient:
    """Posts rows to the Gym agents of one stack (or to ``agent_urls`` given per agent name)."""

    def __init__(
        self,
        *,
        agent_urls: Mapping[str, str] | None = None,
        death_grace: float = DEATH_GRACE_S,
        connections: int = AGENT_CONNECTIONS,
    ) -> None:
        self.agent_urls = {name: url.rstrip("/") for name, url in (agent_urls or {}).items()}
        self.death_grace = death_grace
        self.connections = connections
        self._sessions: dict[asyncio.AbstractEventLoop, aiohttp.ClientSession] = {}

    @property
    def session_loops(self) -> tuple[asyncio.AbstractEventLoop, ...]:
        """The event loops this client holds a session on."""
        return tuple(self._sessions)

    async def run(
        self,
        running_stack: Callable[[], Awaitable[GymStack]],
        agent: str | None,
        new_attempt: Callable[[], Attempt],
    ) -> dict[str, Any]:
        """POST a fresh attempt's body to ``agent``'s ``/run``; resubmit once if the stack died undelivered."""
        for attempt_number in range(2):
            stack = await running_stack()
            generation = stack.generation
            try:
                given = self.agent_urls.get(agent or "")
                url = f"{given}/run" if given else stack.run_url(agent)
                taskset = None if given else stack.episode_taskset(agent)
            except ConfigurationError as exc:
                raise GymAgentError(str(exc)) from None
            attempt = new_attempt()
            try:
                if taskset is None:
                    return await self._post_run(url, attempt.body, stack, generation)
                answer = await self._post_run(url, episode_request(attempt.body, taskset), stack, generation)
                return episode_record(answer)
            except _NotDelivered as exc:
                attempt.abandon()
                if attempt_number == 1 or not await self.died(stack, generation):
                    raise GymServerDown(f"the Gym agent at {url} is unreachable: {exc}") from None
        raise AssertionError("unreachable")

    async def run_episode(
        self, running_stack: Callable[[], Awaitable[GymStack]], agent: str | None, attempts: Attempts
    ) -> dict[str, Any]:
        """``run`` the rollout; while Gym answers with a failure it did not mark terminal, run it again (a fresh
        route, the next ``_ng_attempt_index``), ``EPISODE_ATTEMPTS`` tries in all. The last answer is returned."""
        while True:
            answer = await self.run(running_stack, agent, attempts.new)
            if attempts.episode_attempt + 1 >= EPISODE_ATTEMPTS or not is_retryable_failure(answer):
                return answer
            attempts.episode_attempt += 1

    async def died(self, stack: GymStack, generation: int) -> bool:
        """Whether ``generation`` died, for a caller whose request the agent did not answer.

        The monitor sees a process exit within milliseconds, but the client can see the broken
        connection first (the kernel resets a dead process's sockets as it exits): wait up to
        ``death_grace`` for the monitor's verdict, then probe the servers ourselves."""
        death = stack.death_future(generation)  # shared by every rollout of the generation: never cancelled
        await asyncio.wait({death}, timeout=self.death_grace)
        if death.done():
            return True
        return not await asyncio.to_thread(stack.probe_now, generation)

    async def _post_run(self, url: str, body: dict[str, Any], stack: GymStack, generation: int) -> dict[str, Any]:
        death = stack.death_future(generation)
        request = asyncio.ensure_future(self._session().post(url, json=body))
        try:
            await asyncio.wait({request, death}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                # Deaths are seen from process exit within milliseconds, often before this request
                # fails. A request to a dead process fails at once (the kernel closed its sockets):
                # wait for that, so a /run that never reached the agent is resubmitted after the restart.
                await asyncio.wait({request}, timeout=self.death_grace)
            if not request.done():
                raise GymServerDown(f"the Gym stack died during the rollout: {death.result()}")
            try:
                response = request.result()
            except aiohttp.ClientConnectorError as exc:
                raise _NotDelivered(repr(exc)) from exc
            except aiohttp.ClientConnectionError as exc:
                raise _NotDelivered(repr(exc)) from exc
            async with response:
                try:
                    text = await response.text()
                except aiohttp.ClientError as exc:  # the connection broke mid-answer: as if never answered
                    raise _NotDelivered(repr(exc)) from exc
                if response.status != 200:
                    if stack.is_dead(generation):
                        raise GymServerDown(f"the Gym stack died during the rollout: {stack.dead_reason}")
                    where = await asyncio.to_thread(stack.last_server_error)
                    if where:  # the failing server's own error first: its file and line, what went wrong
                        raise GymAgentError(
                            f"Gym agent answered {response.status}; {clip(where, 400)} (agent: {clip(text, 300)})"
                        )
                    raise GymAgentError(f"Gym agent answered {response.status}: {clip(text)}")
                try:
                    return await asyncio.to_thread(json.loads, text) if len(text) > 1 << 20 else json.loads(text)
                except ValueError as exc:
                    raise InvalidResult(f"Gym agent answered invalid JSON: {text[:500]!r}") from exc
        finally:
            if not request.done():
                request.cancel()

    def _session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        session = self._sessions.get(loop)
        if session is None or session.closed:
            session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0, limit_per_host=self.connections, force_close=False),
                timeout=aiohttp.ClientTimeout(total=None),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
            self._sessions[loop] = session
        return session

    async def close_session(self) -> None:
        """Close the session of the running event loop (before that loop ends)."""
        session = self._sessions.pop(asyncio.get_running_loop(), None)
        if session is not None:
            await session.close()

    def close(self) -> None:
        """Close every session whose loop can still close it (idempotent)."""
        sessions, self._sessions = self._sessions, {}
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        for loop, session in sessions.items():
            if session.closed or loop.is_closed():
                continue
            if running is loop:
                loop.create_task(session.close())
            elif not loop.is_running():
                loop.run_until_complete(session.close())


class _NotDelivered(Exception):
    """The agent did not answer the request: the connection was refused, or it broke."""


def clip(text: str, limit: int = 600) -> str:
    """``text`` shortened to about ``limit`` characters, its start and end kept."""
    return text if len(text) <= limit else f"{text[: limit // 2]} ... {text[-limit // 2 :]}"
