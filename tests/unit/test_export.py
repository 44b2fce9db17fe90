"""Saved and live rollouts as training data (``verifiers-nemo export RUN_DIR --format ...``, ``export_training_data``,
``TrainingDataWriter``, ``SavedRun``): what each format's rows hold, which rollouts give rows, how pairs and groups are
formed, the files (JSONL and Parquet, their descriptions) as ``datasets`` loads them, the refusals, and the bounded
memory of the grouped formats. The real model and real trainers: tests/realmodel/test_training_data_real.py."""

from __future__ import annotations

import contextlib
import io
import json
import random
import statistics
from pathlib import Path
from typing import Any

import pytest

from tests.unit.training_runs import reward_of, rollout_record, run_records, write_run
from verifiers_nemo import (
    PolicyCall,
    RolloutResult,
    SavedRun,
    TrainingDataWriter,
    UpstreamHTTPError,
    export_training_data,
    training_data_description,
    training_data_features,
    training_samples,
)
from verifiers_nemo._cli.main import main
from verifiers_nemo._exceptions import ConfigurationError, RolloutTimeout


def _load(path: Path) -> list[dict[str, Any]]:
    """The rows as `datasets` loads them (the library a trainer reads them with), a JSONL file with its format's
    features (as the docs say)."""
    import datasets

    kind = "parquet" if path.suffix == ".parquet" else "json"
    features = None if kind == "parquet" else training_data_features(training_data_description(path)["format"])
    cache = str(path.parent / ".hf")
    return list(datasets.load_dataset(kind, data_files=str(path), split="train", cache_dir=cache, features=features))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """3 tasks x 4 rollouts with graded rewards, one rollout split where its tokens broke, one failed, one masked."""
    records = list(run_records(3, 4))
    records += [
        rollout_record(3, 0, reward=0.75, contiguous=False),
        rollout_record(3, 1, error="timeout"),
        rollout_record(3, 2, masked=True, reward=0.0),
        rollout_record(3, 3, reward=0.25),
    ]
    return write_run(tmp_path / "run", records, rollouts_per_example=4)


# -- the saved trace, read back -------------------------------------------------------------------------


def test_a_saved_line_reads_back_as_a_result_whose_trace_gives_the_same_training_samples(run: Path) -> None:
    line = json.loads((run / "results.jsonl").read_text().splitlines()[12])  # task 3 rollout 0: not contiguous
    result = RolloutResult.from_dict(line)
    assert all(isinstance(call, PolicyCall) for call in result.trace) and len(result.trace) == 2
    assert result.trace[0].request == line["trace"][0]["request"] and result.trace[1].response is not None
    samples = training_samples(result.trace)
    assert not samples.contiguous and len(samples.samples) == 2 and "diverge" in samples.breaks[0]
    assert samples.samples[1].prompt_token_ids == line["trace"][1]["prompt_token_ids"]
    again = RolloutResult.from_dict(result.to_dict(include_trace=True, include_gym_result=True))
    assert training_samples(again.trace).to_dict() == samples.to_dict()
    assert [r.task_index for r in SavedRun(run)][:5] == [0, 0, 0, 0, 1]


def test_saved_errors_come_back_typed() -> None:
    failed = RolloutResult(0, 0, error=RolloutTimeout("took too long"))
    call = PolicyCall(0, 502, 0.1, 3, 0.0, error=UpstreamHTTPError("503 from upstream", upstream_status=503))
    failed.trace = [call]
    back = RolloutResult.from_dict(failed.to_dict(include_trace=True))
    assert isinstance(back.error, RolloutTimeout) and back.error.message == "took too long" and back.reward is None
    assert isinstance(back.trace[0].error, UpstreamHTTPError) and not back.trace[0].ok
    unknown = RolloutResult.from_dict(
        {"task_index": 0, "rollout_index": 0, "error": {"type": "new_kind", "message": "m"}}
    )
    assert unknown.error is not None and unknown.error.to_dict() == {"type": "new_kind", "message": "m"}


