"""``verifiers-nemo report`` (one HTML file from saved runs); ``eval -s --report`` writes it at the end of a run."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .._report.selection import DEFAULT_MAX_ROLLOUTS
from .console import EXIT_FAILED, EXIT_OK, fail, say

REPORT_FILE = "report.html"


def report_unavailable() -> str | None:
    """Why no report can be built here (its extra is not installed), else None."""
    from .._report import REPORT_EXTRA, missing_report_packages

    missing = missing_report_packages()
    if missing:
        return f"the report needs {', '.join(missing)}, not installed here: {REPORT_EXTRA}"
    return None


def cmd_report(args: argparse.Namespace) -> int:
    unavailable = report_unavailable()
    if unavailable:
        return fail(unavailable)
    runs: list[Path] = args.runs
    output: Path = args.output or (_run_folder(runs[0]) / REPORT_FILE if len(runs) == 1 else Path(REPORT_FILE))
    return write_and_tell(runs, output, title=args.title, max_rollouts=args.max_rollouts)


def _run_folder(path: Path) -> Path:
    return path.parent if path.is_file() else path


def write_and_tell(
    runs: list[Path], output: Path, *, title: str | None = None, max_rollouts: int = DEFAULT_MAX_ROLLOUTS
) -> int:
    """Write the report and say where it is (or one clear error)."""
    from .._report import ReportError, write_report

    started = time.monotonic()
    try:
        report = write_report(runs, output, title=title, max_rollouts=max_rollouts)
    except ReportError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(
            f"cannot write the report to {output}: {exc.strerror or exc} (pass -o PATH somewhere writable)", EXIT_FAILED
        )
    for note in report.notes:
        say(f"note: {note}")
    for run in report.runs:
        chosen = run.choice.describe(len(run.choice.chosen()))
        if chosen:
            say(f"note: {run.label}: its rollout table shows {chosen}; the figures count all (--max-rollouts N: more)")
    say(
        f"Report of {report.rollouts:,} rollouts ({len(report.runs)} run{'s' if len(report.runs) > 1 else ''}, "
        f"{report.bytes / 1e6:.1f} MB, {time.monotonic() - started:.1f}s); open it in a browser:"
    )
    print(report.path.resolve().as_uri(), flush=True)
    return EXIT_OK
