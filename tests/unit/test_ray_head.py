"""The shared Ray head's key and leases, without Ray: the real supervisor in lease mode over a stand-in launcher."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from verifiers_nemo._gym import GymRuntime
from verifiers_nemo._stack.procs import session_pids
from verifiers_nemo._stack.ray_head import RAY_DIR_ENV_VAR, _take_lease, head_key, ray_dir
from verifiers_nemo._stack.supervisor import start_detached


def _runtime(tmp_path: Path, name: str, ray_version: str, python: str = sys.executable) -> GymRuntime:
    root = tmp_path / name
    (root / f"ray-{ray_version}.dist-info").mkdir(parents=True)
    return GymRuntime(python=Path(python), prefix=root, root=root, nemo_gym_version="0.4.0", site_dirs=(root,))


def test_runtimes_share_a_head_only_with_the_same_ray_and_python(tmp_path: Path) -> None:
    a = _runtime(tmp_path, "a", "2.60.0")
    b = _runtime(tmp_path, "b", "2.60.0")  # another venv of the same interpreter and Ray: the same head
    c = _runtime(tmp_path, "c", "2.58.0")  # another Ray release: Ray refuses its drivers on a 2.60 head
    other_python = tmp_path / "python3.99"
    other_python.symlink_to("/bin/true")
    d = _runtime(tmp_path, "d", "2.60.0", str(other_python))
    assert head_key(a) == head_key(b)
    assert len({head_key(a), head_key(c), head_key(d)}) == 3
    assert "2.58.0" in head_key(c)


@pytest.mark.skipif(
    subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode != 0,
    reason="unshare -n needs root (CI runs as root)",
)
def test_processes_in_another_network_namespace_do_not_share_a_head(tmp_path: Path) -> None:
    """A head binds 127.0.0.1, another address in another namespace: joining it from there would hang, and
    judging it dead from there would stop it under its own processes."""
    _runtime(tmp_path, "a", "2.60.0")
    code = textwrap.dedent(f"""
        from pathlib import Path
        import sys
        from verifiers_nemo._gym import GymRuntime
        from verifiers_nemo._stack.ray_head import head_key
        root = Path({str(tmp_path / "a")!r})
        print(head_key(GymRuntime(python=Path(sys.executable), prefix=root, root=root, nemo_gym_version="0.4.0",
                                  site_dirs=(root,))))
    """)
    here = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    again = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    cut_off = subprocess.run(["unshare", "-n", sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert here == again
    assert cut_off.stdout.strip() and cut_off.stdout != here


def test_the_heads_folder_is_per_user_unless_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(RAY_DIR_ENV_VAR, raising=False)
    assert ray_dir().name == f"vnr-ray-{os.getuid()}"
    monkeypatch.setenv(RAY_DIR_ENV_VAR, str(tmp_path))
    assert ray_dir() == tmp_path


_HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from verifiers_nemo._stack.ray_head import _take_lease
    _take_lease(Path(sys.argv[1]))
    print("held", flush=True)
    time.sleep(600)
    """
)


def _launch(folder: Path, state: dict) -> int:
    """A stand-in launcher (``sleep``) under the real supervisor, with leases in ``folder``."""
    spec = {
        "argv": ["sleep", "600"],
        "cwd": str(folder),
        "log": str(folder / "launcher.log"),
        "grace_s": 1.0,
        "ports": [],
        "remove": [],
        "logs": [],
        "leases": {
            "dir": str(folder / "leases"),
            "lock": str(folder / "lock"),
            "state": str(folder / "head.json"),
            "linger_s": 0.0,
            "poll_s": 0.1,
        },
    }
    pid = start_detached(Path(sys.executable), spec, cwd=folder, env=dict(os.environ))
    (folder / "head.json").write_text(json.dumps({**state, "pid": pid}))
    return pid


def _gone(pid: int, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while session_pids(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not session_pids(pid)


def test_the_launch_lives_while_a_lease_is_held_and_stops_when_the_last_one_goes(tmp_path: Path) -> None:
    path, fd = _take_lease(tmp_path / "leases")
    pid = _launch(tmp_path, {"gcs_port": 1})
    try:
        assert os.getppid() != pid and pid not in {os.getpid()}  # detached: not our child
        time.sleep(0.5)
        assert session_pids(pid), "the launch stopped while its lease was held"
        second = _take_lease(tmp_path / "leases")
        os.close(fd)  # the first holder leaves without removing its file (as a SIGKILL would)
        time.sleep(0.5)
        assert session_pids(pid) and not path.exists()  # its dead lease was reaped; the second holds on
        second[0].unlink()
        os.close(second[1])
        assert _gone(pid), "the launch outlived its last lease"
        assert not (tmp_path / "head.json").exists()  # no process may join it any more
    finally:
        if session_pids(pid):
            os.killpg(pid, 9)


def test_a_holder_killed_by_sigkill_releases_its_lease(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLD, str(tmp_path / "leases")], stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    pid = _launch(tmp_path, {"gcs_port": 1})
    try:
        time.sleep(0.5)
        assert session_pids(pid)
        holder.kill()
        holder.wait()
        assert _gone(pid), "a SIGKILLed holder's lease kept the launch alive"
        assert list((tmp_path / "leases").iterdir()) == []
    finally:
        holder.kill()
        if session_pids(pid):
            os.killpg(pid, 9)
