"""What a new user hits first (issue 17): every failure ends in one clear line, at once, and leaves
nothing behind; one test per row of the issue's table.

Each CLI run gets a cache folder of its own (``VERIFIERS_NEMO_CACHE_DIR``) and a marker in its
environment that every process it starts inherits, so "nothing left" is checked exactly: no process,
no run folder, no port lock file, no log (except the one a failure message names), no Ray temporary
folder of that run, nothing in the working directory that was not asked for. Supervisors clean up
after their owner exits, so the check polls with a deadline.

Only two runs start a stack that gets ready (the known unreproducible recording, SIGINT while rollouts
run); the stack-start failure uses a server that fails at once; every refusal starts nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_cli import CLI, SynonymPolicy, _child_env
from tests.faults.helpers import (
    COUNTER_ENV,
    cmdline_of,
    held_helper_sessions,
    pids_with_env,
    record_figures,
    session_of,
)
from verifiers_nemo import (
    ConfigurationError,
    NeMoGymHarness,
    NeMoGymTaskset,
    ReplayServer,
    RoutingProxy,
    load_environment,
)
from verifiers_nemo._eval import EvalSettings
from verifiers_nemo._replay import unreproducible_reason

pytestmark = pytest.mark.e2e

ENV = "example_multi_step"
ERROR = "verifiers-nemo: error:"


@dataclass
class Run:
    code: int
    out: str
    err: str
    pid: int
    seconds: float
    cache: Path
    marker: str
    cwd: Path

    @property
    def errors(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith(ERROR)]


def _environ(tmp_path: Path, name: str) -> tuple[dict[str, str], Path, str, Path]:
    cache, cwd = tmp_path / f"{name}-cache", tmp_path / f"{name}-cwd"
    cwd.mkdir()
    marker = f"vn-first-use-{name}-{os.getpid()}-{time.monotonic_ns()}"
    env = _child_env() | {"VERIFIERS_NEMO_CACHE_DIR": str(cache), "VN_FAULTS_MARKER": marker}
    return env, cache, marker, cwd


async def _cli(
    tmp_path: Path,
    name: str,
    *args: str,
    prefix: Sequence[str] = (),
    timeout: float = 180,
    extra_env: dict[str, str] | None = None,
) -> Run:
    env, cache, marker, cwd = _environ(tmp_path, name)
    env |= extra_env or {}
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *prefix, CLI, "eval", *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    return Run(
        proc.returncode or 0, out.decode(), err.decode(), proc.pid, time.monotonic() - started, cache, marker, cwd
    )


def _leftovers(run: Run, *, keep_logs: Sequence[str] = ()) -> dict[str, list[str]]:
    """What the run left: its processes, cache entries (runs, ports, logs), Ray temporary folders. A shared helper
    (the Ray head, a warm parent) that the run started is left running while another process holds it: on a busy
    machine the suite's own hold may reach the warm parent after the run started it."""
    held = held_helper_sessions()
    found: dict[str, list[str]] = {
        "processes": [cmdline_of(pid) for pid in pids_with_env(run.marker) if session_of(pid) not in held],
        "ray temp": [str(p) for p in Path(tempfile.gettempdir()).glob(f"vnr-ray-{run.pid}-*")],
    }
    for part in ("runs", "ports", "logs"):
        folder = run.cache / part
        names = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
        found[part] = [n for n in names if n not in keep_logs]
    return {kind: items for kind, items in found.items() if items}


