"""Run one Python block of README.md as a user runs it in ``python -m asyncio`` or a notebook: top-level
``await`` / ``async with`` / ``async for`` allowed, a fresh ``__main__`` namespace. The block is read from stdin.

Afterwards, when the block left a ``result`` (a ``RolloutResult``), one line ``README-RESULT {json}`` says
what it holds, for tests/e2e/test_readme.py to check.

Imported, ``readme_block`` finds a block and ``run_here`` runs it the same way in a test's own event loop, where
what the block starts can share what the test has running (a Gym stack of the same environment and settings).
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

README = Path(__file__).resolve().parents[2] / "README.md"


async def _run(source: str, namespace: dict[str, Any]) -> None:
    code = compile(source, "README.md", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    awaitable = eval(code, namespace)  # a coroutine when the block awaits at top level
    if awaitable is not None:
        await awaitable


def readme_block(containing: str) -> str:
    """The code of the one Python block of README.md that holds ``containing``."""
    from pytest_codeblocks import extract_from_file

    [block] = [b for b in extract_from_file(README) if b.syntax == "python" and containing in b.code]
    return block.code


async def run_here(source: str) -> dict[str, Any]:
    """Run a block in the running event loop, in a fresh ``__main__`` namespace; the namespace it leaves."""
    namespace: dict[str, Any] = {"__name__": "__main__"}
    await _run(source, namespace)
    return namespace


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
