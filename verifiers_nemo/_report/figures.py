"""The report's plots, built with plotly and embedded as figure JSON (drawn by the plotly.js bundled
in the file, so the report needs no network)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .runs import Rollout

COLORS = ["#3366cc", "#dc6b19", "#2e9e5b", "#9b59b6", "#c0392b", "#16a085", "#7f8c8d", "#d4ac0d"]
_LAYOUT: dict[str, Any] = {
    "template": "none",
    "height": 300,
    "margin": {"l": 55, "r": 15, "t": 40, "b": 85},
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "legend": {"orientation": "h", "x": 0, "y": -0.3, "yanchor": "top"},
    "colorway": COLORS,
}


def _figure(traces: Sequence[Any], title: str, **layout: Any) -> dict[str, Any]:
    figure = go.Figure(list(traces))
    names = {trace.name for trace in figure.data if trace.showlegend is not False}
    if len(names) <= 1:
        layout = {"showlegend": False, **layout}
    figure.update_layout(**{**_LAYOUT, "title": {"text": title, "x": 0.01, "font": {"size": 14}}, **layout})
    return json.loads(pio.to_json(figure, validate=True, pretty=False))


def _r(values: Sequence[float], digits: int = 4) -> list[float]:
    return [round(v, digits) for v in values]


def reward_distribution(groups: Sequence[tuple[str, Sequence[Rollout]]]) -> dict[str, Any]:
    """Scored rewards per run: bars of each value when few distinct values, else a histogram."""
    values = {
        label: [r.reward for r in rollouts if r.status == "scored" and r.reward is not None]
        for label, rollouts in groups
    }
    distinct = {v for vs in values.values() for v in vs}
    traces: list[Any] = []
    few = len(distinct) <= 12  # few distinct values: a bar each; else a histogram
    ordered = sorted(distinct)
    for label, vs in values.items():
        if few:
            counts = Counter(vs)
            traces.append(go.Bar(x=[f"{v:g}" for v in ordered], y=[counts[v] for v in ordered], name=label))
        else:
            traces.append(go.Histogram(x=_r(vs), name=label, opacity=0.75, nbinsx=30))
    xaxis = {"title": "reward", "type": "category"} if few else {"title": "reward"}
    layout = {"barmode": "group" if few else "overlay", "xaxis": xaxis, "yaxis": {"title": "rollouts"}}
    return _figure(traces, "Reward (scored rollouts)", **layout)


def pass_curves(curves: Sequence[tuple[str, dict[str, list[Any]]]], threshold: float) -> dict[str, Any]:
    """pass@k (solid) and pass^k (dashed) over k, one colour per run."""
    traces: list[Any] = []
    for position, (label, curve) in enumerate(curves):
        color = COLORS[position % len(COLORS)]
        tasks = [f"{n} tasks" for n in curve["tasks"]]
        suffix = f" {label}" if len(curves) > 1 else ""
        for key, name, dash in (("pass_at", "pass@k", "solid"), ("pass_power", "pass^k", "dash")):
            line = {"color": color, "dash": dash}
            y = _r(curve[key])
            traces.append(
                go.Scatter(x=curve["k"], y=y, name=name + suffix, text=tasks, mode="lines+markers", line=line)
            )
    top = max((max(c["k"], default=1) for _, c in curves), default=1)
    axis = {"type": "log"} if top > 16 else {"dtick": 1}
    return _figure(
        traces,
        f"pass@k (solid), pass^k (dashed); correct: reward ≥ {threshold:g}",
        showlegend=True,
        xaxis={"title": "k", **axis},
        yaxis={"title": "probability", "range": [-0.02, 1.02]},
    )


def metric_means(rows: Sequence[tuple[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    """Each metric's mean with its 95% interval over tasks, one marker per run."""
    traces: list[Any] = []
    for label, metrics in rows:
        means = [m["mean"] for m in metrics]
        plus = [(m["high"] - m["mean"]) if m["high"] is not None else 0 for m in metrics]
        minus = [(m["mean"] - m["low"]) if m["low"] is not None else 0 for m in metrics]
        traces.append(
            go.Scatter(
                x=_r(means),
                y=[m["name"] for m in metrics],
                mode="markers",
                name=label,
                error_x={"type": "data", "array": _r(plus), "arrayminus": _r(minus)},
            )
        )
    names = {m["name"] for _, metrics in rows for m in metrics}
    return _figure(
        traces,
        "Metric means (95% CI over tasks)",
        height=max(220, 70 + 26 * len(names)),
        yaxis={"automargin": True, "autorange": "reversed"},
        xaxis={"title": "mean"},
    )


def failures(rows: Sequence[tuple[str, dict[str, int], dict[str, int]]]) -> dict[str, Any]:
    """Errors by type and masked rollouts by failure kind, per run."""
    kinds = sorted({f"error: {k}" for _, e, _ in rows for k in e} | {f"masked: {k}" for _, _, m in rows for k in m})
    traces = []
    for label, errors, masked in rows:
        counts = {**{f"error: {k}": v for k, v in errors.items()}, **{f"masked: {k}": v for k, v in masked.items()}}
        traces.append(go.Bar(x=kinds, y=[counts.get(k, 0) for k in kinds], name=label))
    return _figure(
        traces,
        "Failed and masked rollouts by kind",
        barmode="group",
        yaxis={"title": "rollouts"},
        xaxis={"type": "category"},
    )


def distribution(
    groups: Sequence[tuple[str, Sequence[float]]], title: str, axis: str, *, log: bool = False
) -> dict[str, Any]:
    """A histogram per run (overlaid)."""
    traces = [go.Histogram(x=_r(values, 3), name=label, opacity=0.7, nbinsx=40) for label, values in groups]
    return _figure(
        traces,
        title,
        barmode="overlay",
        xaxis={"title": axis, **({"type": "log"} if log else {})},
        yaxis={"title": "count"},
    )


def task_scatter(comparison: dict[str, Any], letter: str = "B") -> dict[str, Any]:
    """Per-task mean reward of run B against run A (flipped tasks coloured)."""
    groups: dict[str, list[dict[str, Any]]] = {"same": [], "fixed": [], "broken": []}
    for task in comparison["tasks"]:
        if task["a"] is not None and task["b"] is not None:
            groups[task["flip"] or "same"].append(task)
    colors = {"same": "#7f8c8d", "fixed": "#2e9e5b", "broken": "#c0392b"}
    traces = [
        go.Scatter(
            x=[t["a"] for t in tasks],
            y=[t["b"] for t in tasks],
            mode="markers",
            name=name,
            marker={"color": colors[name], "size": 8, "opacity": 0.7},
            text=[f"{t['env']} task {t['task']}" for t in tasks],
            hovertemplate="%{text}<br>A %{x:.3f} → B %{y:.3f}",
        )
        for name, tasks in groups.items()
        if tasks
    ]
    ends = [v for t in comparison["tasks"] for v in (t["a"], t["b"]) if v is not None] or [0.0, 1.0]
    low, high = min(0.0, *ends), max(1.0, *ends)
    line = go.Scatter(
        x=[low, high],
        y=[low, high],
        mode="lines",
        line={"color": "#bbb", "dash": "dot"},
        showlegend=False,
        hoverinfo="skip",
    )
    return _figure(
        [line, *traces],
        f"Mean reward per task, {letter} against A (flipped tasks coloured)",
        height=380,
        showlegend=True,
        xaxis={"title": "A"},
        yaxis={"title": letter},
    )
