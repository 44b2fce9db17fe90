"""From a real-model run to real trainers, as a user goes (docs/guides/training-data.md): ``verifiers-nemo eval
--exact-tokens --save-trace`` of the tier's SmolLM2 on a packaged environment, ``verifiers-nemo export --format ...``
of each training-data format, then in ``.venv-trl`` (TRL, transformers, torch on CPU: ``.ci/setup-trl``) ``datasets``
loads every file, the model's tokenizer decodes the exact-token rows, and TRL's ``SFTTrainer`` and ``DPOTrainer`` each
run one optimisation step on the real model from them (``trl_steps.py``).

The environment is ``example_tool_call_multireward`` (one tool, a reward graded 0-3 on the call's format, schema and
correctness), sampled with the tool call required, Gym's ``max_steps`` 2 and temperature 1.3, so that a task's rollouts
differ in reward (preference pairs need that: measured, every task of 3 had 2 or 3 distinct rewards) and about half
are two-turn (the tool's result between two sampled turns: what the loss mask must leave out)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo._cli.main import main
from verifiers_nemo._export.options import FORMATS

from .server import CHAT_TEMPLATE, RealModelServer, find_build

ROOT = Path(__file__).resolve().parents[2]
CLI = str(Path(sys.executable).with_name("verifiers-nemo"))
TRL_PYTHON = ROOT / ".venv-trl" / "bin" / "python"
ENV = "example_tool_call_multireward"
KEY_VAR = "SMOL_API_KEY"


def _lines(run: Path) -> dict[tuple[int, int], dict[str, Any]]:
    lines = (json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip())
    return {(line["task_index"], line["rollout_index"]): line for line in lines}


@pytest.fixture(scope="module")
def run(real_model: RealModelServer, tmp_path_factory: pytest.TempPathFactory) -> Path:
    output = tmp_path_factory.mktemp("runs")
    argv = [CLI, "eval", ENV, "-b", real_model.base_url, "-m", real_model.model, "-k", KEY_VAR, "--api", "chat"]
    argv += ["--exact-tokens", "--save-trace", "-n", "3", "-r", "4", "-t", "48", "-T", "1.3"]
    argv += ["-S", '{"tool_choice": "required"}', "-a", '{"max_steps": 2}', "-s", "-o", str(output)]
    done = subprocess.run(argv, env={**os.environ, KEY_VAR: "EMPTY"}, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stderr[-3000:]
    (metadata,) = output.glob("*/*/metadata.json")
    return metadata.parent


@pytest.fixture(scope="module")
def exported(run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every format as Parquet, and the conversations as JSONL too, written by the export command."""
    folder = tmp_path_factory.mktemp("exports")
    for form, suffix in [*((f, ".parquet") for f in FORMATS), ("sft-messages", ".jsonl")]:
        said = io.StringIO()
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            code = main(["export", str(run), "--format", form, "-o", str(folder / f"{form}{suffix}")])
        assert code == 0, said.getvalue()
    return folder


