"""Port reservations across processes: a lock file per held port, and none left once it is released
or its holder is gone (a machine that ran many evals used to keep hundreds)."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from verifiers_nemo._procs import reserve_ports, sweep_port_locks


def test_released_ports_leave_no_lock_file(tmp_path: Path) -> None:
    reservation = reserve_ports(3, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{port}.lock" for port in reservation.ports)

    reservation.release()

    assert list(tmp_path.iterdir()) == []


def test_lock_files_of_dead_holders_are_swept_and_held_ones_kept(tmp_path: Path) -> None:
    held = reserve_ports(1, tmp_path)
    stale = [tmp_path / f"{port}.lock" for port in (20001, 20002, 20003) if port != held.ports[0]]
    for path in stale:  # what a killed process leaves: files nobody holds
        path.touch()

    assert sweep_port_locks(tmp_path) == len(stale)
    assert [p.name for p in tmp_path.iterdir()] == [f"{held.ports[0]}.lock"]
    for path in stale:
        path.touch()
    reserve_ports(1, tmp_path).release()  # every reservation sweeps first
    assert [p.name for p in tmp_path.iterdir()] == [f"{held.ports[0]}.lock"]
    held.release()


def test_a_port_held_by_another_process_is_never_handed_out(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parents[2])!r})
            from pathlib import Path
            from verifiers_nemo._procs import reserve_ports
            reservation = reserve_ports(50, Path({str(tmp_path)!r}))
            print(" ".join(map(str, reservation.ports)), flush=True)
            sys.stdin.readline()
            reservation.release()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        theirs = {int(p) for p in holder.stdout.readline().split()}  # type: ignore[union-attr]
        mine = reserve_ports(200, tmp_path)
        assert len(theirs) == 50 and not theirs & set(mine.ports)
        for port in theirs:  # their files are theirs: still there, still locked
            fd = os.open(tmp_path / f"{port}.lock", os.O_RDWR)
            try:
                assert_locked(fd)
            finally:
                os.close(fd)
        mine.release()
    finally:
        holder.communicate("go\n", timeout=30)
    assert list(tmp_path.iterdir()) == []


def assert_locked(fd: int) -> None:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return
    raise AssertionError("the lock file is not held")
