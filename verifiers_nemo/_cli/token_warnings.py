"""Console warnings of an exact-token run whose rollouts are not token-contiguous: the first few as they finish
(the summary's ``Token IDs`` line counts them all)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .._eval.token_ids import break_warning


class TokenBreakWarnings:
    """Feed it each result line of an ``--exact-tokens`` run; it warns through ``say`` for the first ``shown``
    rollouts that broke, then once that the summary counts the rest."""

    def __init__(self, say: Callable[[str], None], shown: int = 3) -> None:
        self.say = say
        self.shown = shown
        self.count = 0

    def check(self, record: Mapping[str, Any]) -> None:
        warning = break_warning(record)
        if warning is None:
            return
        self.count += 1
        if self.count <= self.shown:
            self.say(warning)
        if self.count == self.shown:
            self.say("warning: exact tokens: further breaks are only counted in the summary (Token IDs)")
