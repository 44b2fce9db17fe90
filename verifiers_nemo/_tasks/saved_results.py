"""A run's own saved results read back as recordings: ``verifiers-nemo eval --save-trace`` keeps each rollout's
policy calls (the Responses request the Gym agent sent and the reply it got), from which the rollout is rebuilt as
Gym's rollout collection writes one (``responses_create_params``, the whole ``response.output``, ``reward``), so a
saved run replays like ``data/example_rollouts.jsonl`` or ``ng_collect_rollouts`` output."""

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
    calls = [c for c in row.get("trace") or () if isinstance(c, dict) and c.get("request") and c.get("response")]
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
    if row.get("agent"):
        recording["agent_ref"] = {"type": "responses_api_agents", "name": row["agent"]}
    return recording
