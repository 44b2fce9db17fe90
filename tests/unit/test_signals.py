"""capture_signals(): handlers only record, the previous handlers come back, the signal is raised again after."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType

import pytest

from verifiers_nemo._signals import capture_signals


@pytest.fixture
def previous() -> Iterator[list[int]]:
    """A handler of the caller's own on SIGTERM (restored after the test), recording what reaches it."""
    seen: list[int] = []

    def record(signum: int, frame: FrameType | None) -> None:
        seen.append(signum)

    before = signal.signal(signal.SIGTERM, record)
    yield seen
    signal.signal(signal.SIGTERM, before)


def test_signal_is_only_recorded_in_the_block_and_raised_again_after(previous: list[int]) -> None:
    calls: list[tuple[signal.Signals, int]] = []
    with capture_signals(lambda sig, count: calls.append((sig, count))) as captured:
        signal.raise_signal(signal.SIGTERM)
        assert captured.signals == [signal.SIGTERM] and calls == [(signal.SIGTERM, 1)]
        assert previous == []  # not yet: the block still runs (its clean-up, say)
    assert previous == [signal.SIGTERM]


def test_previous_handlers_are_restored_not_the_defaults(previous: list[int]) -> None:
    handler = signal.getsignal(signal.SIGTERM)
    int_handler = signal.getsignal(signal.SIGINT)
    with capture_signals():
        assert signal.getsignal(signal.SIGTERM) is not handler
    assert signal.getsignal(signal.SIGTERM) is handler
    assert signal.getsignal(signal.SIGINT) is int_handler
    assert previous == []  # nothing captured, nothing raised


def test_a_repeated_signal_goes_to_the_previous_handler_at_once(previous: list[int]) -> None:
    with capture_signals(reraise=False) as captured:
        signal.raise_signal(signal.SIGTERM)
        signal.raise_signal(signal.SIGTERM)
        assert previous == [signal.SIGTERM]  # during the block: the user asked twice
        assert captured.signals == [signal.SIGTERM]


@pytest.fixture
def python_sigint() -> Iterator[None]:
    """Python's own SIGINT handler (KeyboardInterrupt) for the test, whatever an earlier test left there."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)  # None: set outside Python


@pytest.mark.usefixtures("python_sigint")
def test_sigint_becomes_keyboard_interrupt_after_the_block() -> None:
    finished = False
    with pytest.raises(KeyboardInterrupt), capture_signals() as captured:
        signal.raise_signal(signal.SIGINT)
        finished = bool(captured)
    assert finished


_FORCED_EXIT = """
import sys, threading, time
from pathlib import Path
from verifiers_nemo._signals import before_forced_exit, end_now
import signal
done = Path(sys.argv[1])
entered = threading.Event()

def section():
    with before_forced_exit():
        entered.set()
        time.sleep(float(sys.argv[2]))
        done.write_text("finished")

threading.Thread(target=section, daemon=True).start()
entered.wait()
end_now(signal.SIGTERM)  # what a second Ctrl-C does
"""


@pytest.mark.parametrize("section_s", [0.5, 30.0])
def test_a_forced_exit_lets_a_before_forced_exit_section_finish_but_waits_no_longer_than_its_bound(
    tmp_path, section_s: float
) -> None:
    """Another thread's section (a stack's run folder before its supervisor exists) finishes before the process
    ends by the signal; one that outlasts ``FORCED_EXIT_WAIT_S`` does not hold the exit."""
    import subprocess
    import sys
    import time

    from verifiers_nemo._signals import FORCED_EXIT_WAIT_S

    done = tmp_path / "done"
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _FORCED_EXIT, str(done), str(section_s)], timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == -signal.SIGTERM
    if section_s < FORCED_EXIT_WAIT_S:
        assert done.read_text() == "finished"
    else:
        assert not done.exists() and took < section_s
