"""``verifiers-nemo report``: one self-contained HTML file from saved eval runs, and their export to
inspect-ai's log format.

``runs`` (our run folders and verifiers' ``traces.jsonl``, read into one ``Rollout`` shape) →
``stats`` (overview numbers, runs compared per task) → ``figures`` (plotly) → ``render`` (the HTML,
with a jinja2 template) ; ``inspect_log`` writes an inspect-ai ``.eval`` log (the ``inspect`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .runs import ReportError, Rollout, Run, load_run
from .transcript import Strings

REPORT_PACKAGES = ("plotly", "jinja2")
REPORT_EXTRA = "pip install 'verifiers-nemo[report]'"

__all__ = [
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
    runs: list[Run]
    notes: list[str] = field(default_factory=list)


def missing_report_packages() -> list[str]:
    """The report's libraries not installed here (empty when it can be built)."""
    from importlib.util import find_spec

    return [name for name in REPORT_PACKAGES if find_spec(name) is None]


def write_report(paths: list[Path], output: Path, *, title: str | None = None) -> ReportFile:
    """Read the runs at ``paths`` (the first is the baseline of comparisons) and write their report to
    ``output``. Raises ReportError for input it cannot use."""
    from .render import build_html

    strings = Strings()
    runs = [load_run(Path(p), strings) for p in paths]
    labels = [run.label for run in runs]
    for position, run in enumerate(runs):  # two folders of the same name stay apart
        if labels.count(run.label) > 1:
            run.label = f"{run.label} ({chr(65 + position)})"
    notes: list[str] = [f"{run.label}: {note}" for run in runs for note in run.notes]
    html = build_html(runs, strings, title=title, notes=notes)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(output)
    return ReportFile(output, output.stat().st_size, sum(len(r.rollouts) for r in runs), runs, notes)
