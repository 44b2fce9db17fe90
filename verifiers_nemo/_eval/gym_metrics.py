"""The environment's own metrics: what nemo-gym's ``/aggregate_metrics`` answers for a run's verify responses.

At the end of ``gym eval run`` (and ``ng_collect_rollouts``), Gym POSTs every rollout's verify response to the
environment server each one ran through (an agent's ``/aggregate_metrics`` where no environment server fronts it),
stripped of the heavy fields (``response`` keeps only ``usage`` and ``incomplete_details``), with the row's task and
rollout indices (``_ng_task_index``, ``_ng_rollout_index``); the resources server answers with its ``key_metrics``
(math: ``pass@k``, ``pass@1[avg-of-k]``, ``majority@k`` on its own answer key), ``agent_metrics``,
``group_level_metrics`` and ``repeat_level_metrics``. Masked samples are sent too: Gym leaves them out of the quality
metrics itself and reports them as coverage. Rollouts that errored have no verify response and are not sent.

Here each result record carries that stripped verify response (``verify``), and the same request is made to the
run's own stack once its rollouts are done, so the numbers are Gym's for the same rollouts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

TASK_INDEX = "_ng_task_index"
ROLLOUT_INDEX = "_ng_rollout_index"
_HEAVY = frozenset({"response", "responses_create_params", "ng_agent_observations", "ng_model_call_capture"})
_TRAJECTORY = "ng_trajectory"
VERIFY_KEY = "verify"
"""The key of a result record that holds its stripped verify response."""
_TIMEOUT_S = 300.0


def verify_entry(gym_result: Mapping[str, Any], task_index: int, rollout_index: int) -> dict[str, Any]:
    """A verify response as Gym sends it to ``/aggregate_metrics``: every field but the heavy ones, ``response``
    cut to its ``usage`` and ``incomplete_details``, and the row's task and rollout indices."""
    entry = {k: v for k, v in gym_result.items() if k not in _HEAVY and k != _TRAJECTORY}
    response = gym_result.get("response")
    if isinstance(response, Mapping):
        kept = {k: response[k] for k in ("usage", "incomplete_details") if response.get(k) is not None}
        if kept:
            entry["response"] = kept
    entry[TASK_INDEX] = task_index
    entry[ROLLOUT_INDEX] = rollout_index
    return entry


class GymMetricsTally:
    """The verify responses of a run's records, by environment and agent (what each ``/aggregate_metrics`` gets)."""

    def __init__(self) -> None:
        self.entries: dict[tuple[str, str | None], list[dict[str, Any]]] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        entry = record.get(VERIFY_KEY)
        if isinstance(entry, dict) and record.get("error") is None:
            self.entries.setdefault((str(record.get("env")), record.get("agent")), []).append(entry)

    def __bool__(self) -> bool:
        return bool(self.entries)


VerifyEntries = Mapping[tuple[str, str | None], list[dict[str, Any]]]
"""Verify responses by (environment, agent): ``GymMetricsTally.entries``."""


def aggregate_metrics_url(harness: Any, agent: str | None) -> str:
    """Where a running harness's stack answers ``/aggregate_metrics`` for ``agent``'s rollouts: beside its ``/run``."""
    return harness.stack.run_url(agent).removesuffix("/run") + "/aggregate_metrics"


async def ask_gym_metrics(urls: Mapping[tuple[str, str | None], str], entries_by: VerifyEntries) -> dict[str, Any]:
    """``{env: {agent: Gym's answer, or {"error": why}}}`` for each (environment, agent) of ``entries_by`` whose
    ``/aggregate_metrics`` URL ``urls`` knows."""
    answers: dict[str, Any] = {}
    timeout = aiohttp.ClientTimeout(total=_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for (env, agent), entries in entries_by.items():
            url = urls.get((env, agent))
            if url is None:
                continue
            try:
                async with session.post(url, json={"verify_responses": entries}) as reply:
                    if reply.status != 200:
                        text = (await reply.text())[:300]
                        answer: dict[str, Any] = {"error": f"HTTP {reply.status} from {url}: {text}"}
                    else:
                        answer = await reply.json()
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                answer = {"error": f"{type(exc).__name__} from {url}: {exc}"}
            answer["rollouts"] = len(entries)
            answers.setdefault(env, {})[agent or "-"] = answer
    return answers


def key_metric_lines(gym_metrics: Mapping[str, Any]) -> list[str]:
    """One line per environment and agent: Gym's key metrics as it names them (its own 0-100 scale where it uses
    one), or why they could not be had."""
    lines = []
    several = len(gym_metrics) > 1 or any(len(agents) > 1 for agents in gym_metrics.values())
    for env, agents in gym_metrics.items():
        for agent, answer in agents.items():
            where = f"{env} ({agent}): " if several else ""
            if "error" in answer:
                lines.append(f"{where}not available: {answer['error']}")
                continue
            keys = answer.get("key_metrics") or {}
            shown = " · ".join(f"{name} {_number(value)}" for name, value in keys.items()) or "(no key metrics)"
            lines.append(f"{where}{shown}")
    return lines


def _number(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)
