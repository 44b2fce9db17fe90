"""A run's own saved results read back as recordings: ``verifiers-nemo eval --save-trace`` keeps each rollout's
``gym_result``, the Gym agent's own reply (what Gym's rollout collection writes: ``responses_create_params``, the whole
``response``, ``reward`` and what of the row's fields its server echoes), and ``row_fields``, all of the row's own
fields (so a replay gets back the row it ran on, even where rows share their prompt). A saved run then replays like
``data/example_rollouts.jsonl`` or ``ng_collect_rollouts`` output. A result saved before it kept ``gym_result`` is
rebuilt from its policy calls when they were Responses requests (the Gym agent's own)."""

from __future__ import annotations

from typing import Any

from .validation import RowError

_OURS = ("task_index", "rollout_index", "completion")
"""Keys every result row of ours has, and no Gym row."""


def as_recording(row: Any) -> Any:
    """``row`` as a Gym recording when it is a result row of ours (else as it is); a RowError with the fix when it
    cannot be one (saved without its trace, or a rollout that failed)."""
    if not isinstance(row, dict) or "responses_create_params" in row or not all(k in row for k in _OURS):
        return row
    if row.get("error") or row.get("reward") is None:
        raise RowError(
            "a saved rollout that failed or has no reward is no recording",
            "replay the rollouts that were scored (drop this line, or filter on error == null)",
        )
    agent_ref = {"agent_ref": {"type": "responses_api_agents", "name": row["agent"]}} if row.get("agent") else {}
    gym = row.get("gym_result")
    own = row.get("row_fields") if isinstance(row.get("row_fields"), dict) else {}  # the row it ran on
    if isinstance(gym, dict) and isinstance(gym.get("responses_create_params"), dict) and "response" in gym:
        return {**gym, **own, "reward": row["reward"], **agent_ref}
    calls = [c for c in row.get("trace") or () if isinstance(c, dict) and c.get("request") and c.get("response")]
    if calls and "input" not in calls[0]["request"]:
        raise RowError(
            "a saved result whose policy calls are Chat Completions requests (--api chat), saved without gym_result",
            "save the runs you mean to replay with this release's --save-trace (it keeps gym_result, any --api)",
        )
    if not calls:
        raise RowError(
            "a saved result without its policy calls (the run was saved without --save-trace)",
            "save the runs you mean to replay with --save-trace (their results then carry what the model answered)",
        )
    first, last = calls[0]["request"], calls[-1]
    params = {k: v for k, v in first.items() if k != "model" and v is not None}
    opening = first.get("input")
    said_before = 1 if isinstance(opening, str) else len(opening or ())
    later = last["request"].get("input")
    output = [*(later[said_before:] if isinstance(later, list) else ()), *(last["response"].get("output") or ())]
    recording: dict[str, Any] = {
        "responses_create_params": params,
        "response": {**last["response"], "output": output},
        "reward": row["reward"],
    }
    return own | recording | agent_ref
