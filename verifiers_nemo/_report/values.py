"""A distribution of the report (rewards, latencies, tokens, policy calls per rollout) taken one value at a time,
in space that does not grow with the values.

Count, mean, standard deviation, min and max are exact (``_eval.exact``). The values themselves are held as an
exact multiset while they have at most ``DISTINCT_LIMIT`` distinct values (rewards, calls per rollout: exact at
any size), else as a list up to ``SAMPLE_SIZE`` values and beyond that as a uniform sample of that many (a seeded
reservoir: the same run gives the same sample). Quantiles and histograms read what is held; ``sampled`` says
when that is a sample, so a figure can say so.
"""

from __future__ import annotations

import random
from array import array
from collections import Counter
from collections.abc import Iterable

from .._eval.exact import Spread

SAMPLE_SIZE = 100_000
"""Values held for quantiles and histograms; beyond this many, a uniform sample of this many."""
DISTINCT_LIMIT = 1_000
"""Distinct values kept as an exact multiset (whatever the count)."""
SAMPLE_SEED = 0


class ValueTally:
    """One distribution, streamed (see the module)."""

    __slots__ = ("_counts", "_random", "_values", "sample_size", "spread")

    def __init__(self, sample_size: int = SAMPLE_SIZE) -> None:
        self.sample_size = sample_size
        self.spread = Spread()
        self._counts: Counter[float] | None = Counter()
        self._values = array("d")
        self._random: random.Random | None = None

    @classmethod
    def of(cls, values: Iterable[float]) -> ValueTally:
        tally = cls()
        for value in values:
            tally.add(value)
        return tally

    @property
    def count(self) -> int:
        return self.spread.count

    def add(self, value: float) -> None:
        self.spread.add(value)
        if self._counts is not None:
            self._counts[value] += 1
            if len(self._counts) > DISTINCT_LIMIT:
                self._values = self._sample_of(self._counts)
                self._counts = None
            return
        seen = self.spread.count
        if seen <= self.sample_size:
            self._values.append(value)
            return
        slot = self._rng().randrange(seen)  # reservoir sampling: each value stays with chance size / seen
        if slot < self.sample_size:
            self._values[slot] = value

    def _rng(self) -> random.Random:
        if self._random is None:
            self._random = random.Random(SAMPLE_SEED)
        return self._random

    def _sample_of(self, counts: Counter[float]) -> array[float]:
        """The values of ``counts`` (a multiset of ``count`` values): all of them, or a uniform sample."""
        total = self.spread.count
        if total <= self.sample_size:
            return array("d", (v for v, c in counts.items() for _ in range(c)))
        picked = sorted(self._rng().sample(range(total), self.sample_size))
        out, pairs, start = array("d"), iter(counts.items()), 0
        value, count = next(pairs)
        for index in picked:
            while index >= start + count:
                start += count
                value, count = next(pairs)
            out.append(value)
        return out

    @property
    def sampled(self) -> bool:
        """Whether ``weighted()`` holds a uniform sample rather than every value."""
        return self._counts is None and self.count > self.sample_size

    @property
    def held(self) -> int:
        """How many values ``weighted()`` stands for (all of them, or the sample's size)."""
        return self.sample_size if self.sampled else self.count

    def weighted(self, *, skip_zero: bool = False) -> list[tuple[float, int]]:
        """``(value, count)`` in ascending order: every value, or the sample's."""
        counts = self._counts if self._counts is not None else Counter(self._values)
        return sorted((v, c) for v, c in counts.items() if not (skip_zero and v == 0))

    def quantiles(self) -> dict[str, float] | None:
        """Mean and max (exact), p50/p90/p99 (of the sample when ``sampled``: then ``sample`` says its size)."""
        if not self.count:
            return None
        pairs = self.weighted()
        held = sum(count for _, count in pairs)
        out: dict[str, float] = {"mean": self.spread.sum.mean(), "p50": 0.0, "p90": 0.0, "p99": 0.0}  # type: ignore[dict-item]
        for name, p in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
            out[name] = nth(pairs, min(held - 1, int(p * (held - 1) + 0.5)))
        out["max"] = self.spread.max  # type: ignore[assignment]
        if self.sampled:
            out["sample"] = self.sample_size
        return out


def nth(pairs: list[tuple[float, int]], index: int) -> float:
    """The ``index``-th value (from 0) of the ascending multiset ``pairs``."""
    for value, count in pairs:
        if index < count:
            return value
        index -= count
    raise IndexError(index)
