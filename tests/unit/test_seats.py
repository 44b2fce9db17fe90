"""The pool's choice of a worker: least loaded first, ties in turn, dead workers never chosen."""

from __future__ import annotations

from types import SimpleNamespace

from verifiers_nemo._scale.seats import Seat, Seats


def seat(name: str, load: int = 0) -> Seat:
    return Seat(SimpleNamespace(env="a", label=name), in_flight=load)  # type: ignore[arg-type]


def test_the_least_loaded_seat_is_taken_and_equal_loads_take_turns() -> None:
    a, b, c = seat("a"), seat("b"), seat("c", load=3)
    seats = Seats()
    for s in (a, b, c):
        seats.add(s)
    taken = [seats.take() for _ in range(4)]
    assert [s.handle.label for s in taken] == ["a", "b", "a", "b"]  # type: ignore[union-attr]
    assert (a.in_flight, b.in_flight, c.in_flight) == (2, 2, 3)
    seats.give_back(a)
    assert seats.take() is a


def test_a_seat_to_avoid_is_taken_only_when_it_is_the_only_one_left() -> None:
    a, b = seat("a"), seat("b", load=5)
    seats = Seats()
    seats.add(a)
    seats.add(b)
    assert seats.take(avoid=[a]) is b
    seats.drop(b)
    assert seats.take(avoid=[a]) is a


def test_a_dropped_seat_is_never_taken_and_its_count_still_comes_down() -> None:
    a, b = seat("a"), seat("b")
    seats = Seats()
    seats.add(a)
    seats.add(b)
    first = seats.take()
    assert first is a
    seats.drop(a)
    a.alive = False
    assert [seats.take() for _ in range(3)] == [b, b, b]
    seats.give_back(a)
    assert a.in_flight == 0
    seats.drop(b)
    assert seats.take() is None
