"""`verifiers-nemo ps`: what runs for me, what is left over, and `--clean`, on real processes standing in for a
stack's and a helper's (the stack itself: tests/e2e/test_ps.py). Processes of another user (nobody, by setpriv: the
suite runs as root, as CI does) are never listed or signalled, whatever their environment says."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from verifiers_nemo._cli.main import main
from verifiers_nemo._stack.leases import start_time, take_lease, write_state
from verifiers_nemo._stack.plan import RUN_VAR
from verifiers_nemo._stack.procs import process_alive

GONE_PID = 4_000_000  # above any pid_max: an owner that is surely gone
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]


def _sleeper(run_dir: Path | None = None, *, as_nobody: bool = False, new_session: bool = False) -> subprocess.Popen:
    env = os.environ | ({RUN_VAR: str(run_dir)} if run_dir else {})
    argv = [*(AS_NOBODY if as_nobody else []), "sleep", "120"]
    return subprocess.Popen(argv, env=env, start_new_session=new_session)


def _wait_started(proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 30
    while start_time(proc.pid) is None or b"sleep" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
        assert time.monotonic() < deadline, "the stand-in process did not start"
        time.sleep(0.05)


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VERIFIERS_NEMO_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _ps(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["ps", *args]) == 0
    return capsys.readouterr().out


def _ps_json(capsys: pytest.CaptureFixture[str]) -> dict:
    return json.loads(_ps(capsys, "--json"))


def _stack(inventory: dict, run_id: str) -> dict | None:
    return next((s for s in inventory["stacks"] if s["run_id"] == run_id), None)


def test_a_stack_whose_owner_is_gone_is_left_over_and_clean_stops_it_and_removes_its_run_folder(
    processes: list[subprocess.Popen], cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"mcqa-{GONE_PID}-0badc0de"
    (cache / "runs" / run_id).mkdir(parents=True)
    processes.append(proc := _sleeper(cache / "runs" / run_id))
    _wait_started(proc)

    stack = _stack(_ps_json(capsys), run_id)
    assert stack is not None and stack["left_over"] and stack["env"] == "mcqa"
    assert stack["log_dir"] == str(cache / "logs" / run_id)
    assert stack["owner"] == GONE_PID and stack["processes"]["pids"] == [proc.pid]
    text = _ps(capsys)
    assert f"{run_id}  LEFT OVER: its owner (pid {GONE_PID}) is gone" in text
    assert "`verifiers-nemo ps --clean` stops them" in text

    out = _ps(capsys, "--clean")
    assert f"stack {run_id}: stopped 1 process(es)" in out
    assert proc.wait(timeout=30) is not None
    assert not (cache / "runs" / run_id).exists()
    assert _stack(_ps_json(capsys), run_id) is None
    assert "Nothing was left over." in _ps(capsys, "--clean")


def test_a_stack_of_a_live_owner_is_listed_as_running_and_clean_leaves_it_alone(
    processes: list[subprocess.Popen], cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"mcqa-{os.getpid()}-0badc0de"
    processes.append(proc := _sleeper(cache / "runs" / run_id))
    _wait_started(proc)

    stack = _stack(_ps_json(capsys), run_id)
    assert stack is not None and not stack["left_over"]
    assert f"running for pid {os.getpid()} (" in _ps(capsys)
    _ps(capsys, "--clean")
    assert process_alive(proc.pid)


def test_the_run_folder_of_a_gone_owner_with_no_process_left_is_left_over_too(
    cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"mcqa-{GONE_PID}-feedf00d"
    (cache / "runs" / run_id).mkdir(parents=True)
    stack = _stack(_ps_json(capsys), run_id)
    assert stack is not None and stack["left_over"] and stack["processes"]["pids"] == []
    assert "no process left" in _ps(capsys)
    _ps(capsys, "--clean")
    assert not (cache / "runs" / run_id).exists()


def test_a_helper_no_process_holds_is_left_over_and_clean_stops_its_session(
    processes: list[subprocess.Popen], cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A warm parent's folder whose supervisor (a session leader) still runs, with no lease held: what a helper's
    supervisor stops by itself; --clean stops it at once. Its token-like fields never reach the output."""
    processes.append(proc := _sleeper(new_session=True))
    _wait_started(proc)
    folder = own_ray_dir / "warm-0123456789abcdef"
    (folder / "leases").mkdir(parents=True)
    state = {"pid": proc.pid, "started": start_time(proc.pid), "socket": str(folder / "s"), "log": "x"}
    write_state(folder / "state.json", state | {"token": "s3cr3t-token"})

    inventory = _ps_json(capsys)
    (helper,) = inventory["helpers"]
    assert helper["kind"] == "warm parent" and helper["left_over"] and helper["holders"] == []
    assert helper["supervisor"] == proc.pid and helper["processes"]["pids"] == [proc.pid]
    text = _ps(capsys)
    assert "held by no process: LEFT OVER" in text
    assert "s3cr3t-token" not in text + json.dumps(inventory)

    assert "warm parent" in _ps(capsys, "--clean")
    assert proc.wait(timeout=30) is not None
    assert not (folder / "state.json").exists()


def test_a_helper_a_live_process_holds_is_not_left_over(
    processes: list[subprocess.Popen], cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    processes.append(proc := _sleeper(new_session=True))
    _wait_started(proc)
    folder = own_ray_dir / "warm-fedcba9876543210"
    (folder / "leases").mkdir(parents=True)
    write_state(folder / "state.json", {"pid": proc.pid, "started": start_time(proc.pid), "socket": "", "log": ""})
    lease = take_lease(folder / "leases")
    try:
        (helper,) = _ps_json(capsys)["helpers"]
        assert helper["holders"] == [os.getpid()] and not helper["left_over"]
        assert f"held by {os.getpid()}" in _ps(capsys)
        _ps(capsys, "--clean")
        assert process_alive(proc.pid)
    finally:
        os.close(lease[1])


@pytest.mark.skipif(
    os.getuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv to run as nobody (CI has both)"
)
def test_another_user_s_process_is_never_listed_or_stopped_whatever_its_environment_says(
    processes: list[subprocess.Popen], cache: Path, own_ray_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run_id = f"mcqa-{GONE_PID}-0ddba11a"
    processes.append(theirs := _sleeper(cache / "runs" / run_id, as_nobody=True))
    processes.append(mine := _sleeper(cache / "runs" / run_id))
    _wait_started(theirs)
    _wait_started(mine)

    stack = _stack(_ps_json(capsys), run_id)
    assert stack is not None and stack["processes"]["pids"] == [mine.pid]
    _ps(capsys, "--clean")
    assert mine.wait(timeout=30) is not None
    assert process_alive(theirs.pid) and theirs.poll() is None


def test_ps_takes_clean_or_json_not_both() -> None:
    with pytest.raises(SystemExit) as exc:
        main(["ps", "--clean", "--json"])
    assert exc.value.code == 2
