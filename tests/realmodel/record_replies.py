"""Record the real server's replies that ``tests/unit/test_exact_tokens.py`` replays (run by hand, server up):

    .venv/bin/python -m tests.realmodel.record_replies http://127.0.0.1:PORT

Writes ``tests/realmodel/replies/exact_session.json``: every request ``ExactTokensUpstream`` sent during a
two-turn ``get_weather`` rollout (``tool_choice: required``, seed 2, 80 tokens) and the server's reply, in order
(parsed JSON); and ``not_found_404.json``, what the server answers on a route it does not have.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp

from verifiers_nemo._upstreams.exact_tokens import ExactTokensUpstream

from .rollouts import TASKS, RecordingProxy, tool_rollout

REPLIES = Path(__file__).resolve().parent / "replies"


async def record(root: str) -> None:
    async with aiohttp.ClientSession() as session, RecordingProxy(root, session) as proxy:
        calls = await tool_rollout(ExactTokensUpstream(), session, proxy.endpoint("smol"), TASKS["weather"](80, 2), 2)
        if len(calls) != 2:
            raise SystemExit("the recorded rollout needs two turns")
        async with session.post(root + "/v1/chat/completions/no-such-route", json={}) as reply:
            not_found = await reply.read()
    REPLIES.mkdir(exist_ok=True)
    (REPLIES / "not_found_404.json").write_bytes(not_found)
    exchanges = [{k: v for k, v in e.items() if k != "seconds"} for e in proxy.exchanges]
    (REPLIES / "exact_session.json").write_text(json.dumps(exchanges) + "\n")
    print(f"recorded {len(exchanges)} exchanges", file=sys.stderr)


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1].rstrip("/")))
