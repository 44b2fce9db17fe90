"""The report's figures of a run, taken one rollout at a time (``RunTally``), in space that does not grow with
the rollouts: per environment and overall (``ScopeTally``) counts, failures by kind, the distributions
(``values.ValueTally``) and, per task, the few counters its intervals and pass@k need.

A task's counters are held while it is open and folded into multisets (per-task mean reward, metric means, and
(scored, correct) counts) once it has all its rollouts (``complete_at``: the run's rollouts per example), so a
run of a million one-rollout tasks holds no table of a million tasks; with ``keep_tasks`` (runs compared task by
task) each task's reward sum and counts are kept.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from .._eval.exact import ExactSum
from .._training.policy_versions import PolicyVersionTally
from .records import Rollout
from .stats import is_identifier, mean_interval, pass_curves
from .values import ValueTally

EXAMPLE_CHARS = 300
"""Characters of a failure kind's example message."""


class TaskCounts:
    """One task's counters: its rollouts, the scored and correct ones, their reward sum and metric sums."""

    __slots__ = ("correct", "env", "metrics", "records", "reward", "scored", "task")

    def __init__(self, env: str, task: str) -> None:
        self.env, self.task = env, task
        self.records = self.scored = self.correct = 0
        self.reward = ExactSum()
        self.metrics: dict[str, ExactSum] | None = None

    def add(self, rollout: Rollout, threshold: float) -> None:
        self.records += 1
        if rollout.status != "scored" or rollout.reward is None:
            return
        self.scored += 1
        self.correct += rollout.reward >= threshold
        self.reward.add(rollout.reward)
        for name, value in rollout.metrics.items():
            if not is_identifier(name):
                if self.metrics is None:
                    self.metrics = {}
                self.metrics.setdefault(name, ExactSum()).add(value)


class ScopeTally:
    """The overview of a set of rollouts (a run, or one environment of it)."""

    def __init__(self, threshold: float) -> None:
        self.threshold = threshold
        self.rollouts = 0
        self.errors: Counter[str] = Counter()
        self.masked: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self.recorded = self.reproduced = 0
        self.reward = ValueTally()
        """Rewards of the scored rollouts."""
        self.latency, self.call_latency = ValueTally(), ValueTally()
        self.output_tokens, self.turns = ValueTally(), ValueTally()
        self.tasks = 0
        self.task_rewards: Counter[float] = Counter()
        """Per task with a scored rollout: its mean reward (a multiset)."""
        self.pass_counts: Counter[tuple[int, int]] = Counter()
        """Per task with a scored rollout: (scored, correct)."""
        self.task_metrics: dict[str, Counter[float]] = {}
        self.trained = self.samples = self.one_sample = self.forked = 0
        """Rollouts with training figures (verifiers' training client), their samples, those of one, those forked."""
        self.fork_example: dict[str, Any] | None = None
        self.policy_versions = PolicyVersionTally()

    def add(self, rollout: Rollout) -> None:
        self.rollouts += 1
        if rollout.samples is not None:
            self.trained += 1
            self.samples += rollout.samples
            self.one_sample += rollout.samples == 1
            self.forked += rollout.samples > 1
            if rollout.fork is not None and self.fork_example is None:
                self.fork_example = {"task": rollout.task, **rollout.fork}
            self.policy_versions.add(rollout.policy_versions)
        if rollout.status == "error":
            self.errors[rollout.kind or "error"] += 1
        elif rollout.status == "masked":
            self.masked[rollout.kind or "masked"] += 1
        elif rollout.reward is not None:
            self.reward.add(rollout.reward)
        kind = rollout.kind
        if rollout.status != "scored" and kind and kind not in self.examples and rollout.message:
            self.examples[kind] = rollout.message[:EXAMPLE_CHARS]
        if rollout.recorded_reward is not None:
            self.recorded += 1
            if rollout.status == "scored" and rollout.reward is not None:
                self.reproduced += abs(rollout.reward - rollout.recorded_reward) <= 1e-6
        if rollout.latency_s is not None:
            self.latency.add(rollout.latency_s)
        for latency in rollout.call_latencies:
            self.call_latency.add(latency)
        if rollout.output_tokens is not None:
            self.output_tokens.add(float(rollout.output_tokens))
        self.turns.add(float(rollout.turns))

    def add_task(self, task: TaskCounts) -> None:
        """Fold in a task whose rollouts were all added."""
        self.tasks += 1
        if not task.scored:
            return
        self.task_rewards[task.reward.total / task.scored] += 1
        self.pass_counts[(task.scored, task.correct)] += 1
        for name, total in (task.metrics or {}).items():
            self.task_metrics.setdefault(name, Counter())[total.total / total.count] += 1

    def overview(self) -> dict[str, Any]:
        """The overview numbers (reward with its interval over tasks, pass@k, metric means, failures, replay,
        latency and token quantiles)."""
        reward_ci = mean_interval(self.task_rewards)
        metrics = []
        for name in sorted(self.task_metrics):
            per_task = self.task_metrics[name]
            mean, low, high, method = mean_interval(per_task)
            metrics.append(
                {"name": name, "mean": mean, "low": low, "high": high, "method": method, "tasks": per_task.total()}
            )
        spread = self.reward.spread
        return {
            "rollouts": self.rollouts,
            "scored": self.reward.count,
            "errored": self.errors.total(),
            "masked": self.masked.total(),
            "tasks": self.tasks,
            "reward": {
                "mean": spread.sum.mean(),
                "task_mean": reward_ci[0],
                "low": reward_ci[1],
                "high": reward_ci[2],
                "method": reward_ci[3],
                "std": spread.pstdev(),
                "min": spread.min,
                "max": spread.max,
            },
            "pass": pass_curves(self.pass_counts),
            "threshold": self.threshold,
            "metrics": metrics,
            "errors": dict(self.errors.most_common()),
            "masked_by_kind": dict(self.masked.most_common()),
            "examples": dict(self.examples),
            "replay": {"compared": self.recorded, "reproduced": self.reproduced} if self.recorded else None,
            "latency": self.latency.quantiles(),
            "call_latency": self.call_latency.quantiles(),
            "output_tokens": self.output_tokens.quantiles(),
            "turns": self.turns.quantiles(),
            "training": self._training(),
        }

    def _training(self) -> dict[str, Any] | None:
        if not self.trained:
            return None
        return {
            "rollouts": self.trained,
            "samples_per_rollout": self.samples / self.trained,
            "one_sample": self.one_sample,
            "forked": self.forked,
            "fork_example": self.fork_example,
            "policy_versions": self.policy_versions.summary(),
        }