# -- sft-tokens ------------------------------------------------------------------------------------------


def test_sft_tokens_rows_are_the_training_samples_with_labels_off_where_the_policy_did_not_sample(run: Path) -> None:
    report = export_training_data(run, run / "sft.parquet", "sft-tokens")
    rows = _load(run / "sft.parquet")
    assert report.rows == len(rows) == 15  # 14 scored rollouts, one of them two samples
    assert report.skipped == {"error:timeout": 1, "masked": 1}
    assert report.details["rollouts_cut_where_tokens_broke"] == 1
    saved = {(r["task_index"], r["rollout_index"]): r for r in map(json.loads, (run / "results.jsonl").open())}
    for row in rows:
        line = saved[(row["task_index"], row["rollout_index"])]
        sample = training_samples(RolloutResult.from_dict(line).trace).samples[row["sample_index"]]
        assert row["prompt_token_ids"] == sample.prompt_token_ids
        assert row["completion_token_ids"] == sample.completion_token_ids
        assert row["completion_mask"] == sample.completion_mask and row["calls"] == list(sample.calls)
        assert row["completion_logprobs"] == pytest.approx(sample.completion_logprobs, abs=1e-6)  # float32
        assert row["input_ids"] == sample.prompt_token_ids + sample.completion_token_ids
        off = [-100] * len(sample.prompt_token_ids)
        expected = off + [
            t if m else -100 for t, m in zip(sample.completion_token_ids, sample.completion_mask, strict=True)
        ]
        assert row["labels"] == expected
        sampled = [t for call in line["trace"] for t in call["completion_token_ids"] if call["index"] in row["calls"]]
        assert [t for t, m in zip(sample.completion_token_ids, sample.completion_mask, strict=True) if m] == sampled
        assert (row["model"], row["run_id"], row["env"], row["status"]) == (
            "Qwen/Qwen3-8B",
            "run",
            line["env"],
            "scored",
        )
        assert row["reward"] == line["reward"]


def test_a_rollout_whose_tokens_broke_is_its_contiguous_pieces_never_glued(run: Path) -> None:
    export_training_data(run, run / "sft.jsonl", "sft-tokens")
    split = [r for r in _load(run / "sft.jsonl") if (r["task_index"], r["rollout_index"]) == (3, 0)]
    line = json.loads((run / "results.jsonl").read_text().splitlines()[12])
    assert [(r["sample_index"], r["samples"], r["calls"]) for r in split] == [(0, 2, [0]), (1, 2, [1])]
    for row, call in zip(split, line["trace"], strict=True):
        assert row["prompt_token_ids"] == call["prompt_token_ids"]
        assert row["completion_token_ids"] == call["completion_token_ids"] and set(row["completion_mask"]) == {1}


def test_filters_keep_rollouts_by_reward_and_add_failed_and_masked_ones_as_typed_rows(run: Path) -> None:
    kept = export_training_data(run, run / "hi.jsonl", "sft-messages", min_reward=0.5, max_reward=0.75)
    rows = _load(run / "hi.jsonl")
    assert rows and all(0.5 <= r["reward"] <= 0.75 for r in rows) and kept.rows == len(rows)
    assert kept.skipped["below_min_reward"] + kept.skipped["above_max_reward"] + len(rows) == 14
    export_training_data(run, run / "all.jsonl", "sft-messages", include_errors=True, include_masked=True)
    rows = {(r["task_index"], r["rollout_index"]): r for r in _load(run / "all.jsonl")}
    assert len(rows) == 16
    failed, masked = rows[(3, 1)], rows[(3, 2)]
    assert (failed["status"], failed["error_type"], failed["reward"]) == ("error", "timeout", None)
    assert (masked["status"], masked["failure_kind"], masked["reward"]) == ("masked", "judge_failed", 0.0)


