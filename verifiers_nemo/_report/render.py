"""One self-contained HTML file from loaded runs: a jinja2 template, the plotly.js bundle, the figures (from
each run's streamed tally) and the shown rollouts as compact JSON (their transcripts gzip-compressed, unpacked
by the browser when first opened). The rollouts are read back one at a time while the file is written, so it
opens with no network and neither it nor its writing grows past the rollouts it shows."""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from . import figures
from .details import DetailsWriter, clean
from .errors import ReportError
from .records import Rollout
from .runs import Run
from .stats import compare
from .tally import ScopeTally

ROW_COLUMNS = [
    "run",
    "env",
    "task",
    "rollout",
    "reward",
    "status",
    "kind",
    "turns",
    "tools",
    "tokens_in",
    "tokens_out",
    "latency",
]
ALL = "all environments"


def _scopes(runs: Sequence[Run]) -> list[str]:
    envs = sorted({env for run in runs for env in run.envs})
    return [ALL, *envs] if len(envs) > 1 else envs


def _in_scope(run: Run, scope: str) -> ScopeTally | None:
    return run.tally.overall if scope == ALL else run.tally.by_env.get(scope)


def _overview_of(runs: Sequence[Run], scope: str) -> dict[str, Any]:
    present = [(run, tally) for run in runs if (tally := _in_scope(run, scope)) is not None and tally.rollouts]
    stats = [(run, tally.overview()) for run, tally in present]
    labels = [(f"{chr(65 + runs.index(run))}: " if len(runs) > 1 else "") + run.label for run, _ in present]
    letters = {id(run): chr(65 + runs.index(run)) for run, _ in present}  # plots name runs A, B, ...
    figs: dict[str, Any] = {
        "reward": figures.reward_distribution([(letters[id(run)], tally.reward) for run, tally in present]),
        "pass": figures.pass_curves([(letters[id(run)], s["pass"]) for run, s in stats], present[0][0].pass_threshold),
    }
    if any(s["metrics"] for _, s in stats):
        figs["metrics"] = figures.metric_means([(letters[id(run)], s["metrics"]) for run, s in stats])
    if any(s["errors"] or s["masked_by_kind"] for _, s in stats):
        figs["failures"] = figures.failures([(letters[id(run)], s["errors"], s["masked_by_kind"]) for run, s in stats])
    latency = [(letters[id(run)], tally.latency) for run, tally in present]
    if any(values.count for _, values in latency):
        figs["latency"] = figures.distribution(latency, "Rollout latency", "seconds")
    calls = [(letters[id(run)], tally.call_latency) for run, tally in present]
    if any(values.count for _, values in calls):
        figs["call_latency"] = figures.distribution(calls, "Policy call latency", "seconds")
    tokens = [(letters[id(run)], tally.output_tokens) for run, tally in present]
    if any(values.weighted(skip_zero=True) for _, values in tokens):
        figs["tokens"] = figures.distribution(
            tokens, "Output tokens per rollout", "tokens", counts=True, skip_zero=True
        )
    figs["turns"] = figures.distribution(
        [(letters[id(run)], tally.turns) for run, tally in present], "Policy calls per rollout", "calls", counts=True
    )
    return {"labels": labels, "stats": [s for _, s in stats], "figs": figs}


def _row(run_index: int, rollout: Rollout) -> list[Any]:
    return [
        run_index,
        rollout.env,
        rollout.task,
        rollout.rollout_index,
        None if rollout.reward is None else round(rollout.reward, 6),
        rollout.status,
        rollout.kind,
        rollout.turns,
        rollout.tool_calls,
        rollout.input_tokens,
        rollout.output_tokens,
        None if rollout.latency_s is None else round(rollout.latency_s, 3),
    ]


def _detail(rollout: Rollout) -> dict[str, Any]:
    detail = dict(rollout.transcript)
    if rollout.metrics:
        detail["met"] = {k: round(v, 6) for k, v in rollout.metrics.items()}
    if rollout.message:
        detail["msg"] = rollout.message
    if rollout.recorded_reward is not None:
        detail["rec"] = rollout.recorded_reward
    return detail


def _script_json(value: Any) -> str:
    """JSON safe inside a <script> element."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def judge_note(runs: Sequence[Run]) -> str | None:
    """What the judge section says besides its table: that no judge call was recorded (when none of the runs has
    one), and that vf-eval's traces keep none (only where a run is a vf-eval one)."""
    parts = [] if any(run.judges for run in runs) else ["No judge calls were recorded."]
    vf_eval = [run.label for run in runs if run.source == "vf-eval"]
    if vf_eval:
        parts.append(f"vf-eval's traces do not record judge calls ({', '.join(vf_eval)}).")
    return " ".join(parts) or None


_DETAILS_MARK = "\x00details\x00"


def write_html(runs: Sequence[Run], output: Path, *, title: str | None = None, notes: list[str] | None = None) -> int:
    """Write the report of ``runs`` (the first is the baseline of comparisons) to ``output``; returns how many
    rollouts it shows. What the reader should know about the comparisons is added to ``notes``."""
    import jinja2
    import plotly.offline

    scopes = _scopes(runs)
    comparisons = []
    for other in runs[1:]:
        try:
            comparison = compare(runs[0], other)
        except ReportError as exc:  # nothing in common: shown side by side, not compared
            comparisons.append({"a": runs[0].label, "b": other.label, "error": str(exc)})
            if notes is not None:
                notes.append(str(exc))
            continue
        comparison["fig"] = figures.task_scatter(comparison, chr(65 + len(comparisons) + 1))
        comparisons.append(comparison)
        if notes is not None:
            notes.extend(f"{other.label} vs {runs[0].label}: {note}" for note in comparison["notes"])
    rows: list[list[Any]] = []
    with DetailsWriter() as details:
        shown = []
        for index, run in enumerate(runs):
            for rollout in run.shown(details.strings):
                rows.append(_row(index, rollout))
                details.add(_detail(rollout))
            shown.append(len(rows) - sum(shown))
        details.finish()
        data = {
            "runs": [
                {
                    "label": run.label,
                    "source": run.source,
                    "info": run.info,
                    "notes": run.notes,
                    "judges": run.judges,
                    "threshold": run.pass_threshold,
                    "rollouts": run.total,
                    "shown": count,
                    "choice": run.choice.describe(count),
                }
                for run, count in zip(runs, shown, strict=True)
            ],
            "judge_note": judge_note(runs),
            "scopes": scopes,
            "overview": {scope: _overview_of(runs, scope) for scope in scopes},
            "compare": comparisons,
            "columns": ROW_COLUMNS,
            "rows": rows,
        }
        here = resources.files(__package__)
        environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
        template = environment.from_string((here / "templates" / "report.html.j2").read_text())
        total = sum(run.total for run in runs)
        html = template.render(
            title=title or ("Eval report: " + " vs ".join(run.label for run in runs)),
            css=(here / "templates" / "report.css").read_text(),
            js=(here / "templates" / "report.js").read_text(),
            data=_script_json(clean(data)),
            details=_DETAILS_MARK,
            plotly=_packed_text(plotly.offline.get_plotlyjs()),
            rollouts=f"{len(rows):,}" if len(rows) == total else f"{len(rows):,} of {total:,}",
        )
        head, tail = html.split(_DETAILS_MARK)
        with open(output, "w", encoding="utf-8") as out:
            out.write(head)
            for chunk in details.base64_chunks():
                out.write(chunk)
            out.write(tail)
    return len(rows)


def _packed_text(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=9, mtime=0)).decode("ascii")
