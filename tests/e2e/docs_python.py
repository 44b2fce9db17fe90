"""Run one Python block of the docs (README.md, docs/**/*.md) as a user runs it in ``python -m asyncio`` or a
notebook: top-level ``await`` / ``async with`` / ``async for`` allowed, a fresh ``__main__`` namespace. The block is
read from stdin.

Afterwards, when the block left a ``result`` (a ``RolloutResult``), one line ``DOCS-RESULT {json}`` says
what it holds, for tests/e2e/test_docs.py to check.

Imported, ``doc_block`` finds a block and ``run_here`` runs it the same way in a test's own event loop, where
what the block starts can share what the test has running (a Gym stack of the same environment and settings).
"""

from __future__ import annotations

import ast
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")))
"""Every page a user reads: the README and the docs site's pages."""


async def _run(source: str, namespace: dict[str, Any]) -> None:
    code = compile(source, "<docs block>", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    awaitable = eval(code, namespace)  # a coroutine when the block awaits at top level
    if awaitable is not None:
        await awaitable


def doc_block(containing: str) -> str:
    """The code of the one Python block of the docs that holds ``containing``."""
    from pytest_codeblocks import extract_from_file

    found = [b for page in DOCS for b in extract_from_file(page) if b.syntax == "python" and containing in b.code]
    [block] = found
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
        print("DOCS-RESULT " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main()