def test_rows_carry_the_policy_versions_that_sampled_the_rollout(tmp_path: Path) -> None:
    """Under an engine that labels its samples (vLLM 0.33's weight_versions, recorded by the training client), the
    versions of a rollout's turns, oldest first; null where none were reported."""
    labelled = rollout_record(0, 0, reward=1.0)
    labelled["training"] = {
        "samples": 1,
        "policy_versions": {"oldest": "3", "newest": "4", "by_turn": [["3"], ["4", "3"]]},
    }
    records = [labelled, rollout_record(0, 1, reward=0.0)]
    run = write_run(tmp_path / "run", records, rollouts_per_example=2)
    export_training_data(run, tmp_path / "g.parquet", "rollout-groups")
    rows = sorted(_load(tmp_path / "g.parquet"), key=lambda r: r["rollout_index"])
    assert [r["policy_versions"] for r in rows] == [["3", "4"], None]


def test_sft_messages_hold_the_conversation_with_tool_calls_results_and_the_tools(run: Path) -> None:
    export_training_data(run, run / "messages.parquet", "sft-messages")
    row = next(r for r in _load(run / "messages.parquet") if (r["task_index"], r["rollout_index"]) == (1, 2))
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant"]
    call = row["completion"][0]["tool_calls"][0]
    assert call["function"] == {"name": "lookup", "arguments": json.dumps({"word": "w1-0"})}
    assert row["completion"][1]["tool_call_id"] == call["id"] and row["completion"][2]["content"] == "The answer is 12."
    (tool,) = json.loads(row["tools"])
    assert tool["type"] == "function" and tool["function"]["name"] == "lookup" and "parameters" in tool["function"]


# -- preferences -----------------------------------------------------------------------------------------


def _pairs(run: Path, **options: Any) -> list[tuple[int, int, int]]:
    path = run / f"pairs-{len(list(run.glob('pairs-*')))}.jsonl"
    export_training_data(run, path, "preferences", **options)
    return sorted((r["task_index"], r["chosen_rollout_index"], r["rejected_rollout_index"]) for r in _load(path))


def test_pairs_are_a_task_s_scored_rollouts_apart_by_the_minimum_gap_best_against_worst_by_default(run: Path) -> None:
    rewards = {(t, r): reward_of(t, r) for t in range(3) for r in range(4)} | {(3, 0): 0.75, (3, 3): 0.25}
    best_worst = _pairs(run)
    for task in range(3):
        ranked = sorted(range(4), key=lambda r: (-rewards[(task, r)], r))
        assert (task, ranked[0], ranked[-1]) in best_worst
    assert (3, 0, 3) in best_worst  # 0.75 vs 0.25; the failed and the masked rollout never pair
    assert len(best_worst) == 4
    rest = _pairs(run, pairs="best-rest", min_gap=0.5)
    assert rest and all(rewards[(t, c)] - rewards[(t, r)] >= 0.5 for t, c, r in rest)
    every = _pairs(run, pairs="all", min_gap=0.25)
    assert len(every) > len(rest) and all(c != r for _, c, r in every)
    assert len(_pairs(run, pairs="all", min_gap=0.25, max_pairs_per_task=1)) == 4
    assert [(t, rewards[(t, c)]) for t, c, _ in _pairs(run, min_reward=1.0)] == [(0, 1.0), (2, 1.0)]