async def _nothing_left(run: Run, *, keep_logs: Sequence[str] = (), timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while left := _leftovers(run, keep_logs=keep_logs):
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind {timeout:g}s after the run ended: {left}")
        await asyncio.sleep(0.1)


def _one_clear_error(run: Run, code: int) -> str:
    assert (run.code, len(run.errors)) == (code, 1), run.err
    assert "Traceback" not in run.err, run.err
    return run.err[run.err.index(ERROR) :]


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- row 1: a stack-start failure carries the failing server's own last lines -----------------------


async def test_stack_start_failure_shows_the_failing_servers_own_output(tmp_path: Path) -> None:
    broken = "++example_single_tool_call.resources_servers.example_single_tool_call.entrypoint=missing_app.py"
    run = await _cli(tmp_path, "start-failure", "example_single_tool_call", "-a", json.dumps({"overrides": [broken]}))

    message = _one_clear_error(run, 1)
    assert message.startswith(
        f"{ERROR} Gym server example_single_tool_call exited while the stack started. Its last lines:\n"
    )
    assert "can't open file" in message and "missing_app.py': [Errno 2] No such file or directory" in message
    log = Path(message.rsplit("(full log: ", 1)[1].split(")", 1)[0])
    assert log.is_file() and log.parent.parent == run.cache / "logs"  # kept: the message names it
    await _nothing_left(run, keep_logs=[log.parent.name])
    assert list(run.cwd.iterdir()) == []
    record_figures("stack start failure", seconds=run.seconds)


# -- row 2: -b without /v1 on a server that answers only under /v1 ------------------------------------


async def test_base_url_without_v1_is_refused_before_the_stack_starts(tmp_path: Path) -> None:
    async with SynonymPolicy([], []) as policy:  # answers under /v1 only, as vLLM does
        base = policy.base_url.removesuffix("/v1")
        run = await _cli(tmp_path, "no-v1", ENV, "-b", base, "-m", "fake/policy-1", "-s")

    message = _one_clear_error(run, 2)
    assert f"Did you mean -b {base}/v1?" in message
    assert "Starting the Gym stack" not in run.err and run.seconds < 30
    await _nothing_left(run)
    assert list(run.cwd.iterdir()) == [] and not run.cache.exists()


# -- row 3: a judge-scored environment given no judge, refused before anything starts (CLI and API) ----


async def test_judge_scored_environment_is_refused_before_anything_starts(tmp_path: Path) -> None:
    async with SynonymPolicy([], []) as policy:  # a model endpoint, but no judge (the replay would replay it)
        run = await _cli(tmp_path, "judge", "aalcr", "-b", policy.base_url, "-m", "fake/policy-1", "-s")

    message = _one_clear_error(run, 2)
    assert "Gym environment aalcr scores with a judge model" in message and "--judge-base-url" in message
    assert "Starting the Gym stack" not in run.err and "Evaluating" not in run.err
    await _nothing_left(run)
    assert list(run.cwd.iterdir()) == [] and not run.cache.exists()  # no empty run folder either


def test_api_refuses_a_judge_scored_environment_before_the_proxy_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path / "cache"))
    proxy = RoutingProxy()  # handed to the harness, so a start would show on it
    env = load_environment("aalcr", proxy=proxy)

    for step in (env.harness.check, env.harness.start):
        with pytest.raises(ConfigurationError, match="aalcr scores with a judge model"):
            step()
    env.close()

    assert not proxy.running and not env.harness.started and not (tmp_path / "cache").exists()


# -- row 4: replaying an environment marked † is refused with the reason `envs` shows ----------------
# (a 409 from the replay is never retried: tests/unit/test_upstream_chat.py, the upstream's owner's test)


@pytest.mark.parametrize("env", ["blackjack", "workplace_assistant"])
async def test_replay_of_an_environment_marked_dagger_is_refused_with_its_reason(tmp_path: Path, env: str) -> None:
    run = await _cli(tmp_path, env, env, "-s")

    message = _one_clear_error(run, 2)
    reason = unreproducible_reason(env)
    assert reason and f"{env}'s recorded rollouts cannot be replayed: {reason}" in message
    assert "marked † in `verifiers-nemo envs`" in message and "-b URL -m MODEL" in message
    assert "Starting the Gym stack" not in run.err
    await _nothing_left(run)
    assert list(run.cwd.iterdir()) == [] and not run.cache.exists()


# -- rows 5 and 9: a known unreproducible row out of the verdict; -n beyond the dataset ---------------


