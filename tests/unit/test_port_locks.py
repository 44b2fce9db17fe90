"""Port reservations across processes: held by abstract Unix sockets, so nothing is ever written to disk
and a holder's ports are free again the moment it exits, however it exits (a machine that ran many evals
used to keep a lock file for every port ever tried: hundreds)."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from verifiers_nemo._stack.procs import remove_legacy_port_locks, reserve_ports

REPO = Path(__file__).parents[2]


def _holder(scope: Path, count: int) -> tuple[subprocess.Popen[str], set[int]]:
    """Another process holding ``count`` ports of ``scope`` until told to go (or killed)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(REPO)!r})
            from verifiers_nemo._stack.procs import reserve_ports
            reservation = reserve_ports({count}, {str(scope)!r})
            print(" ".join(map(str, reservation.ports)), flush=True)
            sys.stdin.readline()
            reservation.release()
        """)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc, {int(p) for p in proc.stdout.readline().split()}  # type: ignore[union-attr]


def test_a_port_held_by_another_process_is_never_handed_out_and_nothing_is_written(tmp_path: Path) -> None:
    scope = tmp_path / "scope"
    holder, theirs = _holder(scope, 50)
    try:
        mine = reserve_ports(500, scope)
        assert len(theirs) == 50 and len(set(mine.ports)) == 500 and not theirs & set(mine.ports)
        mine.release()
    finally:
        holder.communicate("go\n", timeout=30)
    assert list(tmp_path.iterdir()) == []  # no lock file, no folder


def test_ports_of_a_killed_holder_are_free_at_once(tmp_path: Path) -> None:
    scope = tmp_path / "scope"
    holder, theirs = _holder(scope, 3000)  # most of the range
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)

    again = reserve_ports(3000, scope)  # impossible while it held them

    assert len(set(again.ports) & theirs) > 0
    again.release()


def test_released_ports_are_free_for_the_next_reservation(tmp_path: Path) -> None:
    first = reserve_ports(3000, tmp_path)
    first.release()
    second = reserve_ports(3000, tmp_path)
    assert set(first.ports) & set(second.ports)
    second.release()


def test_lock_files_of_earlier_versions_are_removed_unless_held(tmp_path: Path) -> None:
    for port in (20001, 20002, 20003):  # what earlier versions left: a file per port ever tried
        (tmp_path / f"{port}.lock").touch()
    held = os.open(tmp_path / "20004.lock", os.O_CREAT | os.O_RDWR)  # an earlier version running now
    fcntl.flock(held, fcntl.LOCK_EX)
    try:
        remove_legacy_port_locks(tmp_path)
        assert [p.name for p in tmp_path.iterdir()] == ["20004.lock"]
    finally:
        os.close(held)
    remove_legacy_port_locks(tmp_path)
    assert not tmp_path.exists()
