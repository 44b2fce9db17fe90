"""The report: runs read into one shape (errors and masked rows apart), its statistics, runs compared,
the HTML it writes, and bad input refused with one clear message (synthetic runs; the real runs and
the browser are in tests/e2e/test_report.py)."""

from __future__ import annotations

import base64
import gzip
import json
import math
import re
from pathlib import Path

import pytest

from tests.unit.report_runs import rollout_record, write_run
from verifiers_nemo._cli.main import main
from verifiers_nemo._eval.stats import summarize
from verifiers_nemo._report import ReportError, figures, load_run, write_report
from verifiers_nemo._report.stats import (
    BOOTSTRAP,
    WILSON,
    bootstrap_interval,
    compare,
    mean_interval,
    wilson_interval,
)
from verifiers_nemo._report.transcript import Strings, from_policy_calls


def _details(html: str) -> dict:
    packed = re.search(r'<script type="text/plain" id="report-details">([^<]*)</script>', html)
    assert packed
    return json.loads(gzip.decompress(base64.b64decode(packed.group(1))))


def _data(html: str) -> dict:
    found = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert found
    return json.loads(found.group(1))


# -- reading runs --------------------------------------------------------------------------------------


def test_errors_and_masked_rows_are_counted_apart_never_as_reward_zero(tmp_path: Path) -> None:
    outcomes = {(0, 0): "error", (1, 0): "masked", (1, 1): "masked"}
    run = load_run(
        write_run(
            tmp_path / "run",
            tasks=4,
            repeats=2,
            quality=1.0,
            outcomes={**outcomes, **{(t, r): "scored" for t in range(4) for r in range(2) if (t, r) not in outcomes}},
        )
    )
    stats = run.tally.overall.overview()
    assert (stats["scored"], stats["errored"], stats["masked"]) == (5, 1, 2)
    assert stats["reward"]["mean"] == 1.0, "a masked row's reward 0 and an error must not pull the mean down"
    assert stats["masked_by_kind"] == {"judge_failed": 2}
    assert set(stats["errors"]) <= {"timeout", "upstream_http"} and sum(stats["errors"].values()) == 1
    assert stats["pass"]["tasks"][0] == 3, "task 1 (all masked) has no scored rollout for pass@k"
    assert all("mask_sample" not in r.metrics for r in run.rollouts())
    assert "question_id" not in {m["name"] for m in stats["metrics"]}, "identifiers are not averaged"


