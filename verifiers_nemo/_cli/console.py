"""The CLI's console: messages on stderr (safe while a progress bar is drawn), log records shown the
same way, and the program name and exit codes. The summary goes to stdout; library code only logs."""

from __future__ import annotations

import logging
import sys

PROG = "verifiers-nemo"
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def say(message: str) -> None:
    """A message for the user on stderr (safe while a progress bar is drawn)."""
    try:
        from tqdm import tqdm

        tqdm.write(message, file=sys.stderr)
    except ImportError:  # pragma: no cover
        print(message, file=sys.stderr)


def fail(message: str, code: int = EXIT_USAGE) -> int:
    say(f"{PROG}: error: {message}")
    return code


class _TqdmHandler(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            say(self.format(record))
        except Exception:  # pragma: no cover - logging must never raise
            self.handleError(record)


def setup_logging(verbose: int) -> None:
    handler = _TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    logging.getLogger("verifiers_nemo").setLevel(level)
    # Installing an environment's extra requirements takes a while, once: say so at any verbosity.
    logging.getLogger("verifiers_nemo._gym.derived_env").setLevel(min(level, logging.INFO))
