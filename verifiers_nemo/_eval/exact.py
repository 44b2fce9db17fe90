"""Exact sums of floats taken one value at a time: a streamed mean is the one ``math.fsum`` gives over the list.

A finite float is ``numerator / 2**shift``; a sum of them is kept as one integer over the largest such power of
two seen, so adding is exact and the float of the sum is rounded once, as ``math.fsum`` rounds it. A run's
summary is then the same whether its records were held in a list or streamed past it."""

from __future__ import annotations

import math
from array import array
from fractions import Fraction


def _ratio(value: float) -> tuple[int, int]:
    """``value`` as ``(numerator, shift)`` with ``value == numerator / 2**shift``."""
    numerator, denominator = float(value).as_integer_ratio()
    return numerator, denominator.bit_length() - 1


class ExactSum:
    """The exact sum and count of the values added; a non-finite value makes the sum that value (or nan)."""

    __slots__ = ("_numerator", "_shift", "_special", "count")

    def __init__(self) -> None:
        self._numerator = 0
        self._shift = 0
        self._special: float | None = None
        self.count = 0

    def add(self, value: float) -> None:
        self.count += 1
        if not math.isfinite(value):
            self._special = value if self._special is None else self._special + value
            return
        self.add_ratio(*_ratio(value))

    def add_ratio(self, numerator: int, shift: int) -> None:
        """Add ``numerator / 2**shift`` (exactly; not counted)."""
        if shift > self._shift:
            self._numerator <<= shift - self._shift
            self._shift = shift
        self._numerator += numerator << (self._shift - shift)

    def merge(self, other: ExactSum) -> None:
        """Add the values ``other`` holds."""
        self.count += other.count
        if other._special is not None:
            self._special = other._special if self._special is None else self._special + other._special
        self.add_ratio(other._numerator, other._shift)

    def copy(self) -> ExactSum:
        twin = ExactSum()
        twin.merge(self)
        return twin

    @property
    def finite(self) -> bool:
        """Whether every value added was finite."""
        return self._special is None

    @property
    def fraction(self) -> Fraction:
        """The finite part of the sum, exactly."""
        return Fraction(self._numerator, 1 << self._shift)

    @property
    def total(self) -> float:
        """The sum rounded once to a float (``math.fsum`` of the values)."""
        if self._special is not None:
            return self._special
        return self._numerator / (1 << self._shift)

    def mean(self) -> float | None:
        """``total / count`` (None for no values)."""
        return self.total / self.count if self.count else None


class Spread:
    """Mean, population standard deviation, min and max of a stream of floats, in constant space."""

    __slots__ = ("_squares", "max", "min", "sum")

    def __init__(self) -> None:
        self.sum = ExactSum()
        self._squares = ExactSum()
        self.min: float | None = None
        self.max: float | None = None

    def add(self, value: float) -> None:
        self.sum.add(value)
        if math.isfinite(value):
            numerator, shift = _ratio(value)
            self._squares.add_ratio(numerator * numerator, 2 * shift)
        if self.min is None or value < self.min:
            self.min = value
        if self.max is None or value > self.max:
            self.max = value

    @property
    def count(self) -> int:
        return self.sum.count

    def pstdev(self) -> float | None:
        """The population standard deviation (as ``statistics.pstdev``: from the exact sums, rounded at the end)."""
        n = self.sum.count
        if not n:
            return None
        if not self.sum.finite:
            return math.nan
        mean = self.sum.fraction / n
        variance = self._squares.fraction / n - mean * mean
        return sqrt_of_fraction(variance)


def sqrt_of_fraction(value: Fraction) -> float:
    """The square root of a non-negative fraction, rounded once to the nearest float (as ``statistics.pstdev``
    rounds it; ``math.sqrt`` of the fraction's float would round twice)."""
    numerator, denominator = value.numerator, value.denominator
    if not numerator:
        return 0.0
    # root = isqrt(numerator / denominator * 4**shift) / 2**shift with at least 56 bits, its last bit set when
    # it is inexact (round to odd), so dividing by 2**shift rounds to the float nearest the true root.
    shift = max(0, (56 * 2 - numerator.bit_length() + denominator.bit_length()) // 2 + 1)
    scaled, rest = divmod(numerator << (2 * shift), denominator)
    root = math.isqrt(scaled)
    if rest or root * root != scaled:
        root |= 1
    return root / (1 << shift)


class ExactSums:
    """``ExactSum``s in slots ``0..len-1`` (e.g. a mean per rollout index), compactly: one integer and one count
    a slot, over one power of two they share."""

    def __init__(self) -> None:
        self._numerators: list[int] = []
        self._counts = array("q")
        self._shift = 0
        self._special: dict[int, float] = {}

    def __len__(self) -> int:
        return len(self._counts)

    def add(self, slot: int, value: float) -> None:
        while len(self._counts) <= slot:
            self._numerators.append(0)
            self._counts.append(0)
        self._counts[slot] += 1
        if not math.isfinite(value):
            self._special[slot] = self._special[slot] + value if slot in self._special else value
            return
        numerator, shift = _ratio(value)
        if shift > self._shift:
            grow = shift - self._shift
            self._numerators = [n << grow for n in self._numerators]
            self._shift = shift
        self._numerators[slot] += numerator << (self._shift - shift)

    def mean(self, slot: int) -> float | None:
        """The mean of a slot's values (None for none)."""
        if slot >= len(self._counts) or not self._counts[slot]:
            return None
        total = self._special[slot] if slot in self._special else self._numerators[slot] / (1 << self._shift)
        return total / self._counts[slot]