def test_a_mask_sample_metric_from_a_newer_gym_masks_the_row(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run", tasks=1, repeats=1, outcomes={(0, 0): "scored"})
    record = json.loads((folder / "results.jsonl").read_text())
    record["metrics"]["mask_sample"] = 1.0  # how a nemo-gym 0.7 verify field lands today
    (folder / "results.jsonl").write_text(json.dumps(record) + "\n")
    rollout = next(load_run(folder).rollouts())
    assert rollout.status == "masked" and "mask_sample" not in rollout.metrics


def test_a_cut_off_last_line_is_left_out_with_a_note(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run", tasks=3, repeats=1)
    text = (folder / "results.jsonl").read_text()
    (folder / "results.jsonl").write_text(text + text.splitlines()[0][:100])
    run = load_run(folder)
    assert run.total == 3
    assert any("cut off" in note for note in run.notes)


@pytest.mark.parametrize(
    ("arrange", "expected"),
    [
        (lambda d: (d / "results.jsonl").write_text(""), "no rollouts yet: results.jsonl is empty"),
        (lambda d: (d / "metadata.json").write_text("{}"), "results.jsonl is missing"),
        (lambda d: (d / "notes.txt").write_text("x"), "neither a verifiers-nemo run folder"),
        (lambda d: (d / "traces.jsonl").write_text(""), "traces.jsonl is empty"),
        (
            lambda d: (d / "results.jsonl").write_text('{"task_index": 0, "rollout_index": 0, "rew'),
            "no complete rollout",
        ),
    ],
)
def test_bad_input_is_refused_with_what_is_missing(tmp_path: Path, arrange, expected: str, capsys) -> None:
    folder = tmp_path / "run"
    folder.mkdir()
    arrange(folder)
    with pytest.raises(ReportError, match=expected):
        load_run(folder)
    assert main(["report", str(folder), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_a_folder_holding_several_runs_names_them(tmp_path: Path) -> None:
    write_run(tmp_path / "evals" / "a", tasks=1, repeats=1)
    write_run(tmp_path / "evals" / "b", tasks=1, repeats=1)
    with pytest.raises(ReportError, match=r"holds 2 runs \(a, b\)"):
        load_run(tmp_path / "evals")


def vf_episode(idx: int, ok: bool) -> dict:
    """One episode of verifiers' traces.jsonl (vf-eval nemo-gym-env), scored or failed."""
    nodes = [
        {"tools": [{"name": "lookup"}], "message": {"role": "system", "content": "sys"}},
        {"parent": 0, "message": {"role": "user", "content": f"question {idx}"}},
        {
            "parent": 1,
            "message": {
                "role": "assistant",
                "tool_calls": [{"id": "c1", "type": "function", "name": "lookup", "arguments": "{}"}],
            },
            "sampled": True,
        },
        {"parent": 2, "message": {"role": "tool", "tool_call_id": "c1", "content": "42"}},
    ]
    gym = {
        "reward": 1.0 if ok else None,
        "env": "e",
        "metrics": {"accuracy": 1.0} if ok else {},
        "error": None if ok else {"type": "upstream_http", "message": "404 from upstream"},
        "timing": {"rollout_s": 2.0},
    }
    trace = {
        "ok": ok,
        "errors": [] if ok else [{"type": "HarnessError", "message": "404"}],
        "nodes": nodes,
        "calls": [
            {
                "node": 2,
                "usage": {"prompt_tokens": 5, "completion_tokens": 3},
                "time": {"start": 1.0, "end": 1.5},
                "finish_reason": "tool_calls",
            }
        ],
        "rewards": {"nemo_gym": {"score": gym["reward"], "weight": 1.0}},
        "metrics": gym["metrics"],
        "info": {"nemo_gym": gym},
        "num_input_tokens": 5,
        "num_output_tokens": 3,
    }
    return {
        "task": {"data": {"id": str(idx), "idx": idx, "nemo_env": "e", "recorded_reward": 1.0}},
        "traces": [trace],
    }


def write_vf_run(folder: Path, episodes: list[dict]) -> Path:
    folder.mkdir(parents=True)
    (folder / "traces.jsonl").write_text("\n".join(json.dumps(e) for e in episodes) + "\n")
    return folder


def test_a_verifiers_traces_file_reads_like_our_results(tmp_path: Path) -> None:
    write_vf_run(
        tmp_path / "vf" / "nemo-gym-env--m--1", [vf_episode(0, True), vf_episode(0, True), vf_episode(1, False)]
    )
    run = load_run(tmp_path / "vf")  # the -o folder of vf-eval, holding one run
    rollouts = list(run.rollouts())
    assert [(r.task, r.rollout_index, r.status, r.kind) for r in rollouts] == [
        ("0", 0, "scored", None),
        ("0", 1, "scored", None),
        ("1", 0, "error", "upstream_http"),
    ]
    first = rollouts[0]
    assert (first.turns, first.tool_calls, first.call_latencies, first.latency_s) == (1, 1, [0.5], 2.0)
    assert first.transcript["m"][2]["tc"][0][0] == "lookup" and first.transcript["c"][0]["in"] == 5


# -- transcripts ---------------------------------------------------------------------------------------


def test_policy_calls_show_each_new_input_once_and_every_reply() -> None:
    record = rollout_record(3, 0, __import__("random").Random(1), outcome="scored")
    strings = Strings()
    transcript = from_policy_calls(record["trace"], strings)
    roles = [m["r"] for m in transcript["m"]]
    tool_calls = len(record["trace"]) - 1
    assert roles == ["system", "user"] + ["assistant", "tool"] * tool_calls + ["assistant"]
    assert [m.get("k") for m in transcript["m"] if m["r"] == "assistant"] == list(range(tool_calls + 1))
    assert isinstance(transcript["m"][0]["t"], int), "the long system prompt goes to the string table"
    assert transcript["c"][0]["tok"] == [20, 5, -0.33, -1.0]


def test_chat_shaped_requests_read_the_same() -> None:
    calls = [
        {
            "request": {"messages": [{"role": "user", "content": "hi"}]},
            "response": {"output": [{"type": "function_call", "name": "f", "arguments": "{}", "call_id": "c"}]},
        },
        {
            "request": {
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
                    {"role": "tool", "tool_call_id": "c", "content": "7"},
                ]
            },
            "response": {
                "output": [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "7"}]}]
            },
        },
    ]
    messages = from_policy_calls(calls, Strings())["m"]
    assert [(m["r"], m.get("t"), m.get("k")) for m in messages] == [
        ("user", "hi", None),
        ("assistant", None, 0),
        ("tool", "7", None),
        ("assistant", "7", 1),
    ]


