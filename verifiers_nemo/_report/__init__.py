"""``verifiers-nemo report``: one self-contained HTML file from saved eval runs, and their export to
inspect-ai's log format, in memory that does not grow with the rollouts.

``runs`` (our run folders and verifiers' ``traces.jsonl``: ``source`` streams them a ``Rollout`` at a time,
``records`` reads each) → ``tally`` (every figure's numbers, per run and environment; ``values`` for the
distributions, ``stats`` for intervals, pass@k and runs compared per task) and ``selection`` (the rollouts the
report embeds: all of a small run) → ``figures`` (plotly) → ``render`` (the HTML, with a jinja2 template; the
shown rollouts' transcripts stream through ``details``) ; ``inspect_log`` writes an inspect-ai ``.eval`` log
(the ``inspect`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .errors import ReportError
from .records import Rollout
from .runs import Run, load_run
from .selection import DEFAULT_MAX_ROLLOUTS

REPORT_PACKAGES = ("plotly", "jinja2")
REPORT_EXTRA = "pip install 'verifiers-nemo[report]'"

__all__ = [
    "DEFAULT_MAX_ROLLOUTS",
    "REPORT_EXTRA",
    "ReportError",
    "ReportFile",
    "Rollout",
    "Run",
    "load_run",
    "missing_report_packages",
    "write_report",
]


@dataclass
class ReportFile:
    """A written report: where, how big, what it holds, and what the reader should know."""

    path: Path
    bytes: int
    rollouts: int
    shown: int
    """Rollouts in its table, with their transcripts (all of them unless a run has more than ``max_rollouts``)."""
    runs: list[Run]
    notes: list[str] = field(default_factory=list)


def missing_report_packages() -> list[str]:
    """The report's libraries not installed here (empty when it can be built)."""
    from importlib.util import find_spec

    return [name for name in REPORT_PACKAGES if find_spec(name) is None]


def write_report(
    paths: list[Path], output: Path, *, title: str | None = None, max_rollouts: int | None = DEFAULT_MAX_ROLLOUTS
) -> ReportFile:
    """Read the runs at ``paths`` (the first is the baseline of comparisons) and write their report to
    ``output``, showing at most ``max_rollouts`` rollouts of each run (None: all; the figures count all).
    Raises ReportError for input it cannot use."""
    from .render import write_html

    runs = [load_run(Path(p), max_rollouts=max_rollouts, keep_tasks=len(paths) > 1) for p in paths]
    labels = [run.label for run in runs]
    for position, run in enumerate(runs):  # two folders of the same name stay apart
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({chr(65 + position)})"
    notes: list[str] = [f"{run.label}: {note}" for run in runs for note in run.notes]
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    try:
        shown = write_html(runs, tmp, title=title, notes=notes)
        tmp.replace(output)
    finally:
        tmp.unlink(missing_ok=True)
    return ReportFile(output, output.stat().st_size, sum(run.total for run in runs), shown, runs, notes)
