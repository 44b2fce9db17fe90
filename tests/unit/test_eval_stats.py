"""Eval statistics, the results folder and resume bookkeeping (pure functions, no stack)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo import ConfigurationError
from verifiers_nemo._eval.results import (
    DoneRollouts,
    ExpectedRollouts,
    ResultsFolder,
    read_results,
    read_resume_state,
    run_folder_name,
)
from verifiers_nemo._eval.settings import EvalSettings
from verifiers_nemo._eval.stats import (
    pass_at_k,
    pass_power_k,
    powers_of_two_up_to,
    replay_agreement,
    summarize,
    timing_summary,
)


def record(task: int, rollout: int, reward: float | None, **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"task_index": task, "rollout_index": rollout, "reward": reward, "error": None}
    if reward is None:
        out["error"] = {"type": extra.pop("error_type", "timeout"), "message": "too slow"}
    out.update(extra)
    return out


# ---- pass@k / pass^k


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 0, 1, 0.0),
        (4, 1, 1, 0.25),
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 1, 4, 1.0),
        (4, 0, 4, 0.0),
        (5, 2, 3, 0.9),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (10, 3, 4, 1 - 35 / 210),
    ],
)
def test_pass_at_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 4, 4, 1.0),
        (4, 3, 4, 0.0),
        (4, 3, 2, 0.5),  # C(3,2)/C(4,2) = 3/6
        (4, 2, 2, 1 / 6),
        (4, 2, 1, 0.5),
        (5, 3, 3, 0.1),  # C(3,3)/C(5,3)
    ],
)
def test_pass_power_k_matches_hand_computed_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_power_k(n, c, k) == pytest.approx(expected)


def test_pass_at_1_and_pass_power_1_are_the_success_rate() -> None:
    for c in range(6):
        assert pass_at_k(5, c, 1) == pytest.approx(c / 5) == pytest.approx(pass_power_k(5, c, 1))


@pytest.mark.parametrize(("n", "c", "k"), [(4, 5, 1), (4, 1, 0), (4, 1, 5), (0, 0, 1)])
def test_pass_at_k_rejects_impossible_counts(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_powers_of_two_up_to_r() -> None:
    assert powers_of_two_up_to(1) == [1]
    assert powers_of_two_up_to(3) == [1, 2]
    assert powers_of_two_up_to(4) == [1, 2, 4]
    assert powers_of_two_up_to(9) == [1, 2, 4, 8]


# ---- summarize


def test_summary_averages_pass_at_k_over_examples() -> None:
    correct = [4, 3, 2, 1, 0]
    records = [record(t, r, 1.0 if r < c else 0.0) for t, c in enumerate(correct) for r in range(4)]

    summary = summarize(records, rollouts_per_example=4)

    assert summary["pass_at_k"] == pytest.approx({"1": 0.5, "2": (1 + 1 + 5 / 6 + 0.5 + 0) / 5, "4": 0.8})
    assert summary["pass_power_k"] == pytest.approx({"1": 0.5, "2": (1 + 0.5 + 1 / 6) / 5, "4": 0.2})
    assert summary["reward"]["avg"] == pytest.approx(0.5)
    assert summary["reward_by_rollout_index"] == pytest.approx([0.8, 0.6, 0.4, 0.2])
    assert summary["rollouts"] == {"total": 20, "scored": 20, "errored": 0, "masked": 0, "examples": 5}


def test_errored_rollouts_are_counted_and_left_out_of_reward_and_pass_at_k() -> None:
    records = [
        record(0, 0, 1.0, metrics={"acc": 1.0}, usage={"total_tokens": 10}, timing={"rollout_s": 1.0}),
        record(0, 1, None, usage={"total_tokens": 4}, timing={"rollout_s": 3.0}),
        record(1, 0, 0.0, metrics={"acc": 0.0, "len": 7}),
        record(1, 1, 0.0, metrics={"acc": 0.0}),
        record(2, 0, None, error_type="upstream"),
        record(2, 1, None),
    ]

    summary = summarize(records, rollouts_per_example=2)

    assert summary["rollouts"] == {"total": 6, "scored": 3, "errored": 3, "masked": 0, "examples": 3}
    assert summary["reward"]["avg"] == pytest.approx(1 / 3)
    assert summary["reward"]["std"] == pytest.approx((2 / 9) ** 0.5)  # population std of [1, 0, 0]
    assert summary["errors_by_type"] == {"timeout": 2, "upstream": 1}
    assert summary["error_examples"] == {"timeout": "too slow", "upstream": "too slow"}
    # example 0 has one scored rollout, example 2 none: pass@1 over examples 0 and 1, pass@2 over 1 only
    assert summary["pass_at_k"] == pytest.approx({"1": 0.5, "2": 0.0})
    assert summary["pass_k_examples"] == {"1": 2, "2": 1}
    assert summary["metrics"] == pytest.approx({"acc": 1 / 3, "len": 7.0})
    assert summary["usage"] == {"total_tokens": 14}
    assert summary["latency"] == pytest.approx({"mean_rollout_s": 2.0, "max_rollout_s": 3.0})
    assert summary["reward_by_rollout_index"] == pytest.approx([0.5, 0.0])


def test_masked_rollouts_keep_their_reward_but_are_counted_apart_from_every_statistic() -> None:
    masked = {"masked": True, "failure_kind": "judge_failed", "failure_reason": "judge unreachable"}
    records = [
        record(0, 0, 1.0, metrics={"acc": 1.0}),
        {**record(0, 1, 0.0, metrics={"acc": 0.0}), **masked},
        {**record(1, 0, 0.0, metrics={"acc": 0.0}), **masked},
        {**record(1, 1, 0.0), "masked": True, "failure_kind": None},
        record(2, 0, None, error_type="upstream"),
    ]

    summary = summarize(records, rollouts_per_example=2)

    assert summary["rollouts"] == {"total": 5, "scored": 1, "errored": 1, "masked": 3, "examples": 3}
    assert summary["reward"]["avg"] == 1.0 and summary["metrics"] == {"acc": 1.0}  # the masked 0s are not in
    assert summary["pass_at_k"] == {"1": 1.0} and summary["pass_k_examples"] == {"1": 1}
    assert summary["masked_by_kind"] == {"judge_failed": 2, "unspecified": 1}
    assert summary["masked_examples"] == {"judge_failed": "judge unreachable"}
    assert summary["errors_by_type"] == {"upstream": 1}


def test_pass_threshold_decides_what_is_correct() -> None:
    records = [record(0, 0, 0.6), record(0, 1, 0.4)]

    assert summarize(records, rollouts_per_example=2)["pass_at_k"]["1"] == 0.5
    assert summarize(records, rollouts_per_example=2, pass_threshold=0.7)["pass_at_k"]["1"] == 0.0
    assert summarize(records, rollouts_per_example=2, pass_threshold=0.4)["pass_power_k"]["2"] == 1.0


def test_summary_of_nothing_or_only_errors_has_no_reward() -> None:
    empty = summarize([], rollouts_per_example=2)
    failed = summarize([record(0, 0, None)], rollouts_per_example=1)

    assert empty["reward"]["avg"] is None and empty["pass_at_k"] == {}
    assert failed["reward"] == {"avg": None, "std": None, "min": None, "max": None}
    assert failed["reward_by_rollout_index"] == [None]
    assert json.dumps(failed)  # JSON-safe for metadata.json


def test_replay_agreement_reports_mismatches_and_errors() -> None:
    records = [
        record(0, 0, 1.0, recorded_reward=1.0),
        record(1, 0, 0.0, recorded_reward=1.0),
        record(2, 0, None, recorded_reward=0.5),
    ]

    agreement = replay_agreement(records)

    assert agreement is not None
    assert (agreement["compared"], agreement["reproduced"]) == (3, 1)
    assert [m["task_index"] for m in agreement["mismatches"]] == [1, 2]
    assert replay_agreement([record(0, 0, 1.0)]) is None


def test_replay_agreement_leaves_known_unreproducible_rows_out_of_the_verdict() -> None:
    records = [
        record(0, 0, 1.0, recorded_reward=1.0),
        record(2, 0, None, recorded_reward=0.0),  # its recording is known not to reproduce
        record(3, 0, 0.0, recorded_reward=0.0),
    ]

    agreement = replay_agreement(records, known=lambda row: "ends in a reasoning item" if row == 2 else None)

    assert agreement == {
        "compared": 2,
        "reproduced": 2,
        "mismatches": [],
        "known_unreproducible": [{"task_index": 2, "rollout_index": 0, "reason": "ends in a reasoning item"}],
    }


def test_timing_summary_uses_the_current_session() -> None:
    sessions = [
        {"wall_s": 10.0, "stack_start_s": 5.0, "rollouts": 4, "rollouts_s": 2.0},
        {"wall_s": 20.0, "stack_start_s": 6.0, "rollouts": 10, "rollouts_s": 4.0},
    ]

    timing = timing_summary(sessions, 20.0)

    assert timing["rollouts_per_s"] == 2.5 and timing["stack_start_s"] == 6.0
    assert timing["sessions"] == 2 and timing["total_wall_s"] == 30.0


# ---- resume bookkeeping


def test_missing_pairs_are_the_expected_ones_without_a_record() -> None:
    expected = ExpectedRollouts([3], 2)
    done = DoneRollouts(expected)
    for r in [record(0, 0, 1.0), record(2, 1, None), record(1, 0, 0.0), record(9, 9, 1.0)]:
        done.add(r)

    assert list(expected) == [(t, r) for t in range(3) for r in range(2)]
    assert [pair for pair in expected if pair not in done] == [(0, 1), (1, 1), (2, 0)]
    assert [pair for pair in expected if pair not in DoneRollouts(expected)] == list(expected)


def test_dedupe_keeps_the_first_record_of_a_pair_and_only_expected_pairs(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    _write_lines(path, [record(0, 0, 1.0), record(0, 0, 0.0), record(5, 0, 1.0), record(1, 0, 0.5)])
    kept: list[dict[str, Any]] = []

    state = read_resume_state(path, ExpectedRollouts([2], 1), kept.append)

    assert [(r["task_index"], r["reward"]) for r in kept] == [(0, 1.0), (1, 0.5)]
    assert (state.done.duplicates, state.done.unexpected, state.done.count) == (1, 1, 2)
    assert state.done.complete


def test_the_pairs_of_a_mix_are_numbered_per_environment_from_its_stride() -> None:
    expected = ExpectedRollouts([2, 1], 2, stride=1000)

    assert list(expected) == [(0, 0), (0, 1), (1, 0), (1, 1), (1000, 0), (1000, 1)]
    assert [expected.slot(*pair) for pair in expected] == list(range(6))
    assert expected.slot(2, 0) is None and expected.slot(1001, 0) is None and expected.slot(0, 2) is None


def _write_lines(path: Path, records: list[dict[str, Any]], tail: str = "") -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)


def test_read_results_tolerates_and_repairs_a_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    _write_lines(path, [record(0, 0, 1.0), record(0, 1, 0.0)], tail='{"task_index": 1, "rollo')

    records, truncated = read_results(path)
    assert truncated and len(records) == 2
    assert path.read_text().endswith('"rollo')  # read only: untouched

    records, truncated = read_results(path, repair=True)
    assert truncated and len(records) == 2
    assert path.read_text().endswith("}\n")
    with open(path, "a") as f:
        f.write(json.dumps(record(1, 0, 1.0)) + "\n")
    assert [r["task_index"] for r in read_results(path)[0]] == [0, 0, 1]


def test_read_results_adds_a_missing_final_newline_on_repair(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(record(0, 0, 1.0)))

    records, truncated = read_results(path, repair=True)

    assert len(records) == 1 and not truncated
    assert path.read_text().endswith("}\n")


def test_read_results_names_file_and_line_of_a_corrupt_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "results.jsonl"
    path.write_text(json.dumps(record(0, 0, 1.0)) + "\nnot json\n" + json.dumps(record(0, 1, 1.0)) + "\n")

    with pytest.raises(ConfigurationError, match=r"results\.jsonl:2 is not a valid result line") as info:
        read_results(path)
    assert "Delete that line (its rollout then runs again" in str(info.value)  # the fix is named


def test_read_results_of_a_missing_file_is_empty(tmp_path: Path) -> None:
    assert read_results(tmp_path / "results.jsonl") == ([], False)


# ---- results folder


def test_run_folder_name_replaces_slashes_and_unsafe_characters() -> None:
    assert run_folder_name("example_multi_step", "Qwen/Qwen3-8B") == "example_multi_step--Qwen--Qwen3-8B"
    assert run_folder_name("env", "a b:c/../d") == "env--a_b_c--..--d"
    assert "/" not in run_folder_name("env", "../../etc")


def test_results_folder_appends_flushed_lines_and_locks_out_a_second_writer(tmp_path: Path) -> None:
    folder = ResultsFolder.create(tmp_path, "env", "org/model")
    assert folder.path.parent == tmp_path / "env--org--model"
    folder.open_for_append()
    folder.append(record(0, 0, 1.0))
    assert read_results(folder.results_path)[0] == [record(0, 0, 1.0)]  # flushed, readable at once

    second = ResultsFolder(folder.path)
    with pytest.raises(ConfigurationError, match="another run is writing"):
        second.open_for_append()
    folder.close()
    second.open_for_append()
    second.close()


def test_metadata_round_trips_settings_without_secrets(tmp_path: Path) -> None:
    folder = ResultsFolder.create(tmp_path, "env", "m")
    settings = EvalSettings(env="env", nemo_env="env", policy="endpoint", model="m", api_key_var="MY_KEY")
    folder.write_metadata({"settings": settings.to_dict(), "status": "running"})

    reopened = ResultsFolder.existing(folder.path)

    assert EvalSettings.from_dict(reopened.read_metadata()["settings"]) == settings
    assert not list(folder.path.glob("*.tmp"))


def test_resuming_a_folder_without_metadata_says_what_it_holds(tmp_path: Path) -> None:
    run = ResultsFolder.create(tmp_path, "env", "m")
    run.write_metadata({"settings": {}})

    with pytest.raises(ConfigurationError, match=rf"no metadata.json there.*{run.run_id}"):
        ResultsFolder.existing(run.path.parent)


def test_a_session_killed_before_saving_its_time_is_counted_apart_from_the_total() -> None:
    sessions = [{"started_at": 1.0}, {"wall_s": 20.0, "stack_start_s": 6.0, "rollouts": 10, "rollouts_s": 4.0}]

    timing = timing_summary(sessions, 20.0)

    assert timing["sessions"] == 2 and timing["total_wall_s"] == 20.0 and timing["sessions_untimed"] == 1