# -- statistics ------------------------------------------------------------------------------------------


def test_a_pass_rate_gets_the_wilson_interval_inside_0_and_1() -> None:
    """3 of 5 tasks right: Student's t gave [-0.080, 1.280] (the issue's report); Wilson's is inside [0, 1]."""
    mean, low, high, method = mean_interval([1.0, 1.0, 1.0, 0.0, 0.0])
    assert (mean, method) == (0.6, WILSON)
    assert (low, high) == pytest.approx((0.2307, 0.8824), abs=1e-4)  # the textbook values for 3/5
    assert wilson_interval(5, 5) == pytest.approx((0.5655, 1.0), abs=1e-4), "all right: not the empty [1, 1]"
    assert wilson_interval(0, 5)[0] == 0.0
    assert mean_interval([1.0]) == (1.0, None, None, None)


@pytest.mark.parametrize(
    "values",
    [
        [1.0, 0.5, 0.5, 0.0, 1.0],  # rewards in [0, 1] over 2 rollouts a task
        [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5],  # near a bound: t reaches below 0
        [0.9, 0.95, 1.0, 1.0, 0.2],  # continuous
        [0.0] * 900 + [0.5] * 60 + [1.0] * 40,  # many tasks, few distinct values (the multinomial draw)
        [i / 1999 for i in range(2000)],  # many tasks, all distinct (resampled one by one)
    ],
)
def test_a_bootstrap_interval_stays_within_the_values_and_is_the_same_every_time(values: list[float]) -> None:
    mean, low, high, method = mean_interval(values)
    assert method == BOOTSTRAP
    assert min(values) <= low <= mean <= high <= max(values)
    assert mean_interval(values) == (mean, low, high, method), "seeded: the same report gives the same interval"
    assert mean_interval(values[::-1]) == (mean, low, high, method), "whatever order the tasks come in"
    if len(values) >= 1000:  # where the normal approximation is good, the bootstrap agrees with it
        half = 1.96 * __import__("statistics").pstdev(values) / math.sqrt(len(values))
        assert (low, high) == pytest.approx((mean - half, mean + half), abs=0.15 * half + 1e-3)


def test_the_summary_interval_of_a_run_is_inside_the_rewards_bounds(tmp_path: Path) -> None:
    run = _run_with(tmp_path, "a", {0: [1, 1], 1: [1, 1], 2: [1, 1], 3: [0, 0], 4: [0, 0]})
    reward = run.tally.overall.overview()["reward"]
    assert reward["method"] == WILSON and 0.0 <= reward["low"] < 0.6 < reward["high"] <= 1.0, reward
    run = _run_with(tmp_path, "b", {0: [1, 0], 1: [1, 1], 2: [0, 0], 3: [0, 0], 4: [0, 0]})
    reward = run.tally.overall.overview()["reward"]
    assert reward["method"] == BOOTSTRAP and 0.0 <= reward["low"] <= reward["high"] <= 1.0, reward
    assert all(
        0.0 <= m["low"] <= m["high"] <= 1.0 for m in run.tally.overall.overview()["metrics"] if m["low"] is not None
    )