async def test_known_unreproducible_row_is_left_out_of_the_verdict_and_n_beyond_the_dataset_is_noted(
    tmp_path: Path,
) -> None:
    run = await _cli(tmp_path, "equivalence", "equivalence_rule", "-n", "50", "-s", "-o", "out")

    assert run.code == 0, run.err
    assert "note: -n 50, but example_rollouts.jsonl has 5 examples; running all." in run.err
    assert "5 examples x 1 rollout = 5" in run.err
    reason = unreproducible_reason("equivalence_rule", 2)
    assert f"note: the recording of task 2 is known not to reproduce ({reason}); it is left out" in run.err
    assert "Replay       4/4 rewards equal the recorded ones (all reproduced)" in run.out
    assert f"left out: 1 rollout of task 2, whose recording is known not to reproduce ({reason})" in run.out
    assert "MISMATCH" not in run.out
    (metadata_path,) = (run.cwd / "out").glob("*/*/metadata.json")
    replay = json.loads(metadata_path.read_text())["summary"]["replay"]
    assert (replay["compared"], replay["reproduced"], replay["mismatches"]) == (4, 4, [])
    assert [k["task_index"] for k in replay["known_unreproducible"]] == [2]
    await _nothing_left(run)
    assert [p.name for p in run.cwd.iterdir()] == ["out"]  # what -s asked for, nothing else
    record_figures("replay with a known row", seconds=run.seconds)


# -- rows 6 and 7: resume into a read-only folder; resume of a finished run with its endpoint down ------


def _saved_run(folder: Path, settings: EvalSettings, records: list[dict[str, Any]], **metadata: Any) -> Path:
    folder.mkdir(parents=True)
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "metadata.json").write_text(json.dumps({"settings": settings.to_dict(), **metadata}, indent=2))
    return folder


def _record(task: int, reward: float, **extra: Any) -> dict[str, Any]:
    return {
        "task_index": task,
        "rollout_index": 0,
        "reward": reward,
        "error": None,
        "metrics": {},
        "usage": {"total_tokens": 110},
        "timing": {"rollout_s": 0.25},
        **extra,
    }