def test_a_pair_carries_exact_tokens_only_when_both_rollouts_are_one_sample_from_the_same_prompt(
    tmp_path: Path,
) -> None:
    records = [rollout_record(0, 0, reward=1.0), rollout_record(0, 1, reward=0.0)]
    records += [rollout_record(1, 0, reward=1.0, contiguous=False), rollout_record(1, 1, reward=0.0)]
    records += [rollout_record(2, 0, reward=0.5), rollout_record(2, 1, reward=0.5)]  # a tie: no pair
    run = write_run(tmp_path / "run", records, rollouts_per_example=2)
    report = export_training_data(run, tmp_path / "p.parquet", "preferences")
    exact, split = sorted(_load(tmp_path / "p.parquet"), key=lambda r: r["task_index"])
    assert report.details == {"tasks": 3, "tasks_without_a_pair": 1, "pairs_without_exact_tokens": 1}
    chosen, rejected = (records[0]["trace"], records[1]["trace"])
    assert exact["prompt_token_ids"] == chosen[0]["prompt_token_ids"] == rejected[0]["prompt_token_ids"]
    assert exact["chosen_token_ids"][: len(chosen[0]["completion_token_ids"])] == chosen[0]["completion_token_ids"]
    assert len(exact["chosen_mask"]) == len(exact["chosen_token_ids"]) and exact["rejected_token_ids"]
    assert exact["chosen"][0]["tool_calls"] and exact["prompt"][1]["content"] == "Look up word 0."
    assert split["prompt_token_ids"] is None and split["chosen_token_ids"] is None and split["chosen"]


# -- rollout groups --------------------------------------------------------------------------------------


def test_rollout_groups_carry_each_task_s_statistics_and_grpo_advantages(run: Path) -> None:
    export_training_data(run, run / "groups.parquet", "rollout-groups", include_errors=True, include_masked=True)
    rows = _load(run / "groups.parquet")
    assert [r["task_index"] for r in rows] == sorted(r["task_index"] for r in rows)  # a task's rows together
    for task in range(4):
        group = [r for r in rows if r["task_index"] == task]
        scored = [r["reward"] for r in group if r["status"] == "scored"]
        mean, std = statistics.fmean(scored), statistics.stdev(scored)
        for row in group:
            assert (row["group_size"], row["group_scored"]) == (4, len(scored))
            assert row["group_reward_mean"] == pytest.approx(mean) and row["group_reward_std"] == pytest.approx(std)
            if row["status"] == "scored":
                assert row["advantage"] == pytest.approx((row["reward"] - mean) / (std + 1e-4))
            else:
                assert row["advantage"] is None
        assert all(r["samples"] for r in group if r["status"] == "scored")
    split = next(r for r in rows if (r["task_index"], r["rollout_index"]) == (3, 0))
    assert len(split["samples"]) == 2 and split["samples"][1]["calls"] == [1]


def test_a_task_with_one_scored_rollout_has_advantage_zero_and_no_spread(tmp_path: Path) -> None:
    records = [rollout_record(0, 0, reward=1.0), rollout_record(0, 1, error="gym_agent")]
    run = write_run(tmp_path / "run", records, rollouts_per_example=2)
    export_training_data(run, tmp_path / "g.jsonl", "rollout-groups")
    (row,) = _load(tmp_path / "g.jsonl")
    assert (row["advantage"], row["group_reward_std"], row["group_size"], row["group_scored"]) == (0.0, None, 2, 1)


def test_groups_in_any_order_beyond_the_memory_bound_go_to_disk_and_come_out_the_same(tmp_path: Path) -> None:
    records = list(run_records(40, 3, turns=3, tokens_per_turn=40))
    run = write_run(tmp_path / "ordered", records, rollouts_per_example=3)
    random.Random(3).shuffle(records)
    records.insert(7, records[0])  # a (task, rollout) pair saved twice: the first line counts
    shuffled = write_run(tmp_path / "shuffled", records, rollouts_per_example=3)
    export_training_data(run, tmp_path / "a.jsonl", "rollout-groups")
    report = export_training_data(shuffled, tmp_path / "b.jsonl", "rollout-groups", group_memory=50_000)
    assert report.details["duplicate_rollouts_ignored"] == 1
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".verifiers-nemo-groups-")]  # the spill is gone

    def key(row: dict[str, Any]) -> tuple[int, int]:
        return row["task_index"], row["rollout_index"]

    a, b = (sorted(_load(tmp_path / name), key=key) for name in ("a.jsonl", "b.jsonl"))
    for row in (*a, *b):
        row["run_id"] = None
    assert a == b and len(a) == 120


