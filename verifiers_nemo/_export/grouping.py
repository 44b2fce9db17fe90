"""A task's rollouts brought together from a stream of rollouts, in bounded memory, for the formats that read a task
whole (preferences, rollout groups).

An eval writes a rollout when it finishes, and hands out a task's rollouts one after another, so a task's rollouts
sit close together in ``results.jsonl`` (at most about ``-c`` tasks are open at any point of the file). ``TaskGroups``
keeps the open tasks in memory and hands a task out as soon as it has all its rollouts (``group_size``: the run's
``-r``). When what the open tasks hold passes ``memory`` bytes (a stream in another order: a resumed run, results of
your own), every open task and every rollout after it goes to a spill folder on disk instead, split by task into
partition files; at the end each partition (split again while larger than ``memory``) is read back and grouped.
Memory is then bounded by ``memory``, whatever the size and order of the run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from .._protocol import dumps, loads

Key = tuple[Any, int]
"""A task: (environment, task index)."""
Group = list[dict[str, Any]]
DEFAULT_MEMORY = 128 * 1024 * 1024
PARTITIONS = 16
IN_MEMORY = 8
"""About how many bytes of objects one byte of a spilled rollout's JSON makes when it is read back."""


class TaskGroups:
    """Rollouts in (``add``), whole tasks out, each task's rollouts in rollout order, the first of a repeated
    (task, rollout) pair kept (``duplicates`` counts the others). ``weight`` says how many bytes a rollout holds;
    ``spill_dir`` is where the spill folder is made when one is needed (default: the system's temporary folder)."""

    def __init__(
        self,
        group_size: int | None,
        *,
        memory: int = DEFAULT_MEMORY,
        weight: Any = None,
        spill_dir: Path | None = None,
    ) -> None:
        self.group_size = group_size
        self.memory = memory
        self._weight = weight or (lambda rollout: len(dumps(rollout)))
        self._spill_dir = spill_dir
        self._open: dict[Key, dict[int, dict[str, Any]]] = {}
        self._held = 0
        self._spill: _Spill | None = None
        self.duplicates = 0
        self.spilled = 0
        """Rollouts that went to disk."""

    def add(self, rollout: dict[str, Any]) -> Group | None:
        """Take one rollout; its task when that makes the task whole, else None."""
        key: Key = (rollout["env"], rollout["task_index"])
        if self._spill is not None:
            self._spill.write(key, rollout)
            self.spilled += 1
            return None
        group = self._open.setdefault(key, {})
        if rollout["rollout_index"] in group:
            self.duplicates += 1
            return None
        group[rollout["rollout_index"]] = rollout
        self._held += self._weight(rollout)
        if self.group_size is not None and len(group) >= self.group_size:
            return self._close(key)
        if self._held > self.memory:
            self._start_spilling()
        return None

    def finish(self) -> Iterator[Group]:
        """Every task still open (a run cut short leaves some incomplete), then the tasks that went to disk."""
        for key in list(self._open):
            yield self._close(key)
        if self._spill is not None:
            try:
                for rollouts in self._spill.groups():
                    yield self._keep_first(rollouts)
            finally:
                self._spill.remove()
                self._spill = None

    def close(self) -> None:
        """Remove the spill folder, if any (``finish`` does when it runs to the end)."""
        if self._spill is not None:
            self._spill.remove()
            self._spill = None

    def _close(self, key: Key) -> Group:
        group = self._open.pop(key)
        self._held -= sum(self._weight(rollout) for rollout in group.values())
        return [group[index] for index in sorted(group)]

    def _start_spilling(self) -> None:
        self._spill = _Spill(self._spill_dir, self.memory)
        for key, group in self._open.items():
            for rollout in group.values():
                self._spill.write(key, rollout)
                self.spilled += 1
        self._open.clear()
        self._held = 0

    def _keep_first(self, rollouts: list[dict[str, Any]]) -> Group:
        kept: dict[int, dict[str, Any]] = {}
        for rollout in rollouts:
            if rollout["rollout_index"] in kept:
                self.duplicates += 1
            else:
                kept[rollout["rollout_index"]] = rollout
        return [kept[index] for index in sorted(kept)]


class _Spill:
    """Partition files of spilled rollouts, one line each: ``[env, task index, rollout]``."""

    def __init__(self, parent: Path | None, memory: int) -> None:
        self.memory = memory
        self.root = Path(tempfile.mkdtemp(prefix=".verifiers-nemo-groups-", dir=parent))
        self._files: list[IO[bytes]] = [open(self.root / f"{i}.jsonl", "wb") for i in range(PARTITIONS)]  # noqa: SIM115

    def write(self, key: Key, rollout: dict[str, Any]) -> None:
        self._files[_partition(key, 0)].write(dumps([key[0], key[1], rollout]) + b"\n")

    def groups(self) -> Iterator[list[dict[str, Any]]]:
        """Each spilled task's rollouts (as written), partition by partition."""
        for handle in self._files:
            handle.close()
        for i in range(PARTITIONS):
            yield from _drain(self.root / f"{i}.jsonl", self.memory, depth=1)

    def remove(self) -> None:
        for handle in self._files:
            handle.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _drain(path: Path, memory: int, depth: int) -> Iterator[list[dict[str, Any]]]:
    """The tasks of one partition file, in task order; a file that would take more than ``memory`` once read (its
    JSON is several times smaller than the objects it makes) is split again first."""
    if path.stat().st_size * IN_MEMORY > memory and depth < 8:
        parts = [path.with_name(f"{path.stem}.{i}.jsonl") for i in range(PARTITIONS)]
        handles = [open(part, "wb") for part in parts]  # noqa: SIM115
        try:
            with open(path, "rb") as source:
                for line in source:
                    env, task, _ = loads(line)
                    handles[_partition((env, task), depth)].write(line)
        finally:
            for handle in handles:
                handle.close()
        os.unlink(path)
        for part in parts:
            yield from _drain(part, memory, depth + 1)
        return
    tasks: dict[Key, list[dict[str, Any]]] = {}
    with open(path, "rb") as source:
        for line in source:
            env, task, rollout = loads(line)
            tasks.setdefault((env, task), []).append(rollout)
    os.unlink(path)
    for key in sorted(tasks, key=lambda k: (str(k[0]), k[1])):
        yield tasks.pop(key)


def _partition(key: Key, depth: int) -> int:
    return zlib.crc32(f"{depth}\0{key[0]}\0{key[1]}".encode()) % PARTITIONS
