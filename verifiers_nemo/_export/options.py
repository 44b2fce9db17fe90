"""The training-data formats and how preference pairs are formed: names and defaults only (the CLI's parser reads
them before anything heavy is imported)."""

from __future__ import annotations

from typing import Literal

FORMATS = ("sft-tokens", "sft-messages", "preferences", "rollout-groups")
"""The training-data formats (``schema.COLUMNS`` has each one's columns)."""
GROUPED = ("preferences", "rollout-groups")
"""The formats that read a task's rollouts together."""
Pairing = Literal["best-worst", "best-rest", "all"]
PAIRINGS: tuple[Pairing, ...] = ("best-worst", "best-rest", "all")
DEFAULT_PAIRING: Pairing = "best-worst"
DEFAULT_MIN_GAP = 0.1
"""A pair's chosen reward is at least this much above its rejected one, by default (rewards of 0/1 or graded in
[0, 1]: a tenth of the range)."""