@pytest.fixture(scope="module")
def consumed(run: Path, exported: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What ``trl_steps.py`` found and did in ``.venv-trl``."""
    if not TRL_PYTHON.exists():
        pytest.fail(f"{TRL_PYTHON} is missing: run `bash .ci/setup-tests` (it builds it with .ci/setup-trl)", False)
    argv = [str(TRL_PYTHON), str(Path(__file__).with_name("trl_steps.py")), "--model", str(find_build().model)]
    argv += ["--chat-template", str(CHAT_TEMPLATE), "--results", str(run / "results.jsonl"), "--exports", str(exported)]
    argv += ["--out", str(tmp_path_factory.mktemp("trl"))]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("VIRTUAL_ENV", None)
    cwd = tmp_path_factory.mktemp("cwd")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, cwd=cwd)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_every_format_of_a_real_model_run_loads_with_datasets(run: Path, exported: Path, consumed: dict) -> None:
    import datasets

    lines = _lines(run)
    scored = [line for line in lines.values() if line["error"] is None and not line["masked"]]
    assert len(lines) == 12 and len(scored) == 12, [line["error"] for line in lines.values()]
    rows = {
        path.name: datasets.load_dataset(
            "parquet" if path.suffix == ".parquet" else "json", data_files=str(path), split="train",
            cache_dir=str(exported / ".hf"),
        )
        for path in exported.iterdir() if path.suffix in (".parquet", ".jsonl")
    }  # fmt: skip
    assert {name: len(data) for name, data in rows.items()} == {
        name: loaded["rows"] for name, loaded in consumed["loaded"].items()
    }  # the same in the trainer's venv (its own datasets and pyarrow)
    # exact tokens: every rollout one sample
    assert len(rows["sft-tokens.parquet"]) == 12 and set(rows["sft-tokens.parquet"]["samples"]) == {1}
    assert len(rows["sft-messages.parquet"]) == len(rows["sft-messages.jsonl"]) == 12
    assert len(rows["rollout-groups.parquet"]) == 12
    pairs = rows["preferences.parquet"]
    assert 1 <= len(pairs) <= 3  # best against worst, a task whose rollouts all scored the same gives none
    for pair in pairs:
        assert pair["chosen_reward"] - pair["rejected_reward"] >= 0.1
        assert pair["prompt_token_ids"] and pair["chosen_token_ids"] and pair["rejected_mask"]  # exact tokens: kept
        chosen = lines[(pair["task_index"], pair["chosen_rollout_index"])]
        assert pair["prompt_token_ids"] == chosen["trace"][0]["prompt_token_ids"]
        assert json.loads(pair["tools"])[0]["function"]["name"] == "get_weather"


def test_exact_token_rows_decode_to_the_saved_transcript_with_the_mask_on_the_sampled_tokens_only(
    run: Path, consumed: dict
) -> None:
    lines = _lines(run)
    assert len(consumed["decoded"]) == 12
    assert any(len(row["calls"]) >= 2 for row in consumed["decoded"]), "no two-turn rollout to check the mask across"
    for row in consumed["decoded"]:
        line = lines[(row["task_index"], row["rollout_index"])]
        calls = [call for call in line["trace"] if call["index"] in row["calls"]]
        sampled = [s for s in row["segments"] if s["sampled"]]
        between = [s for s in row["segments"] if not s["sampled"]]
        # the mask is 1 on exactly the tokens each call sampled, one run per call, and 0 on everything between
        assert [s["tokens"] for s in sampled] == [call["completion_token_ids"] for call in calls]
        assert row["segments"][0]["sampled"] and len(between) == len(calls) - 1
        assert [s["text"] for s in sampled] == consumed["calls"][f"{row['task_index']}/{row['rollout_index']}"]
        # ... and the text is the transcript the run saved: its prompt, each assistant turn, each tool result
        user = next(m["content"] for m in line["prompt"] if m["role"] == "user")
        assert user in row["prompt"] and "get_weather" in row["prompt"]  # the tools, rendered into the prompt
        turns = [m for m in line["completion"] if m["role"] == "assistant"]
        results = [m for m in line["completion"] if m["role"] == "tool"]
        assert len(turns) == len(sampled)
        for turn, segment in zip(turns, sampled, strict=True):
            for call in turn.get("tool_calls") or ():
                written = _tool_calls(segment["text"])
                assert {"name": call["function"]["name"], "arguments": json.loads(call["function"]["arguments"])} in (
                    written
                ), (segment["text"], call)
            if not turn.get("tool_calls"):
                assert turn["content"].strip() in segment["text"]
        for result, segment in zip(results, between, strict=False):
            assert result["content"] in segment["text"]


def _tool_calls(text: str) -> list[dict[str, Any]]:
    """The Hermes tool calls a sampled turn wrote, read as vLLM's ``hermes`` parser reads them.

    ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``; the last block may be left open (the turn ended at
    EOS or ``max_tokens`` right after the JSON), and what follows the JSON object (an end-of-turn token) is not part
    of the call.
    """
    calls = []
    decoder = json.JSONDecoder()
    for closed, unclosed in re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", text, re.DOTALL):
        with contextlib.suppress(ValueError):
            call, _ = decoder.raw_decode((closed or unclosed).strip())
            calls.append(call)
    return calls


def test_one_trl_sft_step_and_one_dpo_step_run_on_the_real_model_from_the_exported_data(consumed: dict) -> None:
    sft, dpo = consumed["sft"], consumed["dpo"]
    assert sft["steps"] == 1 and sft["finite"] and sft["moved"] and sft["rows"] == 12, sft
    assert dpo["steps"] == 1 and dpo["finite"] and dpo["moved"] and dpo["rows"] >= 1, dpo