def test_a_run_cut_short_still_gives_its_incomplete_tasks(tmp_path: Path) -> None:
    records = [rollout_record(0, r, reward=r / 3) for r in range(4)] + [rollout_record(1, 0, reward=1.0)]
    run = write_run(tmp_path / "run", records, rollouts_per_example=4)
    (run / "results.jsonl").write_text((run / "results.jsonl").read_text() + '{"task_index": 1, "rollout_in')
    report = export_training_data(run, tmp_path / "g.parquet", "rollout-groups")
    assert report.rows == 5 and report.details["tasks"] == 2
    assert {r["group_size"] for r in _load(tmp_path / "g.parquet") if r["task_index"] == 1} == {1}


# -- files, descriptions, live results -------------------------------------------------------------------


def test_jsonl_and_parquet_hold_the_same_rows_and_describe_themselves(run: Path) -> None:
    import pyarrow.parquet as pq

    for form in ("sft-tokens", "sft-messages", "preferences", "rollout-groups"):
        export_training_data(run, run / f"{form}.parquet", form)
        export_training_data(run, run / f"{form}.jsonl", form)
        as_parquet, as_jsonl = _load(run / f"{form}.parquet"), _load(run / f"{form}.jsonl")
        assert len(as_parquet) == len(as_jsonl) > 0
        for a, b in zip(as_parquet, as_jsonl, strict=True):
            assert _same(a, b), (form, a, b)
        for path in (run / f"{form}.parquet", run / f"{form}.jsonl"):
            described = training_data_description(path)
            assert described["format"] == form and described["format_version"] == 1
            assert described["source"]["run_id"] == "run" and described["source"]["settings"]["save_trace"] is True
            assert described["counts"]["rows"] == len(as_parquet) and described["counts"]["rollouts"] == 16
            assert [c["name"] for c in described["columns"]] == list(as_parquet[0])
    schema = pq.read_schema(run / "sft-tokens.parquet")
    assert str(schema.field("input_ids").type) == "list<element: int32>"
    assert str(schema.field("completion_mask").type) == "list<element: int8>"
    assert b"loss is off" in schema.field("labels").metadata[b"description"]


def _same(a: Any, b: Any) -> bool:
    """Equal, floats to float32's precision (Parquet keeps logprobs as float32) and a JSON null like an absent key."""
    if isinstance(a, dict) and isinstance(b, dict):
        return all(_same(a.get(k), b.get(k)) for k in a.keys() | b.keys())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        return a == pytest.approx(b, rel=1e-6, abs=1e-7)
    return a == b


def test_a_writer_in_your_own_loop_writes_the_file_the_export_of_the_saved_run_writes(run: Path) -> None:
    results = list(SavedRun(run))
    with TrainingDataWriter(run / "live.jsonl", "preferences", rollouts_per_task=4, model="Qwen/Qwen3-8B") as writer:
        for result in results:
            writer.add(result)  # live RolloutResult objects, as harness.run yields them
    assert writer.report is not None and writer.report.rows == 4
    export_training_data(run, run / "saved.jsonl", "preferences")
    live, saved = _load(run / "live.jsonl"), _load(run / "saved.jsonl")
    for row in saved:
        row["run_id"] = None
    assert live == saved


def test_a_task_s_rows_are_written_as_soon_as_it_has_all_its_rollouts(tmp_path: Path) -> None:
    """With the run's rollouts per task known, a task is written when its last rollout comes (not held to the end)."""

    def written() -> int:
        return sum(p.stat().st_size for p in tmp_path.glob(".groups.jsonl.*.tmp"))

    records = list(run_records(2, 3))
    with TrainingDataWriter(tmp_path / "groups.jsonl", "rollout-groups", rollouts_per_task=3) as writer:
        for record in records[:2]:
            writer.add(record)
        assert written() == 0
        writer.add(records[2])  # task 0 is whole
        assert written() > 0
    with TrainingDataWriter(tmp_path / "groups.jsonl", "rollout-groups") as writer:  # unknown: held to the end
        for record in records:
            writer.add(record)
        assert written() == 0
    assert writer.report is not None and writer.report.rows == 6