def test_pass_curves_agree_with_the_eval_summary(tmp_path: Path) -> None:
    run = load_run(write_run(tmp_path / "run", tasks=12, repeats=8, quality=0.4, seed=3))
    curves = run.tally.overall.overview()["pass"]
    records = [json.loads(line) for line in (run.path / "results.jsonl").read_text().splitlines()]
    records = [r for r in records if not r.get("masked")]
    summary = summarize(records, rollouts_per_example=8)
    assert curves["k"] == list(range(1, 9))
    for k, value in summary["pass_at_k"].items():
        assert curves["pass_at"][int(k) - 1] == pytest.approx(value)
        assert curves["pass_power"][int(k) - 1] == pytest.approx(summary["pass_power_k"][k])


def _run_with(tmp_path: Path, name: str, rewards: dict[int, list[float]]):
    folder = write_run(
        tmp_path / name,
        tasks=max(rewards) + 1,
        repeats=2,
        outcomes={(t, r): "scored" for t in rewards for r in range(2)},
    )
    lines = []
    for line in (folder / "results.jsonl").read_text().splitlines():
        record = json.loads(line)
        record["reward"] = rewards[record["task_index"]][record["rollout_index"]]
        lines.append(json.dumps(record))
    (folder / "results.jsonl").write_text("\n".join(lines) + "\n")
    return load_run(folder, keep_tasks=True)


def test_runs_compared_give_a_paired_interval_and_the_flipped_tasks(tmp_path: Path) -> None:
    a = _run_with(tmp_path, "a", {0: [0, 0], 1: [1, 1], 2: [0, 1], 3: [1, 0]})
    b = _run_with(tmp_path, "b", {0: [1, 1], 1: [1, 1], 2: [1, 1], 3: [0, 0]})
    result = compare(a, b)
    diffs = [1.0, 0.0, 0.5, -0.5]
    assert result["reward_diff"]["mean"] == pytest.approx(0.25)
    assert (result["reward_diff"]["low"], result["reward_diff"]["high"]) == bootstrap_interval(diffs)
    assert result["reward_diff"]["method"] == BOOTSTRAP
    assert [(t["task"], t["flip"]) for t in result["tasks"]] == [
        ("0", "fixed"),
        ("1", None),
        ("2", None),
        ("3", "broken"),
    ]
    assert (result["fixed"], result["broken"]) == (1, 1)


def test_a_paired_difference_stays_inside_minus_1_and_1(tmp_path: Path) -> None:
    """B - A of rewards in [0, 1] is in [-1, 1]: a t interval over [1, 1, 1, -1, 1] reached 1.71."""
    a = _run_with(tmp_path, "a", {t: [0, 0] for t in range(5)} | {3: [1, 1]})
    b = _run_with(tmp_path, "b", {t: [1, 1] for t in range(5)} | {3: [0, 0]})
    result = compare(a, b)
    for key in ("reward_diff", "pass1_diff"):
        d = result[key]
        assert d["method"] == BOOTSTRAP, "a difference is no proportion: never Wilson"
        assert -1.0 <= d["low"] <= d["mean"] <= d["high"] <= 1.0, d


