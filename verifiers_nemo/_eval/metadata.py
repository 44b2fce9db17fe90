"""A run's ``metadata.json``: settings (no secrets), counts, sessions and the summary of its records."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .stats import replay_agreement, summarize, timing_summary
from .token_ids import record_token_ids, summarize_token_ids

if TYPE_CHECKING:
    from .results import ResultsFolder
    from .settings import EvalSettings


def slim_record(record: Mapping[str, Any]) -> dict[str, Any]:
    """What the summary needs of a result record (a trace can be large: a line saved before records carried
    ``token_ids`` gets them from its trace)."""
    keep = (
        "task_index",
        "rollout_index",
        "env",
        "reward",
        "metrics",
        "usage",
        "timing",
        "error",
        "recorded_reward",
        "masked",
        "failure_kind",
        "failure_reason",
    )
    slim = {k: record[k] for k in keep if k in record}
    token_ids = record_token_ids(record)
    if token_ids is not None:
        slim["token_ids"] = token_ids
    return slim


def run_metadata(
    base: Mapping[str, Any],
    settings: EvalSettings,
    folder: ResultsFolder | None,
    expected: int,
    records: list[dict[str, Any]],
    sessions: list[dict[str, Any]],
) -> dict[str, Any]:
    """The ``metadata.json`` of a run: ``base`` (what was saved) updated with these records and sessions."""
    from .._replay import unreproducible_reason

    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    summary = summarize(
        records, rollouts_per_example=settings.rollouts_per_example, pass_threshold=settings.pass_threshold
    )
    current = sessions[-1] if sessions else {}
    summary["timing"] = timing_summary(sessions, current.get("wall_s") or 0.0)
    agreement = replay_agreement(records, known=lambda index: unreproducible_reason(*settings.origin(index)))
    if agreement is not None:
        summary["replay"] = agreement
    if len(settings.env_names) > 1:
        summary["by_env"] = {
            name: summarize(
                [r for r in records if r.get("env") == name],
                rollouts_per_example=settings.rollouts_per_example,
                pass_threshold=settings.pass_threshold,
            )
            for name in settings.env_names
        }
    judges = _judges_over(sessions)
    if judges:
        summary["judges"] = judges
    token_ids = summarize_token_ids(records, exact_tokens=settings.exact_tokens)
    if token_ids is not None:
        summary["token_ids"] = token_ids
    return {
        "run_id": folder.run_id if folder else None,
        "path": str(folder.path) if folder else None,
        "env": settings.nemo_env,
        "model": settings.model,
        "status": base.get("status"),
        "created_at": base.get("created_at") or now,
        "updated_at": now,
        "versions": base.get("versions") or versions((settings.env_args or {}).get("gym_python")),
        "settings": settings.to_dict(),
        "counts": {"expected": expected, "done": len(records), "missing": max(0, expected - len(records))},
        "sessions": sessions,
        "summary": summary,
    }


def _judges_over(sessions: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Judge calls summed over the sessions, by judge name (the latest session's target)."""
    total: dict[str, dict[str, Any]] = {}
    for session in sessions:
        for name, entry in (session.get("judges") or {}).items():
            into = total.setdefault(name, {"target": entry.get("target"), "calls": 0, "failed": 0})
            into["target"] = entry.get("target") or into["target"]
            for key in ("calls", "failed", "input_tokens", "output_tokens"):
                into[key] = into.get(key, 0) + (entry.get(key) or 0)
    return total


def versions(gym_python: str | None = None) -> dict[str, str | None]:
    """This package's version and the Gym runtime's nemo-gym (wherever that runtime lives)."""
    from importlib.metadata import PackageNotFoundError, version

    from .._exceptions import GymRuntimeError
    from .._gym import find_gym_runtime

    try:
        ours: str | None = version("verifiers-nemo")
    except PackageNotFoundError:
        ours = None
    try:
        gym: str | None = find_gym_runtime(gym_python, build=False).nemo_gym_version
    except GymRuntimeError:
        gym = None
    return {"verifiers-nemo": ours, "nemo-gym": gym}
