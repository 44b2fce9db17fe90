"""``RunTasks``: the tasks of an eval run, made one at a time as the run takes them (never listed).

Each environment of the run gives its rows (the first rollout of each, from its taskset); a row's
``rollouts_per_example`` rollouts share that row and differ only in ``rollout_index``. In a mix, environment
``i``'s task indices start at ``i * stride``. What a run expects is ``expected`` (``ExpectedRollouts``: numbered,
not listed), and ``pending(done)`` skips the pairs a resumed run has already done without building them."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .results import DoneRollouts, ExpectedRollouts

if TYPE_CHECKING:
    from .._tasks import Task


@dataclass(frozen=True)
class EnvRows:
    """One environment's rows: how many, and the task of a row's first rollout (its own numbering)."""

    name: str
    rows: int
    first_rollout: Callable[[int], Task]


class RunTasks:
    """The tasks of a run, environment by environment, row by row, each row's rollouts in order (``aabbcc``)."""

    def __init__(self, envs: list[EnvRows], rollouts_per_example: int, stride: int | None = None) -> None:
        self.envs = envs
        self.rollouts_per_example = rollouts_per_example
        self.stride = stride if len(envs) > 1 else None
        self.expected = ExpectedRollouts([env.rows for env in envs], rollouts_per_example, self.stride)

    def __len__(self) -> int:
        return len(self.expected)

    def __iter__(self) -> Iterator[Task]:
        return self.pending(None)

    def firsts(self) -> Iterator[Task]:
        """The first rollout of every row (a replay server's recordings, one per task index)."""
        for position, env in enumerate(self.envs):
            for row in range(env.rows):
                yield self._numbered(env.first_rollout(row), position, row, 0)

    def pending(self, done: DoneRollouts | None) -> Iterator[Task]:
        """The tasks not in ``done`` (all, for None), in order; a row is read only when one of its rollouts runs."""
        r = self.rollouts_per_example
        for position, env in enumerate(self.envs):
            base = position * self.stride if self.stride else 0
            for row in range(env.rows):
                first: Task | None = None
                for rollout in range(r):
                    if done is not None and (base + row, rollout) in done:
                        continue
                    if first is None:
                        first = env.first_rollout(row)
                    yield self._numbered(first, position, row, rollout)

    def task_indices(self, done: DoneRollouts | None = None) -> Iterator[int]:
        """The task index of every row (with ``done``: of every row with a rollout still to run)."""
        r = self.rollouts_per_example
        for position, env in enumerate(self.envs):
            base = position * self.stride if self.stride else 0
            for row in range(env.rows):
                if done is None or any((base + row, i) not in done for i in range(r)):
                    yield base + row

    def _numbered(self, task: Task, position: int, row: int, rollout: int) -> Task:
        task_index = position * self.stride + row if self.stride else row
        if task.task_index == task_index and task.rollout_index == rollout:
            return task
        return dataclasses.replace(task, task_index=task_index, rollout_index=rollout)
