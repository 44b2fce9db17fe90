"""NeMoGymEnv and load_environment: a packaged Gym environment as a Verifiers-style environment."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import datasets

from ._endpoint import Endpoint
from ._harness import NeMoGymHarness
from ._replicas import Replicas
from ._result import RolloutResult
from ._tasks import NeMoGymTaskset, Task
from ._tasks.source import check_count

EndpointChoice = Endpoint | Sequence[Endpoint] | Replicas | Callable[[Task], Endpoint]


class NeMoGymEnv:
    """A taskset and the harness that runs it: what ``load_environment`` returns."""

    def __init__(self, taskset: NeMoGymTaskset, harness: NeMoGymHarness) -> None:
        self.taskset = taskset
        self.harness = harness
        self._dataset: datasets.Dataset | None = None

    @property
    def name(self) -> str:
        return self.harness.env_name

    @property
    def dataset(self) -> datasets.Dataset:
        """The taskset as a Hugging Face dataset (prompt, example_id, task, info)."""
        if self._dataset is None:
            self._dataset = self.taskset.to_dataset()
        return self._dataset

    async def rollout(self, task: Task, endpoint: Endpoint, *args: Any, **kwargs: Any) -> RolloutResult:
        """One task, one rollout (``NeMoGymHarness.rollout``'s arguments)."""
        return await self.harness.rollout(task, endpoint, *args, **kwargs)

    def run(
        self,
        tasks: Iterable[Task] | None,
        endpoints: EndpointChoice,
        **kwargs: Any,
    ) -> AsyncIterator[RolloutResult]:
        """Rollouts of ``tasks`` (default: the whole taskset) as they finish."""
        return self.harness.run(self.taskset if tasks is None else tasks, endpoints, **kwargs)

    def run_sync(self, tasks: Iterable[Task] | None, endpoints: EndpointChoice, **kwargs: Any) -> list[RolloutResult]:
        """Blocking ``run``: every result, in completion order."""
        return self.harness.run_sync(self.taskset if tasks is None else tasks, endpoints, **kwargs)

    def close(self) -> None:
        self.harness.close()

    async def __aenter__(self) -> NeMoGymEnv:
        await self.harness.astart()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.harness.aclose()

    def __enter__(self) -> NeMoGymEnv:
        self.harness.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_environment(
    nemo_env: str = "example_multi_step",
    dataset: str | None = None,
    *,
    jsonl_path: str | Path | None = None,
    recorded: bool = False,
    num_examples: int | None = None,
    rollouts_per_example: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    **harness_args: Any,
) -> NeMoGymEnv:
    """Load a NeMo Gym environment: its tasks and a harness that runs them on the real stack. ``nemo_env`` is a
    packaged name, the path of an environment folder of yours (Gym's ``resources_servers/NAME`` layout) or of one of
    its config YAMLs, or a name under ``VERIFIERS_NEMO_GYM_ROOT``.

    ``harness_args`` go to ``NeMoGymHarness`` (``gym_python``, ``gym_version``, ``timeout``, ``max_steps``,
    ``isolated_venvs``...); the tasks are read from the packaged data of that same Gym runtime. The stack starts
    on first use, not here.
    """
    check_count(rollouts_per_example, "rollouts_per_example")  # named as the caller wrote it
    taskset = NeMoGymTaskset(
        nemo_env,
        dataset=dataset,
        jsonl_path=jsonl_path,
        recorded=recorded,
        limit=num_examples if num_examples and num_examples > 0 else None,
        shuffle=shuffle,
        seed=seed,
        rollouts_per_task=rollouts_per_example,
        agent=harness_args.get("agent"),  # the taskset refuses an agent the environment does not define
        root=harness_args.pop("root", None),
        gym_python=harness_args.pop("gym_python", None),  # the rows of the release the harness runs
        gym_version=harness_args.pop("gym_version", None),
    )
    harness = NeMoGymHarness(nemo_env, taskset=taskset, **harness_args)  # runs the taskset's Gym runtime
    return NeMoGymEnv(taskset, harness)
