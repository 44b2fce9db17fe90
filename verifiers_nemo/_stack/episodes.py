"""nemo-gym 0.7's typed episodes: what an environment server such as ``single_agent_turn`` takes at ``/run`` and
answers, made from a row and read back as the flat Gym result the rest of the harness reads.

A typed environment server (``nemo_gym.base_environment_server``) takes ``{"episode_id": {"rollout_id",
"attempt"}, "task": {"task_id": {"taskset", "task_id"}, "task_input": {...}}}`` and answers ``{"episode_id",
"task_id", "result" | "failure"}`` (``nemo_gym.episode_types``). Gym's collector builds that request from a
materialized row (``nemo_gym.task_materialization.materialize_task``: the row's ``task_id`` / ``problem_id`` /
``instance_id``, else its task index; every field but the collector's own) and stores the answer as its
``_episode_record`` does: a result as returned (its top-level ``reward`` scores it), a failure as a failure row
whose ``terminal`` flag says whether it may be tried again. The same here, on the wire contract, so that nothing
of nemo-gym is imported in this process.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_ID_FIELDS = ("task_id", "problem_id", "instance_id")
_NOT_TASK_INPUT = frozenset({"agent_ref", "_task_source", "skills_ref"})
"""Row fields Gym's ``materialize_task`` leaves out of ``task_input`` (beside every ``_ng_*`` stamp)."""
FAILURE_CLASS = "environment_server_failed"
"""The failure class Gym's collector gives an environment server's ``failure``."""


def episode_request(row: Mapping[str, Any], taskset: str) -> dict[str, Any]:
    """The episode request Gym's collector posts for ``row`` (a row as ``Task.gym_row`` makes it, route key in its
    ``responses_create_params``) to a typed environment server, its task in ``taskset``."""
    task_id = next((str(row[key]) for key in _ID_FIELDS if row.get(key) is not None), None)
    if task_id is None:
        task_id = str(row["_ng_task_index"])
    return {
        "episode_id": {
            "rollout_id": f"{row['_ng_task_index']}-{row['_ng_rollout_index']}",
            "attempt": int(row.get("_ng_attempt_index", 0)),
        },
        "task": {
            "task_id": {"taskset": taskset, "task_id": task_id},
            "task_input": {k: v for k, v in row.items() if k not in _NOT_TASK_INPUT and not k.startswith("_ng_")},
        },
    }


def episode_record(answer: Any) -> Any:
    """The flat Gym result of an episode answer: its ``result`` with the task's identity, or its ``failure`` as the
    ``_ng_failure_*`` fields a failure row has. Anything else is returned as it is (the caller reports it)."""
    if not isinstance(answer, Mapping):
        return answer
    failure = answer.get("failure")
    if isinstance(failure, Mapping):
        record: dict[str, Any] = {
            "_ng_failure_class": FAILURE_CLASS,
            "_ng_failure_terminal": bool(failure.get("terminal", False)),
            "_ng_failure_message": failure.get("failure_reason"),
        }
        if failure.get("stage") is not None:
            record["_ng_failure_stage"] = failure["stage"]
        if failure.get("partial_response") is not None:
            record["_ng_failure_partial_response"] = failure["partial_response"]
        return record
    result = answer.get("result")
    if isinstance(result, Mapping):
        record = {k: v for k, v in result.items() if not (k == "ng_agent_observations" and v is None)}
        record["_ng_task_id"] = answer.get("task_id")
        return record
    return answer
