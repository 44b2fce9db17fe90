"""`verifiers-nemo eval` SIGKILLed at a random point, then resumed with -R: every (task, rollout) pair
exactly once, no process or port of the killed run's stack left, and the API key (read from a
variable named with -k) nowhere in the results, the output, or the Gym processes.

Both rounds run at once (each is a CLI process with its own stack), which halves the suite's time.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import secrets
import shutil
import signal
import time
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web

from tests.e2e.test_cli import CLI, SynonymPolicy, _child_env
from tests.faults.helpers import cmdline_of, environ_of, pids_with_env, record_figures
from verifiers_nemo._eval import EvalSettings, ResultsFolder, format_summary, read_results, run_metadata
from verifiers_nemo._gym.runtime import cache_dir
from verifiers_nemo._stack.procs import port_accepts

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio(loop_scope="module")]

ENV = "example_multi_step"
EXAMPLES, REPEATS = 5, 4
TOTAL = EXAMPLES * REPEATS
ROUNDS = 2
KEY_VAR = "CANARY_VAR"  # deliberately not secret-looking: only -k says it holds a key
SEED = int(os.environ.get("VN_FAULTS_SEED") or secrets.randbits(32))
PORT_ARG = re.compile(r"port[=:](\d+)")


class KeyRecordingPolicy(SynonymPolicy):
    """tests/e2e/test_cli.py's scripted policy, also recording the Authorization headers it gets."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.authorizations: set[str] = set()
        self.in_flight = 0

    async def _responses(self, request: web.Request) -> web.Response:
        self.authorizations.add(request.headers.get("Authorization", ""))
        self.in_flight += 1
        try:
            return await super()._responses(request)
        finally:
            self.in_flight -= 1

    async def settled(self, timeout: float = 10.0) -> None:
        """Wait until calls a killed client left behind have finished here (and been counted)."""
        deadline = time.monotonic() + timeout
        while self.in_flight and time.monotonic() < deadline:
            await asyncio.sleep(0.02)


@dataclass
class Watch:
    """What was seen of a CLI run's process tree while it ran."""

    processes: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    key_in_environ: dict[int, str] = field(default_factory=dict)
    key_in_cmdline: dict[int, str] = field(default_factory=dict)

    def scan(self, marker: str, cli_pid: int, canary: bytes) -> None:
        cli_command = cmdline_of(cli_pid)
        for pid in pids_with_env(marker):
            if pid == cli_pid:
                continue  # the CLI itself holds the user's environment, key variable included
            command = cmdline_of(pid)
            if command == cli_command:
                # a child caught between fork and exec is still the CLI's image (its memory, its environment);
                # it is checked on a later scan, once it runs what it was started for
                continue
            self.processes.add(pid)
            if "ng_run" in command:
                self.ports.update(int(p) for p in PORT_ARG.findall(command))
            if canary in environ_of(pid):
                self.key_in_environ[pid] = command[:80]
            if canary.decode() in command:
                self.key_in_cmdline[pid] = command[:80]


@dataclass
class Round:
    index: int
    kill_at: int
    canary: str
    marker: str
    out_dir: Path
    run_dir: Path | None = None
    killed_after_s: float = 0.0
    saved_before_kill: int = 0
    truncated_tail: bool = False
    orphans_after_kill: list[int] = field(default_factory=list)
    ports_bound_after_kill: list[int] = field(default_factory=list)
    stale_run_dirs: list[Path] = field(default_factory=list)
    resume_code: int | None = None
    orphans_after_resume: list[int] = field(default_factory=list)
    new_first_calls: int = 0
    lines: list[dict[str, Any]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)
    watch: Watch = field(default_factory=Watch)


def _saved_lines(out_dir: Path) -> int:
    results = list(out_dir.glob("*/*/results.jsonl"))
    return results[0].read_bytes().count(b"\n") if results else -1


async def _wait_gone(marker: str, timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := pids_with_env(marker)) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return left