def _read_only(path: Path) -> list[str]:
    """A command prefix under which ``path`` is read-only, even for root (a read-only bind mount in a
    mount namespace of its own); for other users, ``path`` loses its write bits instead."""
    if os.geteuid() != 0:
        path.chmod(0o555 if path.is_dir() else 0o444)
        return []
    unshare = shutil.which("unshare")
    probe = [unshare or "unshare", "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0"', str(path)]
    if unshare is None or subprocess.run(probe, capture_output=True).returncode != 0:
        pytest.skip("running as root without mount namespaces: nothing can make a folder read-only for root")
    return [unshare, "-m", "sh", "-c", 'mount --bind -o ro "$0" "$0" && exec "$@"', str(path)]


@pytest.mark.parametrize("read_only", ["the folder", "results.jsonl"])
async def test_resume_into_a_read_only_run_is_one_line_naming_the_folder(tmp_path: Path, read_only: str) -> None:
    settings = EvalSettings(env=ENV, nemo_env=ENV, policy="replay", model="replay", num_examples=2)
    folder = _saved_run(tmp_path / "run", settings, [_record(0, 1.0, recorded_reward=1.0)], status="interrupted")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    prefix = _read_only(folder if read_only == "the folder" else folder / "results.jsonl")
    try:
        run = await _cli(tmp_path, "read-only", "-R", str(folder), prefix=prefix)
    finally:
        for path in (folder, folder / "results.jsonl"):
            path.chmod(0o755 if path.is_dir() else 0o644)

    message = _one_clear_error(run, 2)
    assert message.startswith(f"{ERROR} cannot write to the run folder {folder} (")
    assert "Make it writable, or copy the folder somewhere writable" in message
    assert "Starting the Gym stack" not in run.err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    await _nothing_left(run)


async def test_resume_of_a_finished_run_shows_its_summary_without_checking_the_endpoint(tmp_path: Path) -> None:
    down = f"http://127.0.0.1:{_closed_port()}/v1"
    settings = EvalSettings(
        env=ENV, nemo_env=ENV, policy="endpoint", model="fake/policy-1", base_url=down, num_examples=1
    )
    session = {"started_at": 1.0, "wall_s": 12.5, "stack_start_s": 10.1, "rollouts": 1, "rollouts_s": 0.5}
    folder = _saved_run(tmp_path / "run", settings, [_record(0, 1.0)], status="finished", sessions=[session])
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    run = await _cli(tmp_path, "finished", "-R", str(folder))

    assert (run.code, run.errors) == (0, []), run.err
    assert f"Nothing to run: every rollout of {folder} is done (1 of 1)." in run.err
    assert "Cannot reach" not in run.err and "Starting the Gym stack" not in run.err
    assert "Rollouts     1 of 1 (1 example x 1) · 1 scored · 0 errored" in run.out
    assert "wall 12.50s · stack start 10.10s · 2.00 rollouts/s" in run.out  # the run's real timings
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before  # nothing rewritten
    await _nothing_left(run)


async def test_resume_on_another_nemo_gym_release_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """A run folder copied to a machine whose Gym runtime has another nemo-gym: its rows, agents and rewards are
    the first release's, so the resume refuses, naming both releases and the fix."""
    settings = EvalSettings(env=ENV, nemo_env=ENV, policy="replay", model="replay", num_examples=2)
    saved = {"versions": {"nemo-gym": "0.3.0"}, "counts": {"expected": 2, "done": 1, "missing": 1}}
    folder = _saved_run(tmp_path / "run", settings, [_record(0, 1.0, recorded_reward=1.0)], **saved)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}

    run = await _cli(tmp_path, "release", "-R", str(folder))

    message = _one_clear_error(run, 2)
    assert message.startswith(
        f"{ERROR} -R {folder}: the run was started on nemo-gym 0.3.0, and the Gym runtime found here has nemo-gym "
    )
    assert "Point VERIFIERS_NEMO_GYM_PYTHON at a Gym runtime with nemo-gym 0.3.0" in message
    assert "Starting the Gym stack" not in run.err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    await _nothing_left(run)


async def test_resume_whose_data_gives_other_rows_is_refused_before_anything_starts(tmp_path: Path) -> None:
    """The run expected 3 rollouts; its data (2 examples x 1) now gives 2: other rows, e.g. a relative jsonl_path
    resolved from another folder. The resume refuses rather than mix the two."""
    settings = EvalSettings(env=ENV, nemo_env=ENV, policy="replay", model="replay", num_examples=2)
    saved = {"counts": {"expected": 3, "done": 1, "missing": 2}}
    folder = _saved_run(tmp_path / "run", settings, [_record(0, 1.0, recorded_reward=1.0)], **saved)

    run = await _cli(tmp_path, "rows", "-R", str(folder))

    message = _one_clear_error(run, 2)
    assert message.startswith(f"{ERROR} -R {folder}: the run expected 3 rollouts and its data now gives 2, ")
    assert "resume from the folder the run was started in" in message
    assert "Starting the Gym stack" not in run.err
    await _nothing_left(run)


# -- row 8: run_sync where an event loop already runs (a Jupyter cell) --------------------------------


@pytest.mark.asyncio(loop_scope="package")
async def test_run_sync_inside_a_running_event_loop_runs_the_rollouts(harness: NeMoGymHarness) -> None:
    tasks = NeMoGymTaskset(COUNTER_ENV, recorded=True, limit=3)
    replay = ReplayServer.from_tasks(tasks).start()  # its own thread: this loop is blocked meanwhile
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # "coroutine ... was never awaited"
            results = harness.run_sync(tasks, replay.endpoint_for, concurrency=3)
    finally:
        replay.stop()

    assert sorted((r.task_index, r.error, r.reward) for r in results) == [
        (t.task_index, None, t.recorded_reward) for t in tasks
    ]
    assert not [t for t in threading.enumerate() if t.name.startswith("run_sync-")]
    assert all(not loop.is_closed() for loop in harness.agents.session_loops)  # the worker's loop left no session


