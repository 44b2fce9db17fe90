"""Run one Python block of README.md as a user runs it in ``python -m asyncio`` or a notebook: top-level
``await`` / ``async with`` / ``async for`` allowed, a fresh ``__main__`` namespace. The block is read from stdin.

Afterwards, when the block left a ``result`` (a ``RolloutResult``), one line ``README-RESULT {json}`` says
what it holds, for tests/e2e/test_readme.py to check.
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from typing import Any


async def _run(source: str, namespace: dict[str, Any]) -> None:
    code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    awaitable = eval(code, namespace)  # a coroutine when the block awaits at top level
    if awaitable is not None:
        await awaitable


def main() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}
    asyncio.run(_run(sys.stdin.read(), namespace))
    result = namespace.get("result")
    if result is not None:
        trace = list(result.trace or [])
        summary = {
            "reward": result.reward,
            "error": None if result.error is None else str(result.error),
            "calls": len(trace),
            "token_ids": bool(trace) and all(call.completion_token_ids for call in trace),
        }
        print("README-RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