async def _run_round(r: Round, prompts: list[str]) -> Round:
    env = _child_env() | {KEY_VAR: r.canary, "VN_FAULTS_MARKER": r.marker}
    canary = r.canary.encode()
    async with KeyRecordingPolicy(prompts, [TOTAL] * EXAMPLES, delay=0.25) as policy:
        args = ["eval", ENV, "-b", policy.base_url, "-m", "fake/policy-1", "-k", KEY_VAR]
        args += ["-n", str(EXAMPLES), "-r", str(REPEATS), "-c", "2", "-o", str(r.out_dir), "--save-trace"]
        proc = await asyncio.create_subprocess_exec(
            CLI, *args, cwd=r.out_dir.parent, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
        )
        started = time.monotonic()
        deadline = started + 150
        # the random point: once `kill_at` rollouts are saved (0: as soon as the run folder exists)
        while _saved_lines(r.out_dir) < r.kill_at or not list(r.out_dir.glob("*/*/metadata.json")):
            assert proc.returncode is None, (await proc.communicate())[1].decode()
            assert time.monotonic() < deadline, "the eval saved too few rollouts in time"
            r.watch.scan(r.marker, proc.pid, canary)
            await asyncio.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        r.killed_after_s = time.monotonic() - started
        out, err = await proc.communicate()
        r.outputs += [out.decode(), err.decode()]
        r.orphans_after_kill = await _wait_gone(r.marker, timeout=90)
        r.ports_bound_after_kill = [p for p in r.watch.ports if port_accepts("127.0.0.1", p)]
        r.stale_run_dirs = list((cache_dir() / "runs").glob(f"{ENV}-{proc.pid}-*"))

        (metadata_path,) = r.out_dir.glob("*/*/metadata.json")
        r.run_dir = metadata_path.parent
        records, r.truncated_tail = read_results(r.run_dir / "results.jsonl")
        r.saved_before_kill = len(records)
        await policy.settled()  # a call the killed run had in flight still counts as that run's
        calls_before = sum(policy.first_calls.values())

        policy.delay = 0.05
        resume = await asyncio.create_subprocess_exec(
            CLI, "eval", "-R", str(r.run_dir), "-c", "4", cwd=r.out_dir.parent, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        communicate = asyncio.ensure_future(resume.communicate())
        while not communicate.done():  # watch the resumed run's processes while it runs
            r.watch.scan(r.marker, resume.pid, canary)
            await asyncio.wait({communicate}, timeout=0.1)
            assert time.monotonic() < deadline + 150, "the resumed eval did not finish in time"
        out, err = communicate.result()
        r.outputs += [out.decode(), err.decode()]
        r.resume_code = resume.returncode
        r.orphans_after_resume = await _wait_gone(r.marker, timeout=90)
        r.new_first_calls = sum(policy.first_calls.values()) - calls_before
        r.authorizations = set(policy.authorizations)
    r.lines = [json.loads(line) for line in (r.run_dir / "results.jsonl").read_text().splitlines() if line.strip()]
    r.metadata = json.loads((r.run_dir / "metadata.json").read_text())
    return r


def _prompts(gym_root: Path) -> list[str]:
    path = gym_root / "resources_servers" / ENV / "data" / "example.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [next(m["content"] for m in row["responses_create_params"]["input"] if m["role"] == "user") for row in rows]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def rounds(gym_root: Path, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[list[Round]]:
    rng = random.Random(SEED)
    planned = []
    for index in range(ROUNDS):
        base = tmp_path_factory.mktemp(f"kill-{index}")
        planned.append(
            Round(
                index=index,
                kill_at=rng.randint(0, TOTAL - 2),
                canary=f"sk-canary-{secrets.token_hex(16)}",
                marker=f"vn-faults-{secrets.token_hex(8)}",
                out_dir=base / "out",
            )
        )
    prompts = _prompts(gym_root)
    done = list(await asyncio.gather(*(_run_round(r, prompts) for r in planned)))
    yield done
    for r in done:  # the killed runs' Gym run folders (logs) are left behind by design; tidy them
        for stale in r.stale_run_dirs:
            shutil.rmtree(stale, ignore_errors=True)


async def test_sigkilled_eval_resumes_with_every_pair_exactly_once(rounds: list[Round]) -> None:
    for r in rounds:
        pairs = Counter((line["task_index"], line["rollout_index"]) for line in r.lines)
        record_figures(
            f"eval SIGKILLed at a random point, resumed (round {r.index}, seed {SEED})",
            kill_at_saved=r.kill_at,
            killed_after_s=r.killed_after_s,
            saved_before_kill=r.saved_before_kill,
            truncated_line=r.truncated_tail,
            pairs=len(pairs),
            missing=TOTAL - len(pairs),
            duplicated=sum(n - 1 for n in pairs.values()),
            rerun_after_resume=r.new_first_calls,
        )
        assert r.resume_code == 0, r.outputs[-1]
        assert set(pairs) == {(t, k) for t in range(EXAMPLES) for k in range(REPEATS)}
        assert set(pairs.values()) == {1}
        assert all(line["error"] is None and line["reward"] == 1.0 for line in r.lines)
        assert r.new_first_calls == TOTAL - r.saved_before_kill  # only the missing ones ran again
        assert r.metadata["status"] == "finished"
        assert r.metadata["counts"] == {"expected": TOTAL, "done": TOTAL, "missing": 0}


async def test_a_resumed_run_summarises_its_rollouts_as_one_uninterrupted_run_would(rounds: list[Round]) -> None:
    for r in rounds:
        settings = EvalSettings.from_dict(r.metadata["settings"])
        # what one session would print over the same saved lines (its summary taken over them in one pass)
        assert r.run_dir is not None
        whole = run_metadata(r.metadata, settings, ResultsFolder(r.run_dir), TOTAL, r.lines, r.metadata["sessions"])
        resumed = r.metadata

        assert _without_timing(resumed["summary"]) == _without_timing(whole["summary"])
        assert resumed["summary"]["rollouts"] == {"total": 20, "scored": 20, "errored": 0, "masked": 0, "examples": 5}
        assert resumed["summary"]["pass_at_k"] == {"1": 1.0, "2": 1.0, "4": 1.0}
        shown = [line for line in format_summary(resumed).splitlines() if not line.startswith("Timing")]
        assert shown == [line for line in format_summary(whole).splitlines() if not line.startswith("Timing")]
        # the killed session saved no time of its own: the printed total says so instead of passing it off as all
        killed, resuming = resumed["sessions"]
        assert "wall_s" not in killed and resuming["wall_s"] > 0
        (timing,) = [line for line in "".join(r.outputs[-2:]).splitlines() if line.startswith("Timing")]
        assert "2 sessions" in timing and "not counting 1 that ended without saving its time (killed)" in timing


def _without_timing(summary: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in summary.items() if key != "timing"}


async def test_sigkilled_eval_leaves_no_process_or_port_of_its_stack(rounds: list[Round]) -> None:
    for r in rounds:
        record_figures(
            f"eval SIGKILLed: leftovers (round {r.index})",
            processes_seen=len(r.watch.processes),
            orphans_after_kill=len(r.orphans_after_kill),
            ports_bound_after_kill=len(r.ports_bound_after_kill),
            orphans_after_resume=len(r.orphans_after_resume),
            stale_run_dirs=len(r.stale_run_dirs),
        )
        assert r.orphans_after_kill == [] and r.ports_bound_after_kill == []
        assert r.orphans_after_resume == []
    assert any(len(r.watch.processes) > 3 for r in rounds)  # the watch did see the stacks


async def test_cli_api_key_never_reaches_saved_results_metadata_or_output(rounds: list[Round]) -> None:
    places, found = 0, []
    for r in rounds:
        assert r.authorizations == {f"Bearer {r.canary}"}  # the key was really used
        files = [p for p in r.run_dir.rglob("*") if p.is_file()]
        for d in r.stale_run_dirs:
            files += [p for p in d.rglob("*") if p.is_file() and not p.is_symlink()]
        texts = {str(p): p.read_bytes() for p in files}
        texts |= {f"round {r.index} output {i}": o.encode() for i, o in enumerate(r.outputs)}
        places += len(texts)
        found += [where for where, data in texts.items() if r.canary.encode() in data]
        assert any(line.get("trace") for line in r.lines)  # traces were saved, and searched
    record_figures("canary API key (CLI: results, traces, metadata, output)", places_checked=places, leaks=len(found))
    assert found == []


async def test_cli_api_key_variable_never_reaches_gym_processes(rounds: list[Round]) -> None:
    leaks = {pid: cmd for r in rounds for pid, cmd in (r.watch.key_in_environ | r.watch.key_in_cmdline).items()}
    record_figures(
        "canary API key (CLI: Gym process environments)",
        processes_checked=sum(len(r.watch.processes) for r in rounds),
        leaks=len(leaks),
        leaking=sorted(set(leaks.values()))[:4],
    )
    assert sum(len(r.watch.processes) for r in rounds) > 3
    assert leaks == {}