# -- row 10: packages that cannot be installed name the CLI's way to ask for isolated venvs -----------
# (extra requirements install themselves now: tests/e2e/test_requirements.py; here uv is offline with an
# empty cache, so code_gen's cannot)


async def test_packages_that_cannot_be_installed_name_the_cli_flag(tmp_path: Path) -> None:
    offline = {"UV_OFFLINE": "1", "UV_CACHE_DIR": str(tmp_path / "empty-uv-cache")}
    run = await _cli(tmp_path, "code-gen", "code_gen", "-s", extra_env=offline)

    message = _one_clear_error(run, 1)
    assert "Gym environment code_gen needs packages the Gym runtime" in message and "code_gen: numpy" in message
    assert "could not be installed" in message
    assert """or add -a '{"isolated_venvs": true}' to let nemo-gym build""" in message
    assert "isolated_venvs=True" not in message
    await _nothing_left(run, keep_logs=[p.name for p in (run.cache / "logs").glob("*")])


# -- row 11: SIGINT twice, 0.3 s apart ----------------------------------------------------------------


async def _read_until(stream: asyncio.StreamReader, text: str, seen: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not any(text in line for line in seen):
        line = await asyncio.wait_for(stream.readline(), max(0.1, deadline - time.monotonic()))
        assert line, f"the run ended before {text!r}: {''.join(seen)}"
        seen.append(line.decode())


@pytest.mark.parametrize("when", ["while the stack starts", "while rollouts run"])
async def test_sigint_twice_leaves_nothing_behind(tmp_path: Path, example_prompts: list[str], when: str) -> None:
    async with SynonymPolicy(example_prompts, [4] * 5, delay=0.5) as policy:
        args = ["-b", policy.base_url, "-m", "fake/policy-1", "-r", "4", "-c", "2", "-s", "-o", "out"]
        env, cache, marker, cwd = _environ(tmp_path, "sigint")
        proc = await asyncio.create_subprocess_exec(
            CLI, "eval", ENV, *args, cwd=cwd, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        assert proc.stderr is not None
        seen: list[str] = []
        await _read_until(proc.stderr, "Starting the Gym stack", seen, 60)
        runs = cache / "runs"  # the stack's run folder exists from its launch on (it joins the machine's Ray head)
        deadline = time.monotonic() + 120
        while not (list(runs.glob(f"*-{proc.pid}-*")) and (when != "while rollouts run" or policy.first_calls)):
            assert time.monotonic() < deadline and proc.returncode is None, f"not {when} in time: {''.join(seen)}"
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        # The scenario itself: an impatient second Ctrl-C, while the first one's stop is under way. Sent as soon as
        # the run says it is stopping: a fixed 0.3 s could come after the whole stop (0 rollouts done, and a stack
        # that joined the machine's Ray head stops in well under a second), and the run had exited 130 by then.
        await _read_until(proc.stderr, "again to force", seen, 60)
        proc.send_signal(signal.SIGINT)
        _, rest = await asyncio.wait_for(proc.communicate(), 60)

    run = Run(proc.returncode or 0, "", "".join(seen) + rest.decode(), proc.pid, 0.0, cache, marker, cwd)
    assert run.code == -signal.SIGINT, run.err  # the shell shows 130
    assert "again to force" in run.err and "Traceback" not in run.err
    await _nothing_left(run)
    assert [p.name for p in cwd.iterdir()] in (["out"], [])  # only what -s asked for


@pytest.fixture(scope="module")
def example_prompts(gym_root: Path) -> list[str]:
    from tests.e2e.test_cli import _text

    path = gym_root / "resources_servers" / ENV / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [
        next(_text(m["content"]) for m in row["responses_create_params"]["input"] if m["role"] == "user")
        for row in rows
    ]