def test_a_failed_export_leaves_the_output_as_it_was(tmp_path: Path) -> None:
    output = tmp_path / "sft.parquet"
    output.write_bytes(b"an older export")
    with pytest.raises(RuntimeError), TrainingDataWriter(output, "sft-tokens") as writer:
        writer.add(rollout_record(0, 0))
        raise RuntimeError("the loop failed")
    assert output.read_bytes() == b"an older export" and [p.name for p in tmp_path.iterdir()] == ["sft.parquet"]
    with pytest.raises(ConfigurationError, match="closed"):
        writer.add(rollout_record(0, 1))


# -- refusals --------------------------------------------------------------------------------------------


def test_a_run_without_what_a_format_needs_is_refused_naming_the_flag_and_nothing_is_written(tmp_path: Path) -> None:
    untraced = write_run(
        tmp_path / "untraced",
        [rollout_record(0, 0, trace=False)],
        rollouts_per_example=1,
        settings={"save_trace": False},
    )
    with pytest.raises(ConfigurationError, match=r"saved without --save-trace.*--return-tokens"):
        export_training_data(untraced, tmp_path / "a.parquet", "sft-tokens")
    tokenless = write_run(
        tmp_path / "tokenless",
        [rollout_record(0, 0, tokens=False)],
        rollouts_per_example=1,
        settings={"sampling_args": {}},
    )
    with pytest.raises(ConfigurationError, match="without --return-tokens or --exact-tokens"):
        export_training_data(tokenless, tmp_path / "b.parquet", "sft-tokens")
    with pytest.raises(
        ConfigurationError, match=r"calls tools, but the results hold no tool definitions.*--save-trace"
    ):
        export_training_data(untraced, tmp_path / "c.parquet", "sft-messages")
    with pytest.raises(ConfigurationError, match="no call of these results recorded any"):  # live results: no metadata
        export_training_data([rollout_record(0, 0, tokens=False)], tmp_path / "d.jsonl", "sft-tokens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tokenless", "untraced"]


def test_options_that_do_not_apply_to_a_format_are_refused(run: Path) -> None:
    with pytest.raises(ConfigurationError, match="apply to preferences, not sft-tokens"):
        export_training_data(run, run / "x.parquet", "sft-tokens", min_gap=0.5)
    with pytest.raises(ConfigurationError, match="does not apply to preferences"):
        export_training_data(run, run / "x.parquet", "preferences", include_errors=True)
    with pytest.raises(ConfigurationError, match="unknown training-data format 'dpo'"):
        export_training_data(run, run / "x.parquet", "dpo")
    with pytest.raises(ConfigurationError, match=r"a \.jsonl or \.parquet file"):
        export_training_data(run, run / "x.csv", "sft-messages")
    with pytest.raises(ConfigurationError, match=r"holds no results\.jsonl"):
        export_training_data(run.parent, run / "x.jsonl", "sft-messages")


# -- the CLI ---------------------------------------------------------------------------------------------


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["export", *argv])
    return code, out.getvalue(), err.getvalue()


def test_the_export_command_writes_each_format_where_it_says(run: Path) -> None:
    code, out, err = _cli(str(run), "--format", "sft-tokens")
    assert code == 0, err
    assert out.strip() == str(run / "exports" / "sft-tokens.parquet")
    assert "sft-tokens: 15 samples from 16 rollouts" in err and "left out: 1 failed (timeout), 1 masked" in err
    assert "datasets.load_dataset('parquet', data_files=" in err
    code, out, err = _cli(str(run / "results.jsonl"), "--format", "preferences", "--pairs", "all", "--min-gap", "0.5",
                          "--max-pairs", "2", "-o", str(run / "dpo.jsonl"))  # fmt: skip
    assert code == 0, err
    assert out.strip() == str(run / "dpo.jsonl") and (run / "dpo.jsonl.schema.json").is_file()
    assert training_data_description(run / "dpo.jsonl")["options"]["pairs"] == "all"
    code, _, err = _cli(str(run), "--format", "rollout-groups", "--min-reward", "0.5", "--include-masked")
    assert code == 0 and "rollout-groups: " in err


