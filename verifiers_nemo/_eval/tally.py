"""``RunTally``: everything a run's summary needs, taken one result record at a time.

The records themselves go to ``results.jsonl`` (or nowhere, without ``-s``); the tally keeps the summary of all
rollouts and of each environment of a mix, the replay verdict and the token-ID figures, in space that does not
grow with the records. A resumed run feeds it the saved records first, then the new ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from .gym_metrics import GymMetricsTally
from .stats import ReplayTally, SummaryTally
from .token_ids import TokenIdsTally
from .training import TrainingTally

if TYPE_CHECKING:
    from .settings import EvalSettings


class RunTally:
    """The running summary of a run's records.

    ``each_pair_once``: the records hold each (task, rollout) pair at most once (a run's own, deduplicated), so
    a task is folded away once it has ``rollouts_per_example`` of them; otherwise every task's counts are held."""

    def __init__(self, settings: EvalSettings, *, each_pair_once: bool = True) -> None:
        from .._replay import unreproducible_reason

        def summary() -> SummaryTally:
            return SummaryTally(
                rollouts_per_example=settings.rollouts_per_example,
                pass_threshold=settings.pass_threshold,
                complete_at=settings.rollouts_per_example if each_pair_once else None,
            )

        self.overall = summary()
        names = settings.env_names
        self.by_env = {name: summary() for name in names} if len(names) > 1 else {}
        self.replay = ReplayTally(known=lambda index: unreproducible_reason(*settings.origin(index)))
        self.replay_by_env = (
            {name: ReplayTally(known=lambda index: unreproducible_reason(*settings.origin(index))) for name in names}
            if len(names) > 1
            else {}
        )
        self.token_ids = TokenIdsTally(exact_tokens=settings.exact_tokens)
        self.training = TrainingTally()
        self.gym = GymMetricsTally()
        """The verify responses Gym's ``/aggregate_metrics`` is asked about at the end."""

    @classmethod
    def of(cls, records: Iterable[Mapping[str, Any]], settings: EvalSettings) -> RunTally:
        """The tally of any records (held in full: pairs may repeat)."""
        tally = cls(settings, each_pair_once=False)
        for record in records:
            tally.add(record)
        return tally

    @property
    def count(self) -> int:
        """Records added."""
        return self.overall.total

    def add(self, record: Mapping[str, Any]) -> None:
        self.overall.add(record)
        own = self.by_env.get(record.get("env"))  # type: ignore[arg-type]
        if own is not None:
            own.add(record)
        self.replay.add(record)
        own_replay = self.replay_by_env.get(record.get("env"))  # type: ignore[arg-type]
        if own_replay is not None:
            own_replay.add(record)
        self.token_ids.add(record)
        self.training.add(record)
        self.gym.add(record)

    def summary(self) -> dict[str, Any]:
        """The summary of ``metadata.json`` without its timing and judges (``replay``, ``by_env``, ``token_ids``
        and ``training`` where they apply)."""
        summary = self.overall.summary()
        agreement = self.replay.result()
        if agreement is not None:
            summary["replay"] = agreement
        if self.by_env:
            summary["by_env"] = {name: tally.summary() for name, tally in self.by_env.items()}
            for name, replay in self.replay_by_env.items():
                verdict = replay.result()
                if verdict is not None:
                    summary["by_env"][name]["replay"] = verdict
        token_ids = self.token_ids.summary()
        if token_ids is not None:
            summary["token_ids"] = token_ids
        training = self.training.summary()
        if training is not None:
            summary["training"] = training
        return summary
