"""The multi-node test's stand-in for the README's vLLM: an environment's recordings served as a model (the replay
server's app) on ``HOST:PORT``, an address inside the test's network namespaces. Each policy call's caller address
is appended to ``CALLS`` (one line each, as it arrives); calls from ``HOLD`` are held, never answered, so the rollouts
of the node at that address are still running whenever the test kills it. ``READY`` is written once it listens. Runs
until SIGTERM/SIGINT.

    python held_replay.py ENV HOST PORT CALLS HOLD READY
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from aiohttp import web

from verifiers_nemo import NeMoGymTaskset, ReplayServer


def main() -> None:
    env, host, port, calls, hold, ready = sys.argv[1:7]

    @web.middleware
    async def record_and_hold(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.path.endswith("/responses"):
            with open(calls, "a") as log:
                log.write(f"{request.remote}\n")
            if request.remote == hold:
                await asyncio.Event().wait()  # held until the node that asked is gone
        return await handler(request)

    app = ReplayServer.from_tasks(NeMoGymTaskset(env, recorded=True)).build_app()
    app.middlewares.append(record_and_hold)
    listening = lambda _: Path(ready).write_text("listening")  # noqa: E731 - run_app says it once sites are up
    web.run_app(app, host=host, port=int(port), print=listening, handle_signals=True, shutdown_timeout=1)


if __name__ == "__main__":
    main()
