"""The ``verifiers-nemo`` command line.

``main`` (entry point) → ``parser`` (commands and flags) → one module per command: ``eval``
(with ``settings``: flags → ``EvalSettings``, and ``progress``), ``envs``, ``replay_server``;
``console`` holds the stderr messages, logging and exit codes they share.
"""

from .main import main
from .parser import build_parser
from .settings import new_settings, resumed_settings

__all__ = ["build_parser", "main", "new_settings", "resumed_settings"]