def test_the_export_command_s_filters_and_pairing_flags_shape_the_rows(run: Path) -> None:
    def rows(*argv: str) -> list[dict[str, Any]]:
        out = run / f"cli-{len(list(run.glob('cli-*')))}.parquet"
        code, _, err = _cli(str(run), *argv, "-o", str(out))
        assert code == 0, err
        return _load(out)

    assert {r["reward"] for r in rows("--format", "sft-messages", "--min-reward", "0.75")} == {0.75, 1.0}
    assert {r["reward"] for r in rows("--format", "sft-messages", "--max-reward", "0.25")} == {0.0, 0.25}
    assert {r["status"] for r in rows("--format", "sft-messages")} == {"scored"}
    assert {r["status"] for r in rows("--format", "sft-messages", "--include-masked")} == {"scored", "masked"}
    assert {r["status"] for r in rows("--format", "rollout-groups", "--include-errors")} == {"scored", "error"}
    default = rows("--format", "preferences")
    pairs = rows("--format", "preferences", "--pairs", "all", "--min-gap", "0.5", "--max-pairs", "2")
    assert len(default) == 4 and len(pairs) > len(default)
    assert all(p["chosen_reward"] - p["rejected_reward"] >= 0.5 for p in pairs)
    assert max(sum(p["task_index"] == t for p in pairs) for t in range(4)) == 2
    assert len(rows("--format", "preferences", "--min-gap", "0.9")) == 2  # only the tasks with a 1.0 against a 0.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ((), "say which format: --format sft-tokens"),
        (("--format", "sft-tokens", "--min-gap", "0.3"), "apply to preferences, not sft-tokens"),
        (("--format", "sft-tokens", "--max-rollouts", "5"), "--max-rollouts applies to --format inspect"),
        (("--inspect", "--min-reward", "1"), "--min-reward apply to the training-data formats, not --format inspect"),
        (("--inspect", "--format", "sft-tokens"), "--inspect is --format inspect"),
        (("--format", "sft-messages", "-o", "x.csv"), "a .jsonl or .parquet file"),
    ],
)
def test_the_export_command_refuses_what_does_not_fit_in_one_line(
    run: Path, argv: tuple[str, ...], message: str
) -> None:
    code, out, err = _cli(str(run), *argv)
    assert code == 2 and message in err and not out
    assert len(err.strip().splitlines()) == 1


def test_a_jsonl_export_whose_first_blocks_hold_no_tool_call_loads_with_the_format_s_features(tmp_path: Path) -> None:
    """datasets types JSON block by block (10 MB blocks; 32 KB here, so that a small file has several): a nested column
    null in the first blocks and a list later fails to load without the features (shown here), and loads with them."""
    import datasets

    records = [rollout_record(t, 0, turns=1, reward=1.0) for t in range(300)]  # answers only: no tool calls ...
    records += [rollout_record(300, 0, turns=2, reward=1.0)]  # ... until the last rollout
    run = write_run(tmp_path / "run", records, rollouts_per_example=1)
    export_training_data(run, tmp_path / "m.jsonl", "sft-messages")
    blocks = {"data_files": str(tmp_path / "m.jsonl"), "split": "train", "chunksize": 1 << 15}
    with pytest.raises(datasets.exceptions.DatasetGenerationError):
        datasets.load_dataset("json", cache_dir=str(tmp_path / "a"), **blocks)
    features = training_data_features("sft-messages")
    rows = list(datasets.load_dataset("json", cache_dir=str(tmp_path / "b"), features=features, **blocks))
    assert len(rows) == 301 and rows[-1]["completion"][0]["tool_calls"][0]["function"]["name"] == "lookup"
    with pytest.raises(ConfigurationError, match="unknown training-data format"):
        training_data_features("dpo")
