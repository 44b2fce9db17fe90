"""Training-grade token IDs made visible: one rollout's record (results line, verifiers' trace info), a run's
figures (metadata.json, the summary, the report) and the exact-token console warnings, all from one computation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from verifiers_nemo import PolicyCall
from verifiers_nemo._cli.token_warnings import TokenBreakWarnings
from verifiers_nemo._eval import EvalSettings, format_summary, run_metadata, slim_record
from verifiers_nemo._eval.token_ids import (
    EXACT_BREAK,
    FIX,
    describe_token_ids,
    rollout_token_ids,
    summarize_token_ids,
)
from verifiers_nemo._report import load_run

ENV = "example_multi_step"


def call(index: int, prompt: list[int] | None, completion: list[int] | None, *, ok: bool = True) -> PolicyCall:
    return PolicyCall(
        index=index,
        status=200 if ok else 502,
        latency_s=0.1,
        attempts=1,
        started_at=0.0,
        response_json=b'{"output": []}' if ok else None,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=None if completion is None else [-0.5] * len(completion),
    )


CONTIGUOUS = [call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 4, 5], [6])]
RETOKENIZED = [call(0, [1, 2], [3, 4]), call(1, [1, 2, 3, 9, 5], [6]), call(2, [1, 2, 3, 9, 5, 6, 7], [8])]
SINGLE = [call(0, [1, 2], [3])]


def record(task: int, trace: list[PolicyCall], *, save_trace: bool = False) -> dict[str, Any]:
    """A results.jsonl line as the eval writes it: with ``token_ids``, or (an older line) only its trace."""
    line: dict[str, Any] = {"task_index": task, "rollout_index": 0, "reward": 1.0, "error": None}
    if save_trace:
        line["trace"] = [c.to_dict() for c in trace]
    else:
        line["token_ids"] = rollout_token_ids(trace)
    return line


def test_a_rollout_says_whether_its_calls_are_one_training_sample_and_where_they_broke() -> None:
    assert rollout_token_ids(CONTIGUOUS) == {"calls": 2, "contiguous": True, "samples": 1}
    broken = rollout_token_ids(RETOKENIZED)
    assert broken is not None
    assert (broken["contiguous"], broken["broken_at"], broken["samples"]) == (False, 1, 2)
    assert broken["reason"].startswith("prompt tokens diverge from call 0's prompt + completion at position 3")


def test_no_token_ids_recorded_gives_no_record_and_a_call_without_them_is_a_break() -> None:
    assert rollout_token_ids([call(0, None, None), call(1, None, None)]) is None
    assert rollout_token_ids([call(0, [1], [2]), call(1, [1], [2], ok=False)]) == {
        "calls": 1,
        "contiguous": True,
        "samples": 1,
    }
    missing = rollout_token_ids([call(0, [1], [2]), call(1, None, None)])
    assert missing is not None and missing["broken_at"] == 1 and missing["reason"] == "has no token IDs recorded"


def test_saved_traces_give_the_same_record_as_the_calls() -> None:
    for trace in (CONTIGUOUS, RETOKENIZED, SINGLE):
        saved = json.loads(json.dumps([c.to_dict() for c in trace]))
        assert rollout_token_ids(saved) == rollout_token_ids(trace)


def test_without_exact_tokens_the_summary_says_what_is_not_contiguous_and_the_fix() -> None:
    records = [record(0, RETOKENIZED), record(1, RETOKENIZED), record(2, SINGLE), {"task_index": 3, "rollout_index": 0}]

    summary = summarize_token_ids(records, exact_tokens=False)

    assert summary is not None
    assert (summary["rollouts"], summary["multi_turn"], summary["contiguous"]) == (3, 2, 0)
    assert summary["breaks"][0] == {
        "task_index": 0,
        "rollout_index": 0,
        "call": 1,
        "reason": rollout_token_ids(RETOKENIZED)["reason"],  # type: ignore[index]
    }
    text = describe_token_ids(summary)
    assert text.startswith("0 of 2 multi-turn rollouts contiguous (re-tokenized at call 1: prompt tokens diverge")
    assert text.endswith(f"; {FIX}") and "--exact-tokens with vLLM --enable-scale-out" in FIX


def test_without_exact_tokens_even_contiguous_rollouts_are_not_called_exact() -> None:
    text = describe_token_ids(summarize_token_ids([record(0, CONTIGUOUS)], exact_tokens=False))  # type: ignore[arg-type]

    assert text.startswith("1 of 1 multi-turn rollouts contiguous (each turn re-rendered by the server")
    assert text.endswith(FIX)


def test_with_exact_tokens_contiguous_is_said_and_a_break_is_a_warning() -> None:
    good = summarize_token_ids([record(0, CONTIGUOUS), record(1, CONTIGUOUS)], exact_tokens=True)
    bad = summarize_token_ids([record(0, CONTIGUOUS), record(4, RETOKENIZED)], exact_tokens=True)

    assert good is not None and "fix" not in good
    assert (
        describe_token_ids(good) == "2 of 2 multi-turn rollouts contiguous (exact tokens): each is one training sample"
    )
    assert bad is not None and bad["fix"] == EXACT_BREAK
    assert describe_token_ids(bad).startswith(
        "WARNING: 1 of 2 multi-turn rollouts contiguous despite --exact-tokens (task 4 rollout 0 at call 1: "
    )


def test_no_token_ids_anywhere_means_no_figures() -> None:
    assert summarize_token_ids([{"task_index": 0, "rollout_index": 0}], exact_tokens=True) is None


def _settings(exact_tokens: bool) -> EvalSettings:
    return EvalSettings(
        env=ENV,
        nemo_env=ENV,
        policy="endpoint",
        model="smol",
        base_url="http://h:1/v1",
        rollouts_per_example=1,
        sampling_args={"return_tokens": True},
        exact_tokens=exact_tokens,
    )


def test_metadata_and_printed_summary_carry_the_figures() -> None:
    records = [slim_record(record(0, RETOKENIZED)), slim_record(record(1, CONTIGUOUS))]

    metadata = run_metadata({}, _settings(False), None, 2, records, [])
    printed = format_summary(metadata)

    assert metadata["settings"]["exact_tokens"] is False
    assert metadata["summary"]["token_ids"]["contiguous"] == 1
    assert "Token IDs    1 of 2 multi-turn rollouts contiguous (re-tokenized at call 1: " in printed
    assert f"\n             {FIX}\n" in printed


def test_exact_run_summary_says_every_rollout_is_contiguous() -> None:
    records = [slim_record(record(i, CONTIGUOUS)) for i in range(4)]

    metadata = run_metadata({}, _settings(True), None, 4, records, [])

    assert metadata["settings"]["exact_tokens"] is True
    assert "Token IDs    4 of 4 multi-turn rollouts contiguous (exact tokens)" in format_summary(metadata)


def test_no_token_ids_means_no_token_line() -> None:
    metadata = run_metadata({}, _settings(False), None, 1, [{"task_index": 0, "rollout_index": 0, "reward": 1.0}], [])

    assert "token_ids" not in metadata["summary"] and "Token IDs" not in format_summary(metadata)


def test_a_resumed_run_counts_lines_saved_with_only_their_trace() -> None:
    """Resume reloads results.jsonl lines and slims them: a line written before ``token_ids`` existed (with
    --save-trace) still counts, from its trace."""
    reloaded = [json.loads(json.dumps(record(0, RETOKENIZED, save_trace=True)))]
    slim = [slim_record(line) for line in reloaded] + [slim_record(record(1, CONTIGUOUS))]

    assert "trace" not in slim[0] and slim[0]["token_ids"]["broken_at"] == 1
    summary = run_metadata({}, _settings(False), None, 2, slim, [])["summary"]["token_ids"]
    assert (summary["multi_turn"], summary["contiguous"]) == (2, 1)


def test_exact_token_breaks_are_warned_on_the_console_a_few_times() -> None:
    said: list[str] = []
    warnings = TokenBreakWarnings(said.append, shown=2)

    for task in range(4):
        warnings.check(record(task, RETOKENIZED))
    warnings.check(record(9, CONTIGUOUS))

    assert warnings.count == 4 and len(said) == 3
    assert said[0].startswith("warning: exact tokens: task 0 rollout 0 is not token-contiguous: at call 1: ")
    assert EXACT_BREAK in said[0] and "further breaks" in said[2]


def test_the_report_shows_the_figures_of_our_runs(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    records = [record(0, RETOKENIZED), record(1, CONTIGUOUS, save_trace=True)]
    (run / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    metadata = run_metadata({}, _settings(False), None, 2, [slim_record(r) for r in records], [])
    (run / "metadata.json").write_text(json.dumps(metadata))

    info = load_run(run).info

    assert info["token IDs"] == describe_token_ids(metadata["summary"]["token_ids"])
    assert info["token IDs"].startswith("1 of 2 multi-turn rollouts contiguous (re-tokenized at call 1:")


def test_the_report_shows_the_figures_of_verifiers_traces(tmp_path: Path) -> None:
    def episode(key: int, trace: list[PolicyCall]) -> dict[str, Any]:
        info = {"nemo_gym": {"reward": 1.0, "env": ENV, "token_ids": rollout_token_ids(trace)}}
        return {"task": {"key": key, "data": {"id": key}}, "traces": [{"info": info, "rewards": {}, "nodes": []}]}

    traces = tmp_path / "traces.jsonl"
    traces.write_text(json.dumps(episode(0, RETOKENIZED)) + "\n" + json.dumps(episode(1, RETOKENIZED)) + "\n")

    text = load_run(traces).info["token IDs"]

    assert text.startswith("0 of 2 multi-turn rollouts contiguous (re-tokenized at call 1:")
    assert "verifiers-nemo eval --exact-tokens" in text
