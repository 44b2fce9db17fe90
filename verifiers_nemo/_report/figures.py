"""The report's plots, built with plotly and embedded as figure JSON (drawn by the plotly.js bundled
in the file, so the report needs no network).

A distribution is a list of values or a ``ValueTally`` (a run's streamed values: exact, or a uniform sample of a
large run's, which the figure's title then says)."""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from .values import ValueTally

Values = Sequence[float] | ValueTally
"""A distribution: its values, or a tally of them."""

COLORS = ["#3366cc", "#dc6b19", "#2e9e5b", "#9b59b6", "#c0392b", "#16a085", "#7f8c8d", "#d4ac0d"]
_LAYOUT: dict[str, Any] = {
    "template": "none",
    "height": 300,
    # The top margin holds the toolbar's row (plotly draws it at the figure's top right), then the title, which
    # sits just above the plot area (``_title``): a long title never runs under the toolbar.
    "margin": {"l": 55, "r": 15, "t": 62, "b": 85},
    "font": {"family": "system-ui, sans-serif", "size": 12},
    "legend": {"orientation": "h", "x": 0, "y": -0.3, "yanchor": "top"},
    "colorway": COLORS,
}


def _figure(traces: Sequence[Any], title: str, **layout: Any) -> dict[str, Any]:
    figure = go.Figure(list(traces))
    names = {trace.name for trace in figure.data if trace.showlegend is not False}
    if len(names) <= 1:
        layout = {"showlegend": False, **layout}
    figure.update_layout(**{**_LAYOUT, "title": _title(title), **layout})
    return json.loads(pio.to_json(figure, validate=True, pretty=False))


def _title(text: str) -> dict[str, Any]:
    """Left-aligned, just above the plot area: below the toolbar's row at the top of the figure."""
    return {
        "text": text,
        "x": 0.01,
        "xref": "container",  # from the figure's left edge: long axis labels do not push it off the right
        "xanchor": "left",
        "y": 1,
        "yref": "paper",
        "yanchor": "bottom",
        "pad": {"b": 10},
        "font": {"size": 14},
    }


def _count_axis(highest: int, **axis: Any) -> dict[str, Any]:
    """An axis of counts: integer ticks only (a step of 1, 2, 5, 10, 20, ... giving at most 6 intervals)."""
    return {"tick0": 0, "dtick": _step(highest), "tickformat": ",d", "rangemode": "tozero", **axis}


def _step(span: float, intervals: int = 6) -> int:
    """The smallest of 1, 2, 5, 10, 20, 50, ... that cuts ``span`` into at most ``intervals`` steps."""
    base = 1
    while True:
        for multiple in (1, 2, 5):
            if span <= intervals * multiple * base:
                return multiple * base
        base *= 10


BINS = 40
"""Bins of a histogram (at most, for whole numbers: each bin then holds a whole number of values)."""


class _Held:
    """What a figure draws of one distribution: ascending (value, count) pairs, and whether they are a sample."""

    def __init__(self, values: Values, skip_zero: bool = False) -> None:
        if isinstance(values, ValueTally):
            self.pairs = values.weighted(skip_zero=skip_zero)
            self.sampled, self.held, self.count = values.sampled, values.held, values.count
            exact_ends = not skip_zero and values.count
            self.low = values.spread.min if exact_ends else (self.pairs[0][0] if self.pairs else None)
            self.high = values.spread.max if exact_ends else (self.pairs[-1][0] if self.pairs else None)
        else:
            self.pairs = sorted(Counter(v for v in values if not (skip_zero and v == 0)).items())
            self.sampled, self.held = False, len(values)
            self.count = self.held
            self.low = self.pairs[0][0] if self.pairs else None
            self.high = self.pairs[-1][0] if self.pairs else None


def _sample_note(held: Sequence[_Held]) -> str:
    """The title's note on sampled distributions ("" when every value is drawn)."""
    sampled = [h for h in held if h.sampled]
    if not sampled:
        return ""
    if len(held) == 1:
        return f" (a uniform sample of {sampled[0].held:,} of {sampled[0].count:,})"
    return f" (a uniform sample of {sampled[0].held:,} values of a run that has more)"


def _edges(low: float, high: float, whole: bool) -> list[float]:
    """Shared bin edges from ``low`` to ``high``. ``whole``: bins of a whole number of integers, centred on them
    (a bin of one integer n spans n - 0.5 to n + 0.5), so a count never falls between ticks."""
    if whole:
        first, last = math.floor(low), math.ceil(high)
        size = max(1, math.ceil((last - first + 1) / BINS))
        count = math.ceil((last - first + 1) / size)
        return [first - 0.5 + i * size for i in range(count + 1)]
    width = (high - low) / BINS or max(abs(low) * 0.05, 0.5)
    if high == low:
        return [low - width / 2, low + width / 2]
    return [low + i * width for i in range(BINS)] + [high]


