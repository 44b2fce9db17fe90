"""The ``verifiers-nemo`` command: ``eval`` (a ``prime eval run``-style evaluation) and ``envs``.

The CLI owns the console: progress and messages go to stderr, the summary to stdout. Library code
only logs. Heavy modules are imported after the arguments are checked, so bad input fails fast.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from .console import EXIT_OK, say, setup_logging
from .parser import build_parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``verifiers-nemo`` console script."""
    args = build_parser().parse_args(argv)
    setup_logging(args.verbose)
    if getattr(args, "gym_root", None):
        from .._gym import GYM_ROOT_VAR

        given = [os.path.abspath(os.path.expanduser(d)) for d in args.gym_root]
        os.environ[GYM_ROOT_VAR] = os.pathsep.join([*given, *filter(None, [os.environ.get(GYM_ROOT_VAR)])])
    from .._offline.folder import OFFLINE_DIR_VAR, network_off_env

    if getattr(args, "offline_dir", None):
        os.environ[OFFLINE_DIR_VAR] = os.path.abspath(os.path.expanduser(args.offline_dir))
    for name, value in network_off_env().items():  # offline: this process's own Hugging Face and pip too
        os.environ.setdefault(name, value)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        say("interrupted")
        return 130
    except BrokenPipeError:  # e.g. `verifiers-nemo envs | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
