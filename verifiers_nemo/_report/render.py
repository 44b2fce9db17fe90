"""One self-contained HTML file from loaded runs: a jinja2 template, the plotly.js bundle, the figures
and every rollout as compact JSON (transcripts gzip-compressed, unpacked by the browser when first
opened), so it opens with no network and stays small for 10,000 rollouts."""

from __future__ import annotations

import base64
import gzip
import json
import math
from collections.abc import Sequence
from importlib import resources
from typing import Any

from . import figures
from .runs import ReportError, Rollout, Run
from .stats import compare, overview
from .transcript import Strings

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


def _in_scope(run: Run, scope: str) -> list[Rollout]:
    return run.rollouts if scope == ALL else [r for r in run.rollouts if r.env == scope]


def _overview_of(runs: Sequence[Run], scope: str) -> dict[str, Any]:
    present = [(run, _in_scope(run, scope)) for run in runs]
    present = [(run, rollouts) for run, rollouts in present if rollouts]
    stats = [(run, overview(rollouts, run.pass_threshold)) for run, rollouts in present]
    labels = [(f"{chr(65 + runs.index(run))}: " if len(runs) > 1 else "") + run.label for run, _ in present]
    letters = {id(run): chr(65 + runs.index(run)) for run, _ in present}  # plots name runs A, B, ...
    figs: dict[str, Any] = {
        "reward": figures.reward_distribution([(letters[id(run)], rollouts) for run, rollouts in present]),
        "pass": figures.pass_curves([(letters[id(run)], s["pass"]) for run, s in stats], present[0][0].pass_threshold),
    }
    if any(s["metrics"] for _, s in stats):
        figs["metrics"] = figures.metric_means([(letters[id(run)], s["metrics"]) for run, s in stats])
    if any(s["errors"] or s["masked_by_kind"] for _, s in stats):
        figs["failures"] = figures.failures([(letters[id(run)], s["errors"], s["masked_by_kind"]) for run, s in stats])
    latency = [
        (letters[id(run)], [r.latency_s for r in rollouts if r.latency_s is not None]) for run, rollouts in present
    ]
    if any(values for _, values in latency):
        figs["latency"] = figures.distribution(latency, "Rollout latency", "seconds")
    calls = [(letters[id(run)], [x for r in rollouts for x in r.call_latencies]) for run, rollouts in present]
    if any(values for _, values in calls):
        figs["call_latency"] = figures.distribution(calls, "Policy call latency", "seconds")
    tokens = [
        (letters[id(run)], [float(r.output_tokens) for r in rollouts if r.output_tokens]) for run, rollouts in present
    ]
    if any(values for _, values in tokens):
        figs["tokens"] = figures.distribution(tokens, "Output tokens per rollout", "tokens", counts=True)
    figs["turns"] = figures.distribution(
        [(letters[id(run)], [float(r.turns) for r in rollouts]) for run, rollouts in present],
        "Policy calls per rollout",
        "calls",
        counts=True,
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
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_finite)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _finite(value: Any) -> Any:
    raise TypeError(f"not JSON: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN and infinities as null (JSON has none)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _packed(value: Any) -> str:
    raw = json.dumps(_clean(value), ensure_ascii=False, separators=(",", ":")).encode()
    return base64.b64encode(gzip.compress(raw, compresslevel=6, mtime=0)).decode("ascii")


def judge_note(runs: Sequence[Run]) -> str | None:
    """What the judge section says besides its table: that no judge call was recorded (when none of the runs has
    one), and that vf-eval's traces keep none (only where a run is a vf-eval one)."""
    parts = [] if any(run.judges for run in runs) else ["No judge calls were recorded."]
    vf_eval = [run.label for run in runs if run.source == "vf-eval"]
    if vf_eval:
        parts.append(f"vf-eval's traces do not record judge calls ({', '.join(vf_eval)}).")
    return " ".join(parts) or None


def build_html(
    runs: Sequence[Run], strings: Strings, *, title: str | None = None, notes: list[str] | None = None
) -> str:
    """The report of ``runs`` (the first is the baseline of comparisons) as one HTML document.

    ``strings`` is the table the runs' transcripts refer to (shared when loading them); what the
    reader should know about the comparisons is added to ``notes``."""
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
    data = {
        "runs": [
            {
                "label": run.label,
                "source": run.source,
                "info": run.info,
                "notes": run.notes,
                "judges": run.judges,
                "threshold": run.pass_threshold,
                "rollouts": len(run.rollouts),
            }
            for run in runs
        ],
        "judge_note": judge_note(runs),
        "scopes": scopes,
        "overview": {scope: _overview_of(runs, scope) for scope in scopes},
        "compare": comparisons,
        "columns": ROW_COLUMNS,
        "rows": [_row(i, r) for i, run in enumerate(runs) for r in run.rollouts],
    }
    details = {"S": strings.items, "D": [_detail(r) for run in runs for r in run.rollouts]}
    here = resources.files(__package__)
    environment = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = environment.from_string((here / "templates" / "report.html.j2").read_text())
    plotly_js = plotly.offline.get_plotlyjs()
    return template.render(
        title=title or ("Eval report: " + " vs ".join(run.label for run in runs)),
        css=(here / "templates" / "report.css").read_text(),
        js=(here / "templates" / "report.js").read_text(),
        data=_script_json(_clean(data)),
        details=_packed(details),
        plotly=_packed_text(plotly_js),
        rollouts=len(data["rows"]),
    )


def _packed_text(text: str) -> str:
    return base64.b64encode(gzip.compress(text.encode(), compresslevel=9, mtime=0)).decode("ascii")
