"""``NeMoGymTaskset``: the tasks of a NeMo Gym environment, from its packaged data or any JSONL file.

A row is what Gym's agent ``/run`` takes: ``{"responses_create_params": {"input": [...], "tools": [...]},
"agent_ref": {"name": ...}, ...extra fields for the resources server}``. The taskset reads rows from a
packaged environment's dataset, its recorded rollouts, or any JSONL file, streaming (a small ``limit``
reads only that many rows), checks each row the way nemo-gym would and reports a bad one with its file
and line and the fix. Rows are kept as where they are in the file; a ``Task`` is built when asked for.
"""

from __future__ import annotations

import json
import logging
import operator
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from .._exceptions import ConfigurationError
from .._gym import GymEnvironment, get_environment, gym_root
from .._gym.releases import installed_version
from . import hf
from .benchmark_rows import has_input, prompted_rows
from .recorded import RecordedTasks
from .rows import LoadedRows, OnError, SkippedRows, read_rows
from .saved_results import as_recording
from .source import check_arguments, resolve_gym_root, resolve_source
from .task import Task, row_example_id
from .validation import RowChecker, gym_params, local_root

if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)


class NeMoGymTaskset(Sequence[Task]):
    """Tasks of a NeMo Gym environment, from its packaged data or any JSONL file.

    * ``NeMoGymTaskset("example_multi_step")``: the environment's default dataset (its shipped
      ``example`` dataset; see ``GymEnvironment.default_dataset``). An environment of yours is named by its
      folder's path (``"./resources_servers/my_env"``, or a config YAML of it), or by name under
      ``VERIFIERS_NEMO_GYM_ROOT``; ``env_name`` is then its absolute path.
    * ``dataset="validation"``: another dataset its configs name (by name, else by type).
    * ``recorded=True``: ``data/example_rollouts.jsonl``; each task keeps the recorded response and reward and is
      runnable as it is: the fields the resources server needs, which recordings do not keep, are put back from
      the environment's dataset row with the same input (``Task.recorded_row`` keeps the recording as written).
      With ``jsonl_path=`` it reads that file as recordings instead (restored the same way with ``nemo_env``).
    * A nemo-gym benchmark (``"aime25"``, ``"benchmarks/aime25"``): its prepared rows (where Gym's prepare script
      writes them, or ``jsonl_path=``) with its prompt config applied by nemo-gym's own code.
    * ``jsonl_path=``: any file. The agent of a row is its ``agent_ref.name``, else ``agent``. With
      ``nemo_env`` too, every ``agent_ref`` must name one of the environment's agents.

    Packaged files are upstream data: a row whose ``agent_ref`` names an agent outside the config that
    lists the dataset (stale names in some recordings, another config's agent) runs on the dataset's
    own agent instead, so every task of a packaged dataset runs on one config's stack.

    ``limit`` keeps the first ``limit`` valid rows and stops reading there. With ``shuffle`` the rows
    are shuffled with ``random.Random(seed)``; with ``shuffle`` and ``limit`` a uniform sample of
    ``limit`` rows is drawn by reservoir sampling: the whole file is read, but only ``limit`` rows are
    held. Each row gives ``rollouts_per_task`` consecutive tasks (``aabbcc``), with rollout indices
    ``0..r-1``. ``on_error="skip"`` leaves bad rows out (see ``skipped``) instead of raising.

    Which nemo-gym release's packaged data (and schema) the rows are read from follows the Gym runtime, found
    as ``NeMoGymHarness`` finds its own: ``gym_python=`` (an interpreter with nemo-gym), else
    ``VERIFIERS_NEMO_GYM_PYTHON``, else this interpreter when it has nemo-gym, else a managed one of the series
    ``gym_version=`` (``"0.7"``, ``"0.4"``). Name it once: ``NeMoGymHarness(taskset=...)`` with no runtime of its
    own runs on the taskset's, and one naming another release is refused. (``root=``, a Gym root directory, is
    the low-level alternative to ``gym_python=`` / ``gym_version=``.)

    Rows are held as where they are in the file (about 24 bytes a row; the file must stay as it is) and read
    back when indexing or iterating builds their ``Task`` objects, on demand.
    """

    def __init__(
        self,
        nemo_env: str | None = None,
        *,
        dataset: str | None = None,
        jsonl_path: str | Path | None = None,
        recorded: bool = False,
        agent: str | None = None,
        limit: int | None = None,
        shuffle: bool = False,
        seed: int = 0,
        rollouts_per_task: int = 1,
        on_error: OnError = "raise",
        root: str | Path | None = None,
        gym_python: str | Path | None = None,
        gym_version: str | None = None,
    ) -> None:
        check_arguments(nemo_env, dataset, jsonl_path, recorded, limit, rollouts_per_task, on_error)
        root = resolve_gym_root(root, gym_python, gym_version)
        env = get_environment(nemo_env, root) if nemo_env is not None else None
        if env is not None and agent is not None:
            env.agent(agent)  # raises, listing the environment's agents
        path, default_agent, packaged_agents = resolve_source(env, dataset, jsonl_path, recorded)
        if env is not None and env.benchmark is not None and not recorded and not has_input(path):
            path = prompted_rows(env, path)  # a benchmark's raw rows, prompted by nemo-gym's own code
        checker = RowChecker(
            path=path,
            allowed_params=gym_params(env.root if env else local_root(root)),
            env=env,
            fallback_agent=agent or default_agent,
            packaged_agents=packaged_agents,
            recorded=recorded,
        )
        store, skipped = read_rows(path, checker, limit=limit, shuffle=shuffle, seed=seed, on_error=on_error)
        rows = LoadedRows(store, path, env.ref if env else None, recorded, rollouts_per_task, skipped)
        self._init(rows, env, root, gym_python, gym_version)
        logger.debug("loaded %d rows from %s (%d skipped)", store.size, path, skipped.count)

    def _init(
        self,
        rows: LoadedRows,
        env: GymEnvironment | None,
        root: str | Path | None,
        gym_python: str | Path | None = None,
        gym_version: str | None = None,
    ) -> None:
        self._rows = rows
        self._env = env
        self._root = root
        self._gym_python = str(gym_python) if gym_python is not None else None
        self._gym_version = gym_version
        self._recordings: RecordedTasks | None = None

    # ---- what it holds

    @property
    def path(self) -> Path:
        """The JSONL file the rows came from."""
        return self._rows.path

    @property
    def env_name(self) -> str | None:
        return self._rows.env_name

    @property
    def env(self) -> GymEnvironment | None:
        """The packaged environment, when the taskset names one (looked up on first use)."""
        if self._env is None and self._rows.env_name is not None:
            self._env = get_environment(self._rows.env_name, self._root)
        return self._env

    @property
    def gym_python(self) -> str | None:
        """The Gym interpreter named by ``gym_python=`` (None when none was)."""
        return self._gym_python

    @property
    def gym_version(self) -> str | None:
        """The nemo-gym series named by ``gym_version=`` (None when none was)."""
        return self._gym_version

    @property
    def gym_root(self) -> Path | None:
        """The Gym root whose packaged data and schema the rows were read against (None for a JSONL file read
        with no environment and no nemo-gym anywhere to check it against)."""
        if self._root is not None:
            return Path(self._root).expanduser().resolve()
        if self.env is not None:
            return self.env.root
        found = local_root(None)
        return found.resolve() if found is not None else None

    @property
    def recorded(self) -> bool:
        return self._rows.recorded

    @property
    def rollouts_per_task(self) -> int:
        return self._rows.rollouts_per_task

    @property
    def num_rows(self) -> int:
        """Distinct rows (tasks before repeats)."""
        return self._rows.store.size

    @property
    def skipped(self) -> SkippedRows:
        """Rows left out by ``on_error="skip"``."""
        return self._rows.skipped

    @property
    def agents(self) -> tuple[str, ...]:
        """The agent instances the rows run on, in first-seen order."""
        return tuple(dict.fromkeys(a for a in self._rows.store.agents if a is not None))

    # ---- sequence protocol

    def __len__(self) -> int:
        return self._rows.store.size * self._rows.rollouts_per_task

    @overload
    def __getitem__(self, index: int) -> Task: ...

    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...

    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        if isinstance(index, slice):
            return [self._task(i) for i in range(*index.indices(len(self)))]
        index = operator.index(index)  # numpy integers too; TypeError for anything else
        position = index + len(self) if index < 0 else index
        if not 0 <= position < len(self):
            raise IndexError(f"task index {index} out of range for {len(self)} tasks")
        return self._task(position)

    def __iter__(self) -> Iterator[Task]:
        for position in range(len(self)):
            yield self._task(position)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NeMoGymTaskset):
            return NotImplemented
        return (
            self._rows.env_name == other._rows.env_name
            and self._rows.rollouts_per_task == other._rows.rollouts_per_task
            and len(self) == len(other)
            and all(a == b for a, b in zip(self, other, strict=True))
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (
            f"NeMoGymTaskset(env={self._rows.env_name!r}, path='{self._rows.path}', rows={self.num_rows}, "
            f"rollouts_per_task={self._rows.rollouts_per_task}, recorded={self._rows.recorded})"
        )

    def _task(self, position: int, *, as_read: bool = False) -> Task:
        """The task at ``position``; a recording with its task's fields put back unless ``as_read``."""
        task_index, rollout_index = divmod(position, self._rows.rollouts_per_task)
        line, line_no, row_index, agent = self._rows.store.get(task_index)
        row = as_recording(json.loads(line)) if self._rows.recorded else json.loads(line)
        task = Task(
            task_index=task_index,
            rollout_index=rollout_index,
            row=row,
            agent_name=agent,
            env=self._rows.env_name,
            example_id=row_example_id(row, row_index),
            source=f"{self._rows.path}:{line_no}",
            recorded=self._rows.recorded,
        )
        return task if as_read or not self._rows.recorded else self._restored(task)

    def _restored(self, task: Task) -> Task:
        if self._recordings is None:
            env = self.env
            if env is None:  # recordings of no environment: nothing to restore them from
                return task
            self._recordings = RecordedTasks(d.path for d in env.datasets if d.exists)
        return self._recordings.restore(task)

    # ---- Hugging Face datasets

    def to_dataset(self) -> datasets.Dataset:
        """One row per task (before repeats): ``prompt``, ``example_id``, ``task``, ``info`` (JSON).

        ``task`` is the environment name (else the agent name); ``info`` holds the raw row, agent,
        task index and where the row came from, so ``from_dataset`` can rebuild this taskset (a recording's row as
        read: its task's fields are put back when the rebuilt taskset builds it).
        """
        r = self._rows.rollouts_per_task
        firsts = ((self._task(i * r, as_read=True), self._rows.store.get(i)[2]) for i in range(self.num_rows))
        return hf.to_dataset(
            firsts, path=self._rows.path, recorded=self._rows.recorded, rollouts_per_task=self._rows.rollouts_per_task
        )

    @classmethod
    def from_dataset(
        cls,
        dataset: Iterable[Mapping[str, Any]],
        *,
        root: str | Path | None = None,
        gym_python: str | Path | None = None,
        gym_version: str | None = None,
    ) -> NeMoGymTaskset:
        """Rebuild a taskset from ``to_dataset()``'s output (its ``info`` column); ``gym_python=`` /
        ``gym_version=`` / ``root=`` as for the constructor."""
        root = resolve_gym_root(root, gym_python, gym_version)
        taskset = cls.__new__(cls)
        taskset._init(hf.from_dataset(dataset), None, root, gym_python, gym_version)
        return taskset


def harness_runtime(
    taskset: NeMoGymTaskset | None, gym_python: str | None, gym_version: str | None
) -> tuple[str | None, str | None]:
    """The Gym runtime (``gym_python``, ``gym_version``) of a harness given ``taskset``: the harness's own when it
    names one, else the taskset's. A ``ConfigurationError`` when the harness names a runtime whose packaged
    data are not the ones the taskset read (its rows, recordings included, would belong to another release)."""
    if taskset is None:
        return gym_python, gym_version
    if gym_python is None and gym_version is None:
        return taskset.gym_python, taskset.gym_version
    read = taskset.gym_root if taskset.env_name is not None else None
    if read is not None:
        runs = gym_root(gym_python, gym_version).resolve()
        if runs != read:
            raise ConfigurationError(
                f"The taskset's rows were read from the nemo-gym at {read} ({installed_version(read) or '?'}), "
                f"but this harness runs the one at {runs} ({installed_version(runs) or '?'}). Name the Gym "
                "runtime once: NeMoGymTaskset(..., gym_python=...) and NeMoGymHarness(taskset=...) without one, "
                "or the same gym_python= / gym_version= on both."
            )
    return gym_python, gym_version