def test_runs_over_different_tasks_say_what_each_ran(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", tasks=2, repeats=1, env="env_a"), keep_tasks=True)
    b = load_run(write_run(tmp_path / "b", tasks=2, repeats=1, env="env_b"), keep_tasks=True)
    with pytest.raises(ReportError, match=r"ran different tasks.*2 tasks of env_a \(0, 1\) vs 2 tasks of env_b"):
        compare(a, b)
    report = write_report([a.path, b.path], tmp_path / "r.html")
    assert any("ran different tasks" in note for note in report.notes)
    assert "error" in _data(report.path.read_text())["compare"][0]


def test_partly_overlapping_runs_are_compared_on_the_common_tasks(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", tasks=5, repeats=1), keep_tasks=True)
    b = load_run(write_run(tmp_path / "b", tasks=3, repeats=1), keep_tasks=True)
    result = compare(a, b)
    assert len(result["tasks"]) == 3
    assert "2 tasks only in" in result["notes"][0]


def test_runs_of_different_nemo_gym_releases_are_compared_with_a_note_on_their_rows(tmp_path: Path) -> None:
    a = load_run(write_run(tmp_path / "a", tasks=3, repeats=1), keep_tasks=True)
    folder = write_run(tmp_path / "b", tasks=3, repeats=1)
    metadata = json.loads((folder / "metadata.json").read_text())
    metadata["versions"]["nemo-gym"] = "0.7.0"
    (folder / "metadata.json").write_text(json.dumps(metadata))
    notes = compare(a, load_run(folder, keep_tasks=True))["notes"]
    assert any("different nemo-gym releases (0.4.0 vs 0.7.0)" in note and "jsonl_path" in note for note in notes)
    assert not any("releases" in note for note in compare(a, a)["notes"])


# -- the HTML ------------------------------------------------------------------------------------------


def test_the_report_is_one_file_holding_every_rollout_and_no_network(tmp_path: Path, capsys) -> None:
    a = write_run(tmp_path / "a", tasks=6, repeats=3, seed=1)
    b = write_run(tmp_path / "b", tasks=6, repeats=3, seed=2, quality=0.9, save_trace=False)
    assert main(["report", str(a), str(b), "-o", str(tmp_path / "out" / "r.html")]) == 0
    assert capsys.readouterr().out.strip() == (tmp_path / "out" / "r.html").resolve().as_uri()
    html = (tmp_path / "out" / "r.html").read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", html), "everything must be inline"
    data, details = _data(html), _details(html)
    assert len(data["rows"]) == len(details["D"]) == 36
    assert set(data["overview"]["synthetic_env"]["figs"]) >= {"reward", "pass", "metrics", "latency", "call_latency"}
    assert details["D"][0]["c"], "a run saved with --save-trace shows each policy call"
    assert not details["D"][18]["c"] and details["D"][18]["m"], "one saved without it shows its messages"
    assert data["compare"][0]["paired_tasks"] == 6


def test_the_judge_section_says_none_was_recorded_and_names_vf_eval_only_for_a_vf_eval_run(tmp_path: Path) -> None:
    unjudged = write_run(tmp_path / "unjudged", tasks=2, repeats=1, judged=False)
    judged = write_run(tmp_path / "judged", tasks=2, repeats=1)
    vf = write_vf_run(tmp_path / "vf" / "nemo-gym-env--m--1", [vf_episode(0, True), vf_episode(1, True)])

    def note(*runs: Path) -> str | None:
        out = tmp_path / f"{'-'.join(run.name for run in runs)}.html"
        assert main(["report", *map(str, runs), "-o", str(out)]) == 0
        return _data(out.read_text())["judge_note"]

    vf_note = "vf-eval's traces do not record judge calls (nemo-gym-env--m--1)."
    assert note(unjudged) == "No judge calls were recorded."  # a run of ours, with no judge: no word of vf-eval
    assert note(judged) is None  # the table says it all
    assert note(unjudged, vf) == f"No judge calls were recorded. {vf_note}"
    assert note(judged, vf) == vf_note


def test_one_run_gets_its_report_in_its_folder(tmp_path: Path) -> None:
    folder = write_run(tmp_path / "run", tasks=2, repeats=1)
    assert main(["report", str(folder)]) == 0
    assert (folder / "report.html").stat().st_size > 100_000  # plotly.js is inside


def test_an_unwritable_output_is_one_clear_error(tmp_path: Path, capsys) -> None:
    folder = write_run(tmp_path / "run", tasks=1, repeats=1)
    (tmp_path / "file").write_text("")
    assert main(["report", str(folder), "-o", str(tmp_path / "file" / "r.html")]) == 1
    assert "cannot write the report" in capsys.readouterr().err


# -- the figures -------------------------------------------------------------------------------------


def _bars(figure: dict) -> list[dict]:
    return [t for t in figure["data"] if t["type"] == "bar"]


def _is_whole(x: float) -> bool:
    return abs(x - round(x)) < 1e-9


def test_counts_get_integer_bins_and_integer_ticks() -> None:
    """Every rollout made 2 policy calls: one bar centred on 2 from 1.5 to 2.5, ticks on whole numbers only
    (plotly's own histogram drew ticks at 1.6 ... 2.4)."""
    figure = figures.distribution([("A", [2.0] * 10)], "Policy calls per rollout", "calls", counts=True)
    (bar,) = _bars(figure)
    assert bar["x"] == [2] and bar["y"] == [10] and bar["width"] == [1]
    x, y = figure["layout"]["xaxis"], figure["layout"]["yaxis"]
    assert (x["tick0"], x["dtick"]) == (0, 1) and x["range"][0] < 1.5 and x["range"][1] > 2.5
    assert _is_whole(y["dtick"]) and y["tick0"] == 0

    tokens = [float(v) for v in range(37, 4100, 7)]  # a wide range: bins of a whole number of integers
    for label_values in ([("A", tokens)], [("A", tokens), ("B", [5.0, 9.0, 4100.0])]):
        figure = figures.distribution(label_values, "Output tokens per rollout", "tokens", counts=True)
        for bar in _bars(figure):
            lows = [c - w / 2 for c, w in zip(bar["x"], bar["width"], strict=True)]
            assert all(
                _is_whole(lo - 0.5) and _is_whole(w) and w >= 1 for lo, w in zip(lows, bar["width"], strict=True)
            )
            assert sum(bar["y"]) == len(next(v for label, v in label_values if label == bar["name"]))
        assert _is_whole(figure["layout"]["xaxis"]["dtick"]) and _is_whole(figure["layout"]["yaxis"]["dtick"])


def test_every_count_axis_of_a_report_has_whole_ticks(tmp_path: Path) -> None:
    """The reward bars, failures, histograms: the y axes count rollouts, so never a tick at 0.5."""
    a = write_run(tmp_path / "a", tasks=3, repeats=1, seed=1)
    assert main(["report", str(a), "-o", str(tmp_path / "r.html")]) == 0
    figs = _data((tmp_path / "r.html").read_text())["overview"]["synthetic_env"]["figs"]
    for name, figure in figs.items():
        if name in ("pass", "metrics"):
            continue
        y = figure["layout"]["yaxis"]
        assert _is_whole(y["dtick"]) and y["dtick"] >= 1, (name, y)
    for name in ("turns", "tokens"):
        assert figs[name]["layout"]["xaxis"]["dtick"] >= 1 and _is_whole(figs[name]["layout"]["xaxis"]["dtick"])


def test_titles_sit_below_the_toolbar_row() -> None:
    """plotly draws its toolbar at the figure's top right: a title there ran under it (pass@k's did)."""
    figure = figures.pass_curves(
        [("A", {"k": [1, 2], "pass_at": [0.5, 0.7], "pass_power": [0.5, 0.3], "tasks": [5, 5]})], 0.5
    )
    title, margin = figure["layout"]["title"], figure["layout"]["margin"]
    assert (title["yref"], title["y"], title["yanchor"]) == ("paper", 1, "bottom"), "just above the plot area"
    assert margin["t"] - title["pad"]["b"] - title["font"]["size"] >= 30, "the toolbar's row (~30 px) stays free"


def test_the_environment_s_own_metrics_are_run_facts_named_alike_and_a_failed_ask_says_why() -> None:
    from verifiers_nemo._report.runs import gym_metric_entries

    one = {"aime25": {"simple_agent": {"key_metrics": {"pass@1[avg-of-4]": 0.75, "majority@4": 0.75}}}}
    assert gym_metric_entries(one) == {"Gym pass@1[avg-of-4]": 0.75, "Gym majority@4": 0.75}
    two = {"a": {"x": {"key_metrics": {"pass@1": 1.0}}}, "b": {"y": {"error": "HTTP 404"}}}
    assert gym_metric_entries(two) == {"Gym pass@1 (a, x)": 1.0, "Gym metrics (b, y)": "not available: HTTP 404"}