class RunTally:
    """A run's figures: all of it (``overall``) and each environment (``by_env``), tasks folded as they complete.

    ``complete_at``: the rollouts a task has (None: unknown, every task stays open until ``finish``).
    ``keep_tasks``: keep each task's reward sum and counts (``task_scores``) to compare runs task by task."""

    def __init__(self, threshold: float, *, complete_at: int | None = None, keep_tasks: bool = False) -> None:
        self.threshold = threshold
        self.complete_at = complete_at
        self.overall = ScopeTally(threshold)
        self.by_env: dict[str, ScopeTally] = {}
        self._open: dict[tuple[str, Any], TaskCounts] = {}
        self.task_scores: dict[tuple[str, str], list[Any]] | None = {} if keep_tasks else None
        """(env, task) → [reward sum, scored, correct] (two rows of one example id add up), with ``keep_tasks``."""
        self.max_repeats = 0
        """The most rollouts a task had."""

    @classmethod
    def of(cls, rollouts: Iterable[Rollout], threshold: float, *, keep_tasks: bool = False) -> RunTally:
        """The tally of a list of rollouts (the same figures as streaming them)."""
        tally = cls(threshold, keep_tasks=keep_tasks)
        for rollout in rollouts:
            tally.add(rollout)
        tally.finish()
        return tally

    @property
    def envs(self) -> list[str]:
        return sorted(self.by_env)

    def scope(self, env: str | None) -> ScopeTally:
        """The tally of one environment (None: the whole run)."""
        return self.overall if env is None else self.by_env[env]

    def add(self, rollout: Rollout) -> None:
        self.overall.add(rollout)
        scope = self.by_env.get(rollout.env)
        if scope is None:
            scope = self.by_env[rollout.env] = ScopeTally(self.threshold)
        scope.add(rollout)
        group = rollout.group
        task = self._open.get(group)
        if task is None:
            task = self._open[group] = TaskCounts(rollout.env, rollout.task)
        task.add(rollout, self.threshold)
        if self.complete_at is not None and task.records >= self.complete_at:
            self._fold(task)
            del self._open[group]

    def _fold(self, task: TaskCounts) -> None:
        self.max_repeats = max(self.max_repeats, task.records)
        self.overall.add_task(task)
        self.by_env[task.env].add_task(task)
        if self.task_scores is not None:
            kept = self.task_scores.setdefault((task.env, task.task), [ExactSum(), 0, 0])
            kept[0].merge(task.reward)
            kept[1] += task.scored
            kept[2] += task.correct

    def finish(self) -> None:
        """Fold in the tasks still open (the run is read)."""
        for task in self._open.values():
            self._fold(task)
        self._open.clear()