def _histogram(pairs: Sequence[tuple[float, int]], edges: Sequence[float]) -> list[int]:
    tally = [0] * (len(edges) - 1)
    width = (edges[-1] - edges[0]) / len(tally)
    for value, count in pairs:
        tally[min(len(tally) - 1, max(0, int((value - edges[0]) // width)))] += count
    return tally


def _histogram_traces(
    groups: Sequence[tuple[str, _Held]], whole: bool, digits: int = 3
) -> tuple[list[Any], dict[str, Any], int]:
    """Bars of each run's values over shared bins (overlaid), the x axis they need, and the tallest bar."""
    ends = [(held.low, held.high) for _, held in groups if held.pairs]
    if not ends:
        return [], {}, 0
    edges = _edges(min(low for low, _ in ends), max(high for _, high in ends), whole)  # type: ignore[type-var]
    lows, highs = edges[:-1], edges[1:]
    centres = [(a + b) / 2 for a, b in zip(lows, highs, strict=True)]
    if whole:
        spans = [
            f"{math.ceil(a):,}" + (f" to {math.floor(b):,}" if b - a > 1 else "")
            for a, b in zip(lows, highs, strict=True)
        ]
    else:
        spans = [f"{a:.{digits}g} to {b:.{digits}g}" for a, b in zip(lows, highs, strict=True)]
    traces, tallest = [], 0
    for label, held in groups:
        tally = _histogram(held.pairs, edges)
        tallest = max(tallest, *tally)
        traces.append(
            go.Bar(
                x=_r(centres, 6),
                y=tally,
                width=_r([b - a for a, b in zip(lows, highs, strict=True)], 6),
                name=label,
                opacity=0.7 if len(groups) > 1 else 1.0,
                text=spans,
                hovertemplate="%{text}: %{y}",
                textposition="none",
            )
        )
    axis: dict[str, Any] = {}
    if whole:
        span = edges[-1] - edges[0]
        axis = {"tick0": 0, "dtick": _step(span, 8), "tickformat": ",d"}
        if len(lows) <= 3:  # a bar or three: room either side, so the bar is not the whole plot
            axis["range"] = [max(-0.5, edges[0] - span), edges[-1] + span]  # never below a count of 0
    return traces, axis, tallest


def _r(values: Sequence[float], digits: int = 4) -> list[float]:
    return [round(v, digits) for v in values]


def reward_distribution(groups: Sequence[tuple[str, Values]]) -> dict[str, Any]:
    """Scored rewards per run: bars of each value when few distinct values, else a histogram."""
    held = [(label, _Held(values)) for label, values in groups]
    distinct = {v for _, h in held for v, _ in h.pairs}
    traces: list[Any] = []
    few = len(distinct) <= 12  # few distinct values: a bar each; else a histogram
    ordered = sorted(distinct)
    tallest = 0
    if few:
        for label, h in held:
            counts = dict(h.pairs)
            traces.append(go.Bar(x=[f"{v:g}" for v in ordered], y=[counts.get(v, 0) for v in ordered], name=label))
            tallest = max([tallest, *counts.values()])
        xaxis: dict[str, Any] = {"title": "reward", "type": "category"}
    else:
        traces, _, tallest = _histogram_traces(held, whole=False, digits=4)
        xaxis = {"title": "reward"}
    layout = {
        "barmode": "group" if few else "overlay",
        "bargap": 0.15 if few else 0,
        "xaxis": xaxis,
        "yaxis": _count_axis(tallest, title="rollouts"),
    }
    return _figure(traces, "Reward (scored rollouts)" + _sample_note([h for _, h in held]), **layout)


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
        f"pass@k (solid), pass^k (dashed); correct: reward ≥ {threshold:g}",  # below the toolbar: _title
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
        "Metric means, 95% CI over tasks (Wilson or bootstrap)",
        height=max(240, 100 + 26 * len(names)),
        yaxis={"automargin": True, "autorange": "reversed"},
        xaxis={"title": "mean"},
    )


def failures(rows: Sequence[tuple[str, dict[str, int], dict[str, int]]]) -> dict[str, Any]:
    """Errors by type and masked rollouts by failure kind, per run."""
    kinds = sorted({f"error: {k}" for _, e, _ in rows for k in e} | {f"masked: {k}" for _, _, m in rows for k in m})
    traces, tallest = [], 0
    for label, errors, masked in rows:
        counts = {**{f"error: {k}": v for k, v in errors.items()}, **{f"masked: {k}": v for k, v in masked.items()}}
        traces.append(go.Bar(x=kinds, y=[counts.get(k, 0) for k in kinds], name=label))
        tallest = max([tallest, *counts.values()])
    return _figure(
        traces,
        "Failed and masked rollouts by kind",
        barmode="group",
        yaxis=_count_axis(tallest, title="rollouts"),
        xaxis={"type": "category"},
    )


def distribution(
    groups: Sequence[tuple[str, Values]], title: str, axis: str, *, counts: bool = False, skip_zero: bool = False
) -> dict[str, Any]:
    """A histogram per run (overlaid, over shared bins; the y axis counts rollouts or calls in whole
    numbers). ``counts``: the values are whole numbers (policy calls, tokens): integer bins, integer ticks.
    ``skip_zero``: leave zeros out (no output tokens: nothing was generated)."""
    held = [(label, _Held(values, skip_zero)) for label, values in groups]
    traces, xaxis, tallest = _histogram_traces(held, whole=counts)
    return _figure(
        traces,
        title + _sample_note([h for _, h in held]),
        barmode="overlay",
        bargap=0,
        xaxis={"title": axis, **xaxis},
        yaxis=_count_axis(tallest, title="count"),
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
