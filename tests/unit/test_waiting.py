"""A start's limit and its waits (``_stack/waiting.py``): one limit the user sets; within it, a part that is alive is
waited for while its processes use CPU or write to their log, and one that makes neither progress is given up."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from verifiers_nemo import ConfigurationError, StackStartError
from verifiers_nemo._stack.waiting import (
    DEFAULT_START_TIMEOUT_S,
    START_TIMEOUT_ENV_VAR,
    Deadline,
    Waiting,
    deadline,
    start_timeout,
)


def test_the_limit_is_the_argument_else_the_variable_else_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(START_TIMEOUT_ENV_VAR, raising=False)
    assert start_timeout() == DEFAULT_START_TIMEOUT_S
    monkeypatch.setenv(START_TIMEOUT_ENV_VAR, "900")
    assert start_timeout() == 900.0 and start_timeout(5) == 5.0
    assert deadline().limit == 900.0
    for bad in ("soon", "0", "-3"):
        monkeypatch.setenv(START_TIMEOUT_ENV_VAR, bad)
        with pytest.raises(ConfigurationError, match=f"{START_TIMEOUT_ENV_VAR}='{bad}' must be a positive number"):
            start_timeout()


def _in_own_session(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], start_new_session=True)


def _wait(waiting: Waiting, seconds: float) -> None:
    """``check()`` as a start's poll does, for ``seconds``."""
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        waiting.check()
        time.sleep(0.05)


def test_a_part_that_uses_cpu_is_waited_for_and_one_that_does_nothing_is_given_up(tmp_path: Path) -> None:
    busy = _in_own_session("while True: pass")
    idle = _in_own_session("import time; time.sleep(600)")
    far = Deadline(time.monotonic() + 600, 600)
    try:
        _wait(Waiting("the busy part", far, sid=busy.pid, stall_s=1.0), 2.5)  # no error: it progresses
        log = tmp_path / "idle.log"
        log.write_text("starting\n")
        with pytest.raises(StackStartError) as caught:
            _wait(Waiting("the idle part", far, sid=idle.pid, log=log, stall_s=1.0), 60.0)
        message = str(caught.value)
        assert message.startswith("The idle part made no progress for 1s (its processes used no CPU and wrote")
        assert "starting" in message and f"(full log: {log})" in message
    finally:
        busy.kill()
        idle.kill()
        busy.wait()
        idle.wait()


def test_the_start_s_limit_bounds_every_wait() -> None:
    busy = _in_own_session("while True: pass")
    try:
        with pytest.raises(StackStartError, match=r"^The busy part was not ready within the start's limit of 1s \("):
            _wait(Waiting("the busy part", Deadline(time.monotonic() + 1, 1), sid=busy.pid), 60.0)
    finally:
        busy.kill()
        busy.wait()
