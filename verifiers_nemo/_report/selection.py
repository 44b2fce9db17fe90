"""Which rollouts of a run the report embeds (its rollout table and transcripts), chosen while the run is read.

A run of at most ``limit`` rollouts is shown whole, in file order. A larger one shows ``limit`` rollouts of whole
tasks picked at random: the tasks whose fixed hash of (environment, task) is lowest, so the same tasks are shown
in every run of them and in every report (runs compared show the same tasks side by side), whatever order the file
is in; a task with more rollouts than fit gives its lowest-numbered ones. On top, up to ``KIND_EXAMPLES`` of each
error type and masked kind (the same way), so every failure has examples to open. What is kept while reading is
where each chosen rollout is, never the rollout itself.
"""

from __future__ import annotations

import hashlib
import heapq
from typing import Any

from .records import Rollout

DEFAULT_MAX_ROLLOUTS = 10_000
"""Rollouts of a run the report embeds unless told otherwise (``--max-rollouts``)."""
KIND_EXAMPLES = 20
"""Rollouts of each error type and masked kind embedded besides the chosen tasks."""
MAX_KINDS = 100
"""Failure kinds given examples (the first ones seen)."""

_Entry = tuple[int, int, int, Any]
"""(-task hash, -rollout index, -arrival, where): a max-heap of the lowest ranks."""


def task_hash(env: str, task: str) -> int:
    """A fixed 64-bit hash of a task (the same in every process and every run)."""
    return int.from_bytes(hashlib.blake2b(f"{env}\0{task}".encode(), digest_size=8).digest(), "big")


class RolloutChoice:
    """The rollouts to embed, offered one at a time in file order (``limit`` None: every one)."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.offered = 0
        self._main: list[_Entry] = []
        self._kinds: dict[str, list[_Entry]] = {}
        self._last_task: tuple[str, str, int] | None = None

    def offer(self, rollout: Rollout, where: Any) -> None:
        """Consider ``rollout`` (found at ``where``)."""
        arrival = self.offered
        self.offered += 1
        if self.limit is None:
            self._main.append((0, 0, -arrival, where))
            return
        entry = (-self._hash(rollout), -rollout.rollout_index, -arrival, where)
        _keep_lowest(self._main, entry, self.limit)
        if rollout.status != "scored" and rollout.kind is not None and self.limit:
            kind = f"{rollout.status}: {rollout.kind}"
            kept = self._kinds.get(kind)
            if kept is None and len(self._kinds) < MAX_KINDS:
                kept = self._kinds[kind] = []
            if kept is not None:
                _keep_lowest(kept, entry, KIND_EXAMPLES)

    def _hash(self, rollout: Rollout) -> int:
        last = self._last_task  # a task's rollouts often come together: hash it once for them
        if last is None or last[0] != rollout.env or last[1] != rollout.task:
            last = self._last_task = (rollout.env, rollout.task, task_hash(rollout.env, rollout.task))
        return last[2]

    @property
    def whole(self) -> bool:
        """Whether every rollout offered is chosen."""
        return self.limit is None or self.offered <= self.limit

    def chosen(self) -> list[Any]:
        """Where each chosen rollout is, in file order."""
        entries = {-arrival: where for _, _, arrival, where in self._main}
        if not self.whole:
            for kept in self._kinds.values():
                entries.update((-arrival, where) for _, _, arrival, where in kept)
        return [entries[arrival] for arrival in sorted(entries)]

    def describe(self, shown: int) -> str | None:
        """Which ``shown`` rollouts of the run these are and how they were chosen ("N of M rollouts: ..."), None
        when they are all of them."""
        if self.whole:
            return None
        chosen = min(self.limit or 0, self.offered)
        if not chosen:
            return f"{shown:,} of {self.offered:,} rollouts (--max-rollouts 0: the figures only)"
        text = (
            f"{shown:,} of {self.offered:,} rollouts: {chosen:,} of whole tasks picked at random (a fixed hash of "
            "environment and task, so the same tasks in every run and every report)"
        )
        if shown > chosen:
            extra = shown - chosen
            text += f", plus {extra:,} so that each error type and masked kind has up to {KIND_EXAMPLES} examples"
        return text


def _keep_lowest(heap: list[_Entry], entry: _Entry, size: int) -> None:
    if len(heap) < size:
        heapq.heappush(heap, entry)
    elif size and entry > heap[0]:
        heapq.heapreplace(heap, entry)
