"""Eval statistics of result records (the dicts written to ``results.jsonl``), so a resumed run summarises
old and new rollouts alike: streamed (``SummaryTally``, ``ReplayTally``: a record at a time, in space that does
not grow with the records) or over a list (``summarize``, ``replay_agreement``: the same figures)."""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from .exact import ExactSum, ExactSums, Spread


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one example: the chance that at least one of k of its n samples is correct."""
    _check_nck(n, c, k)
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def pass_power_k(n: int, c: int, k: int) -> float:
    """Unbiased pass^k of one example: the chance that all k of k of its n samples are correct."""
    _check_nck(n, c, k)
    return math.comb(c, k) / math.comb(n, k)


def _check_nck(n: int, c: int, k: int) -> None:
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n (n={n}, c={c}, k={k})")


def powers_of_two_up_to(r: int) -> list[int]:
    """1, 2, 4, ... up to ``r`` (the k of pass@k for r rollouts per example)."""
    ks, k = [], 1
    while k <= r:
        ks.append(k)
        k *= 2
    return ks


def _clip(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class SummaryTally:
    """The summary of result records (``results.jsonl`` lines), taken one record at a time.

    It holds a few counters and exact sums (``exact.py``), a mean per rollout index, and per task still open
    its counts of records, scored and correct rollouts. With ``complete_at`` (the run's rollouts per example,
    for records known to hold each (task, rollout) pair once) a task whose records reach that count is folded
    into the pass@k sums and dropped, so what it holds does not grow with the records; without it every task
    stays open (any records). Either way ``summary()`` is the one ``summarize`` gives over the list.
    """

    def __init__(self, *, rollouts_per_example: int, pass_threshold: float = 0.5, complete_at: int | None = None):
        self.rollouts_per_example = rollouts_per_example
        self.pass_threshold = pass_threshold
        self.complete_at = complete_at
        self.total = 0
        self.rewards = Spread()
        self._by_index = ExactSums()
        self._open: dict[int, list[int]] = {}
        """Task index → [records, scored, correct] of a task not folded yet."""
        self._folded = 0
        self._ks = powers_of_two_up_to(rollouts_per_example)
        self._pass_at = {k: ExactSum() for k in self._ks}
        self._pass_power = {k: ExactSum() for k in self._ks}
        self._metrics: dict[str, ExactSum] = {}
        self.errors: Counter[str] = Counter()
        self._error_examples: dict[str, str] = {}
        self.masked: Counter[str] = Counter()
        self._masked_examples: dict[str, str] = {}
        self._usage: Counter[str] = Counter()
        self._latency = ExactSum()
        self._max_latency: float | None = None

    @property
    def open_tasks(self) -> int:
        """Tasks whose counts are still held (not folded)."""
        return len(self._open)

    def add(self, record: Mapping[str, Any]) -> None:
        """Count one record. Errored rollouts (``error`` set, ``reward`` None) are counted by type and left out
        of every reward statistic; so are masked ones (Gym's ``mask_sample``), counted by ``failure_kind``."""
        self.total += 1
        task_index = int(record["task_index"])
        task = self._open.get(task_index)
        if task is None:
            task = self._open[task_index] = [0, 0, 0]
        task[0] += 1
        for key, value in (record.get("usage") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._usage[key] += value
        latency = (record.get("timing") or {}).get("rollout_s")
        if isinstance(latency, int | float):
            self._latency.add(float(latency))
            if self._max_latency is None or float(latency) > self._max_latency:
                self._max_latency = float(latency)
        self._score(record, task)
        if self.complete_at is not None and task[0] >= self.complete_at:
            self._fold(task)
            del self._open[task_index]

    def _score(self, record: Mapping[str, Any], task: list[int]) -> None:
        error = record.get("error")
        reward = record.get("reward")
        if error or reward is None:
            kind = str(error.get("type", "error")) if isinstance(error, dict) else "error"
            self.errors[kind] += 1
            if kind not in self._error_examples:
                message = error.get("message") if isinstance(error, dict) else error
                self._error_examples[kind] = _clip(str(message or "the rollout has no reward"), 200)
            return
        if record.get("masked"):
            kind = str(record.get("failure_kind") or "unspecified")
            self.masked[kind] += 1
            if kind not in self._masked_examples and record.get("failure_reason"):
                self._masked_examples[kind] = _clip(str(record["failure_reason"]), 200)
            return
        reward = float(reward)
        self.rewards.add(reward)
        self._by_index.add(int(record["rollout_index"]), reward)
        task[1] += 1
        task[2] += reward >= self.pass_threshold
        for name, value in (record.get("metrics") or {}).items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._metrics.setdefault(name, ExactSum()).add(float(value))

    def _fold(self, task: list[int], into: tuple[dict[int, ExactSum], dict[int, ExactSum]] | None = None) -> None:
        pass_at, pass_power = into or (self._pass_at, self._pass_power)
        self._folded += into is None
        _, n, c = task
        for k in self._ks:
            if n >= k:
                pass_at[k].add(pass_at_k(n, c, k))
                pass_power[k].add(pass_power_k(n, c, k))

    def summary(self) -> dict[str, Any]:
        """The summary of the records added so far (the shape ``summarize`` documents)."""
        pass_at_sums = {k: s.copy() for k, s in self._pass_at.items()}
        pass_power_sums = {k: s.copy() for k, s in self._pass_power.items()}
        for task in self._open.values():
            self._fold(task, (pass_at_sums, pass_power_sums))
        pass_at: dict[str, float] = {}
        pass_power: dict[str, float] = {}
        pass_examples: dict[str, int] = {}
        for k in self._ks:
            if pass_at_sums[k].count:
                pass_at[str(k)] = pass_at_sums[k].mean()  # type: ignore[assignment]
                pass_power[str(k)] = pass_power_sums[k].mean()  # type: ignore[assignment]
                pass_examples[str(k)] = pass_at_sums[k].count
        rewards = self.rewards
        return {
            "rollouts": {
                "total": self.total,
                "scored": rewards.count,
                "errored": sum(self.errors.values()),
                "masked": sum(self.masked.values()),
                "examples": self._folded + len(self._open),
            },
            "reward": {"avg": rewards.sum.mean(), "std": rewards.pstdev(), "min": rewards.min, "max": rewards.max},
            "reward_by_rollout_index": [
                self._by_index.mean(i) for i in range(max(self.rollouts_per_example, len(self._by_index)))
            ],
            "pass_threshold": self.pass_threshold,
            "pass_at_k": pass_at,
            "pass_power_k": pass_power,
            "pass_k_examples": pass_examples,
            "metrics": {name: total.mean() for name, total in sorted(self._metrics.items())},
            "errors_by_type": dict(self.errors.most_common()),
            "error_examples": {kind: self._error_examples[kind] for kind in self.errors},
            "masked_by_kind": dict(self.masked.most_common()),
            "masked_examples": dict(self._masked_examples),
            "usage": dict(sorted(self._usage.items())),
            "latency": {"mean_rollout_s": self._latency.mean(), "max_rollout_s": self._max_latency},
        }


def summarize(
    records: Iterable[Mapping[str, Any]],
    *,
    rollouts_per_example: int,
    pass_threshold: float = 0.5,
) -> dict[str, Any]:
    """Summary statistics of result records (``results.jsonl`` lines); see ``SummaryTally``.

    Errored rollouts (``error`` set, ``reward`` None) are left out of every reward statistic and
    counted by type; so are masked ones (Gym's ``mask_sample``: no valid measurement), counted by
    ``failure_kind``. pass@k / pass^k (k = powers of two up to ``rollouts_per_example``) use the
    unbiased estimators per example over its scored rollouts, correct meaning reward >= threshold,
    averaged over the examples that have at least k scored rollouts.
    """
    tally = SummaryTally(rollouts_per_example=rollouts_per_example, pass_threshold=pass_threshold)
    for record in records:
        tally.add(record)
    return tally.summary()


KEPT_ROWS = 20
"""Mismatches (the first ones) and rollouts left out as known not to reproduce (the lowest) a verdict lists."""
KEPT_TASKS = 100
"""Tasks (the lowest) a verdict names as left out when it lists only some of their rollouts."""


class ReplayTally:
    """How many replayed rollouts reproduced their recorded reward, one record at a time (``replay_agreement``).

    It keeps counts, the first ``KEPT_ROWS`` mismatches, the ``KEPT_ROWS`` lowest rollouts left out as known
    not to reproduce and the ``KEPT_TASKS`` lowest tasks they belong to."""

    def __init__(self, tolerance: float = 1e-6, known: Callable[[int], str | None] | None = None) -> None:
        self.tolerance = tolerance
        self.known = known
        self.compared = 0
        self.mismatched = 0
        self.masked = 0
        self._mismatches: list[dict[str, Any]] = []
        self._known_count = 0
        self._known_rows: list[tuple[int, int, str]] = []
        """A max-heap (negated keys) of the lowest (task, rollout) pairs left out, with their reasons."""
        self._known_tasks: set[int] = set()

    def add(self, record: Mapping[str, Any]) -> None:
        if "recorded_reward" not in record:
            return
        if record.get("masked") and not record.get("error"):
            self.masked += 1
            return
        reason = self.known(int(record["task_index"])) if self.known is not None else None
        if reason:
            self._leave_out(record, reason)
            return
        self.compared += 1
        reward, recorded = record.get("reward"), record.get("recorded_reward")
        try:
            same = reward is not None and abs(float(reward) - float(recorded)) <= self.tolerance  # type: ignore[arg-type]
        except (TypeError, ValueError):
            same = False
        if not same:
            self.mismatched += 1
            if len(self._mismatches) < KEPT_ROWS:
                self._mismatches.append(
                    {
                        "task_index": record["task_index"],
                        "rollout_index": record["rollout_index"],
                        "reward": reward,
                        "recorded_reward": recorded,
                    }
                )

    def _leave_out(self, record: Mapping[str, Any], reason: str) -> None:
        self._known_count += 1
        task, rollout = int(record["task_index"]), int(record["rollout_index"])
        if task not in self._known_tasks:
            self._known_tasks.add(task)
            if len(self._known_tasks) > KEPT_TASKS:
                self._known_tasks.remove(max(self._known_tasks))
        entry = (-task, -rollout, reason)
        if len(self._known_rows) < KEPT_ROWS:
            heapq.heappush(self._known_rows, entry)
        elif entry > self._known_rows[0]:
            heapq.heapreplace(self._known_rows, entry)

    def result(self) -> dict[str, Any] | None:
        """The verdict (None when no replayed rollout was seen)."""
        if not self.compared and not self._known_count and not self.masked:
            return None
        agreement: dict[str, Any] = {
            "compared": self.compared,
            "reproduced": self.compared - self.mismatched,
            "mismatches": list(self._mismatches),
        }
        if self.masked:
            agreement["masked"] = self.masked
        if self._known_count:
            rows = sorted((-task, -rollout, reason) for task, rollout, reason in self._known_rows)
            agreement["known_unreproducible"] = [
                {"task_index": task, "rollout_index": rollout, "reason": reason} for task, rollout, reason in rows
            ]
            if self._known_count > len(rows):  # the list is cut short: the whole count and every task
                agreement["known_unreproducible_count"] = self._known_count
                agreement["known_unreproducible_tasks"] = sorted(self._known_tasks)
        return agreement


def replay_agreement(
    records: Iterable[Mapping[str, Any]],
    tolerance: float = 1e-6,
    known: Callable[[int], str | None] | None = None,
) -> dict[str, Any] | None:
    """How many replayed rollouts reproduced their recorded reward (None when none was replayed).

    An errored rollout counts as not reproduced. Rollouts of a recording known not to reproduce
    (``known(task_index)`` gives why) are left out of the comparison and listed under ``known``; so are
    masked ones (Gym's reward is no valid measurement: nothing to compare), counted under ``masked``.
    """
    tally = ReplayTally(tolerance, known)
    for record in records:
        tally.add(record)
    return tally.result()


def timing_summary(sessions: Sequence[Mapping[str, Any]], wall_s: float) -> dict[str, Any]:
    """The timing block of a summary: this invocation's wall time, stack start and throughput, and the sessions'
    total (``sessions_untimed``: earlier sessions that ended, killed, before saving their time: not in the total)."""
    current = sessions[-1] if sessions else {}
    rollouts, rollouts_s = current.get("rollouts") or 0, current.get("rollouts_s")
    return {
        "wall_s": wall_s,
        "stack_start_s": current.get("stack_start_s"),
        "rollouts_s": rollouts_s,
        "rollouts_per_s": rollouts / rollouts_s if rollouts and rollouts_s else None,
        "sessions": len(sessions),
        "total_wall_s": math.fsum(s.get("wall_s") or 0.0 for s in sessions),
        "sessions_untimed": sum(1 for s in sessions[:-1] if s.get("wall_s") is None),
    }
