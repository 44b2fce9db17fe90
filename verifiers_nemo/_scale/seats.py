"""The live workers of one environment, bucketed by rollouts in flight: the least-loaded one in time that
does not grow with the number of workers (a pool of 1,000 Ray actors picks one per rollout)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .handles import WorkerHandle


@dataclass(eq=False)
class Seat:
    """A worker as the dispatcher sees it."""

    handle: WorkerHandle
    in_flight: int = 0
    done: int = 0
    alive: bool = True
    info: dict[str, Any] | None = None


class Seats:
    """Live seats by load. ``take`` the least-loaded (ties: the one that waited longest at that load),
    ``give_back`` when its rollout ends, ``drop`` a dead one. Each is O(distinct loads), not O(seats)."""

    def __init__(self) -> None:
        self._by_load: dict[int, dict[int, Seat]] = {}

    def add(self, seat: Seat) -> None:
        self._by_load.setdefault(seat.in_flight, {})[id(seat)] = seat

    def take(self, avoid: Sequence[Seat] = ()) -> Seat | None:
        """The least-loaded live seat not in ``avoid`` (else one in ``avoid``), its load counted up."""
        fallback = None
        for load in sorted(self._by_load):
            for seat in self._by_load[load].values():
                if seat not in avoid:
                    self._move(seat, +1)
                    return seat
                fallback = fallback or seat
        if fallback is not None:
            self._move(fallback, +1)
        return fallback

    def give_back(self, seat: Seat) -> None:
        """The seat's rollout ended (a dropped seat only has its count corrected)."""
        if seat.alive:
            self._move(seat, -1)
        else:
            seat.in_flight -= 1

    def drop(self, seat: Seat) -> None:
        """The seat is dead: never taken again."""
        bucket = self._by_load.get(seat.in_flight, {})
        bucket.pop(id(seat), None)
        if not bucket:
            self._by_load.pop(seat.in_flight, None)

    def _move(self, seat: Seat, step: int) -> None:
        self.drop(seat)
        seat.in_flight += step
        self.add(seat)
