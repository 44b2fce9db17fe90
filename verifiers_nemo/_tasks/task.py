"""``Task``: one rollout's work, a Gym row (untouched) with a chat-style view and the row Gym's ``/run`` takes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .._gym import RESPONSES_API_AGENTS
from .._protocol import to_chat_messages, to_chat_tools

RESPONSES_CREATE_PARAMS = "responses_create_params"
AGENT_REF = "agent_ref"
# Top-level fields a recorded rollout carries that are verify outputs, not task inputs.
RECORDED_OUTPUTS = ("response", "reward")
# Fields Gym's rollout collection stamps on rows; the harness stamps its own.
GYM_STAMP_PREFIX = "_ng_"
TASK_INDEX_STAMP, ROLLOUT_INDEX_STAMP = "_ng_task_index", "_ng_rollout_index"
"""What Gym's rollout collector stamps on each row it posts to ``/run`` (both releases): nemo-gym 0.7's
``single_agent_turn_legacy`` environment server names its episode after them."""
_EXAMPLE_ID_FIELDS = ("id", "example_id", "task_id")


@dataclass(frozen=True)
class Task:
    """One rollout's work: a Gym row (untouched) and a chat-style view of it.

    ``task_index`` is the row's position in its taskset, ``rollout_index`` counts the repeats of that
    row (``rollouts_per_task``). ``example_id`` is stable across shuffles and limits: the row's
    ``id``/``example_id``/``task_id`` field, else its 0-based position among the file's rows.
    """

    task_index: int
    rollout_index: int
    row: dict[str, Any]
    """The row as read from the file; for a recording, its task's fields put back from the environment's dataset
    (see ``recorded_row``)."""
    agent_name: str | None
    """The Gym agent instance that runs this task."""
    env: str | None
    example_id: str
    source: str
    """``path:line`` the row was read from."""
    recorded: bool = False
    """The row is a recorded rollout (it carries the model's ``response`` and the ``reward``)."""
    recorded_row: dict[str, Any] | None = None
    """For a recording whose ``row`` was rebuilt from its environment's dataset: the recorded rollout as written
    (its verify outputs, judge calls included)."""

    def __hash__(self) -> int:  # the row is a dict; equal tasks share these fields
        return hash((self.source, self.task_index, self.rollout_index, self.example_id))

    @property
    def prompt(self) -> list[dict[str, Any]]:
        """The input as chat messages: ``developer`` becomes ``system``, plain-text parts are joined."""
        return to_chat_messages(self.row[RESPONSES_CREATE_PARAMS].get("input", []))

    @property
    def tools(self) -> list[dict[str, Any]]:
        """The tools in Chat Completions form (``{"type": "function", "function": {...}}``)."""
        return to_chat_tools(self.row[RESPONSES_CREATE_PARAMS].get("tools") or [])

    @property
    def extras(self) -> dict[str, Any]:
        """The row's other top-level fields (what Gym passes to ``/seed_session`` and ``/verify``)."""
        return {k: v for k, v in self.row.items() if k not in (RESPONSES_CREATE_PARAMS, AGENT_REF)}

    @property
    def recorded_response(self) -> dict[str, Any] | None:
        """The recorded model response (Responses API object) of a recorded rollout."""
        response = self.row.get("response")
        return response if self.recorded and isinstance(response, dict) else None

    @property
    def recorded_reward(self) -> Any:
        """The recorded reward of a recorded rollout (as written, normally a number)."""
        return self.row.get("reward") if self.recorded else None

    def gym_row(self) -> dict[str, Any]:
        """The row to send to Gym's agent ``/run``.

        Drops ``null`` values inside ``responses_create_params`` (recordings hold explicit nulls that
        Gym answers with 422), verify outputs of recordings (``response``, ``reward``) and the ``_ng_*`` stamps
        they were recorded with, stamps this rollout's task and rollout indices as Gym's collector does, and names
        the resolved agent in ``agent_ref``.
        """
        row = {
            key: value
            for key, value in self.row.items()
            if key not in RECORDED_OUTPUTS and not key.startswith(GYM_STAMP_PREFIX)
        }
        row[RESPONSES_CREATE_PARAMS] = {
            key: value for key, value in self.row[RESPONSES_CREATE_PARAMS].items() if value is not None
        }
        row[TASK_INDEX_STAMP], row[ROLLOUT_INDEX_STAMP] = self.task_index, self.rollout_index
        if self.agent_name is not None:
            row[AGENT_REF] = {"type": RESPONSES_API_AGENTS, "name": self.agent_name}
        return row


def row_example_id(row: dict[str, Any], row_index: int) -> str:
    for field in _EXAMPLE_ID_FIELDS:
        value = row.get(field)
        if isinstance(value, str | int) and not isinstance(value, bool):
            return str(value)
    return str(row_index)
