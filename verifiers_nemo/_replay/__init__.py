"""The replay policy: an environment's recorded rollouts (``recordings``) played back by a local
Responses server (``server``: ``ReplayServer``), judge calls answered from the recorded judge I/O
(``judge_book``), and the standalone ``replay-server`` command's serving loop (``serve``)."""

from .recordings import (
    JUDGE_UNREPRODUCIBLE,
    KNOWN_UNREPRODUCIBLE,
    PACKAGES_UNREPRODUCIBLE,
    REPLAY_MODEL,
    ROW_HEADER,
    Recording,
    unreproducible_reason,
)
from .server import ReplayServer

__all__ = [
    "JUDGE_UNREPRODUCIBLE",
    "KNOWN_UNREPRODUCIBLE",
    "PACKAGES_UNREPRODUCIBLE",
    "REPLAY_MODEL",
    "ROW_HEADER",
    "Recording",
    "ReplayServer",
    "unreproducible_reason",
]
