"""Token usage of Responses objects, summed (a rollout's policy calls, a judge's calls)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def sum_usage(usages: Iterable[dict[str, Any] | None]) -> dict[str, int]:
    """Responses ``usage`` objects summed: input, output, total, cached and reasoning tokens."""
    total = {"input_tokens": 0, "output_tokens": 0, "total_tokens": 0, "cached_tokens": 0, "reasoning_tokens": 0}
    for usage in usages:
        if not usage:
            continue
        total["input_tokens"] += int(usage.get("input_tokens") or 0)
        total["output_tokens"] += int(usage.get("output_tokens") or 0)
        total["total_tokens"] += int(usage.get("total_tokens") or 0)
        total["cached_tokens"] += int((usage.get("input_tokens_details") or {}).get("cached_tokens") or 0)
        total["reasoning_tokens"] += int((usage.get("output_tokens_details") or {}).get("reasoning_tokens") or 0)
    return total


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """``usage`` in Responses words: a Chat Completions ``usage`` (prompt/completion tokens) translated."""
    if not isinstance(usage, dict):
        return None
    if "input_tokens" in usage or "prompt_tokens" not in usage:
        return usage
    return {
        "input_tokens": usage.get("prompt_tokens") or 0,
        "output_tokens": usage.get("completion_tokens") or 0,
        "total_tokens": usage.get("total_tokens") or 0,
    }
