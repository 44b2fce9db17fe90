"""``TrainingTally``: what a run under verifiers' training client trains on, per environment, one result record at a
time (the ``training`` field of each record; see ``_training.forks``): how many training samples a rollout makes, how
many rollouts forked and where first, which replayed turns the renderer could not carry."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from .._training.policy_versions import PolicyVersionTally
from .._upstreams.refusals import NOT_CARRIED

EXAMPLES = 3
"""Forks (the first ones, one per cause and role) an environment's summary keeps as examples."""


class _EnvTraining:
    def __init__(self) -> None:
        self.rollouts = 0
        self.samples = 0
        self.branches = 0
        self.turns = 0
        self.tokens = 0
        self.loss_tokens = 0
        self.one_sample = 0
        self.forked = 0
        self.untrainable = 0
        self.fork_causes: Counter[str] = Counter()
        self.examples: list[dict[str, Any]] = []
        self.unfaithful = 0
        self.unfaithful_example: str | None = None
        self.failed: Counter[str] = Counter()
        self.failure_examples: dict[str, str] = {}
        self.not_carried: Counter[str] = Counter()
        self.policy_versions = PolicyVersionTally()

    def add(self, record: Mapping[str, Any], training: Mapping[str, Any]) -> None:
        self.rollouts += 1
        self.samples += int(training.get("samples") or 0)
        self.branches += int(training.get("branches") or 0)
        self.turns += int(training.get("turns") or 0)
        self.tokens += int(training.get("tokens") or 0)
        self.loss_tokens += int(training.get("loss_tokens") or 0)
        self.one_sample += training.get("branches") == 1
        self.untrainable += bool(training.get("untrainable"))
        fork = training.get("fork")
        if fork:
            self.forked += 1
            kind = f"{fork.get('cause')} {fork.get('role')}"
            self.fork_causes[kind] += 1
            if self.fork_causes[kind] == 1 and len(self.examples) < EXAMPLES:
                self.examples.append({"task_index": record.get("task_index"), **fork})
        error = record.get("error")
        if isinstance(error, Mapping):
            message = str(error.get("message") or "")
            what = next((name for name, cause in NOT_CARRIED.items() if cause in message), None)
            if what is not None:  # what the rollout holds, not a failure of the setup
                self.not_carried[what] += 1
            else:
                kind = str(error.get("type") or "error")
                self.failed[kind] += 1
                self.failure_examples.setdefault(kind, message[:300])
        self.policy_versions.add(training.get("policy_versions"))
        unfaithful = training.get("replay_unfaithful")
        if unfaithful:
            self.unfaithful += 1
            self.unfaithful_example = self.unfaithful_example or str(unfaithful[0])

    def summary(self) -> dict[str, Any]:
        n = self.rollouts
        out: dict[str, Any] = {
            "rollouts": n,
            "samples_per_rollout": self.samples / n if n else None,
            "branches_per_rollout": self.branches / n if n else None,
            "one_sample": self.one_sample,
            "forked": self.forked,
            "forked_share": self.forked / n if n else None,
            "turns_per_rollout": self.turns / n if n else None,
            "loss_token_share": self.loss_tokens / self.tokens if self.tokens else None,
            "fork_causes": dict(self.fork_causes.most_common()),
            "fork_examples": list(self.examples),
        }
        if self.untrainable:
            out["untrainable"] = self.untrainable
        if self.not_carried:
            out["not_carried"] = dict(self.not_carried.most_common())
        if self.failed:
            out["failed"] = dict(self.failed.most_common())
            out["failure_examples"] = dict(self.failure_examples)
        versions = self.policy_versions.summary()
        if versions is not None:
            out["policy_versions"] = versions
        if self.unfaithful:
            out["replay_unfaithful"] = self.unfaithful
            out["replay_unfaithful_example"] = self.unfaithful_example
        return out


class TrainingTally:
    """Per environment (and over all), the training figures of the records that carry them."""

    def __init__(self) -> None:
        self.overall = _EnvTraining()
        self.by_env: dict[str, _EnvTraining] = {}

    def add(self, record: Mapping[str, Any]) -> None:
        training = record.get("training")
        if not isinstance(training, Mapping):
            return
        self.overall.add(record, training)
        self.by_env.setdefault(str(record.get("env")), _EnvTraining()).add(record, training)

    def summary(self) -> dict[str, Any] | None:
        """``{"overall": ..., "by_env": {...}}`` (None when no record carried training figures)."""
        if not self.overall.rollouts:
            return None
        return {"overall": self.overall.summary(), "by_env": {k: v.summary() for k, v in sorted(self.by_env.items())}}
