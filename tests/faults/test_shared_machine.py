"""Another local user on the machine (issue 53): the places through which this package's processes share the Ray
head and the warm parents (a folder, state files, sockets) prepared first by someone else are refused or avoided;
nothing is written into them, nothing is sent to them, and the eval still runs.

The other user is ``nobody`` (``setpriv``; the suite runs as root, as CI does) running the system's Python: it
cannot run the Gym runtime (here it lives under root's home), so its side is played with small scripts that bind
what our processes would look for and report whatever reaches them."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo._gym.runtime import find_gym_runtime
from verifiers_nemo._stack.config import StackConfig
from verifiers_nemo._stack.launchers import launcher_venv
from verifiers_nemo._stack.leases import start_time, write_state
from verifiers_nemo._stack.plan import child_env
from verifiers_nemo._stack.ray_head import (
    acquire_ray_head,
    head_key,
    helper_folder,
    join_env_without_token,
    release_ray_head,
)
from verifiers_nemo._stack.warm_parent import acquire_warm_parent, key, probe, release_warm_parent

pytestmark = pytest.mark.e2e

NOBODY, NOGROUP = 65534, 65534
SYSTEM_PYTHON = "/usr/bin/python3"
AS_NOBODY = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]

if os.getuid() != 0 or shutil.which("setpriv") is None or not os.access(SYSTEM_PYTHON, os.X_OK):
    pytest.skip("needs root, setpriv and the system's python3 (as CI has)", allow_module_level=True)

LISTENER = textwrap.dedent(
    """
    # Listens where it is told (an abstract Unix name, a TCP port on 127.0.0.1, or a socket fd handed over) and
    # prints, for each connection, what reached it: bytes and file descriptors.
    import array, json, socket, sys
    kind, where = sys.argv[1], sys.argv[2]
    if kind == "tcp":
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
    elif kind == "unix":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(where.replace("@", "\\0", 1))
    else:
        sock = socket.socket(fileno=int(where))
    sock.listen(16)
    print(json.dumps({"ready": sock.getsockname()[1] if kind == "tcp" else where}), flush=True)
    while True:
        conn, _ = sock.accept()
        conn.settimeout(20)
        got, fds = 0, 0
        try:
            while True:
                data, anc, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(253 * 4))
                fds += sum(len(raw) // 4 for _, _, raw in anc)
                got += len(data)
                if not data:
                    break
        except OSError:
            pass
        print(json.dumps({"bytes": got, "fds": fds}), flush=True)
        conn.close()
    """
)


class Listener:
    """A ``LISTENER`` run as nobody."""

    def __init__(self, kind: str, where: str = "", pass_fds: tuple[int, ...] = ()) -> None:
        self.proc = subprocess.Popen(
            [*AS_NOBODY, SYSTEM_PYTHON, "-c", LISTENER, kind, where],
            stdout=subprocess.PIPE,
            text=True,
            pass_fds=pass_fds,
            start_new_session=True,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line, "the other user's listener did not start"
        self.where = json.loads(line)["ready"]

    @property
    def pid(self) -> int:
        return self.proc.pid

    def connections(self) -> list[dict[str, int]]:
        """What reached it (it is stopped first)."""
        self.stop()
        out = self.proc.stdout.read()  # type: ignore[union-attr]
        return [json.loads(line) for line in out.splitlines() if line.strip()]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)


def _gym_env() -> tuple[Any, dict[str, str]]:
    runtime = find_gym_runtime(None)
    return runtime, child_env(os.environ, runtime.bin_dir, StackConfig("suite", (), "")) | join_env_without_token()


@pytest.fixture
def nobody_tmp() -> Iterator[Path]:
    """A folder as ``/tmp`` is (1777), where nobody may make things."""
    folder = Path(tempfile.mkdtemp(prefix="vnr-sm-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# -- the warm supervisor's socket name, bound first by another user ---------------------------------------------


def test_a_launcher_sends_nothing_to_another_user_on_its_socket_name_and_starts_the_server_plain(
    tmp_path: Path,
) -> None:
    """Abstract socket names have no permissions: nobody binds the name the launcher of a session looks for. The
    launcher connects, sees (``SO_PEERCRED``) that the listener is not its session's leader, sends nothing, and runs
    the server as the plain interpreter."""
    runtime, _ = _gym_env()
    app, out = tmp_path / "app.py", tmp_path / "out.json"
    app.write_text("import json, os, sys\njson.dump({'argv': sys.argv, 'pid': os.getpid()}, open(sys.argv[1], 'w'))\n")
    launcher = launcher_venv(runtime) / "bin" / "python"
    server = subprocess.Popen(  # its own session: its pid names the socket it looks for; it waits for a line first
        ["sh", "-c", 'read _ && exec "$@"', "sh", str(launcher), str(app), str(out)],
        stdin=subprocess.PIPE,
        start_new_session=True,
        cwd=tmp_path,
    )
    squatter = Listener("unix", f"@verifiers-nemo-warm-{os.getuid()}-{server.pid}")
    try:
        server.communicate(b"go\n", timeout=120)
    finally:
        connections = squatter.connections()
    assert server.returncode == 0
    assert json.loads(out.read_text())["argv"] == [str(app), str(out)]  # the script ran, as the plain interpreter
    assert connections == [{"bytes": 0, "fds": 0}]  # it connected (so it looked), and sent nothing


# -- state files that name another user's processes ---------------------------------------------------------------


def test_a_head_state_naming_another_user_s_process_port_and_folder_is_not_joined_killed_or_removed(
    own_ray_dir: Path,
) -> None:
    """``head.json`` (in our own folder: how it came there does not matter) names nobody's process as the head's
    supervisor, nobody's port as its GCS and nobody's folder as its Ray files: the head is not joined (no driver
    connects there with our token), nothing of nobody's is killed or removed, and a head of our own starts."""
    runtime, env = _gym_env()
    squatter = Listener("tcp")
    theirs = Path(tempfile.mkdtemp(prefix="vnr-ray-"))
    (theirs / "keep").write_text("nobody's")
    os.chown(theirs, NOBODY, NOGROUP)
    folder = helper_folder(own_ray_dir, head_key(runtime))
    planted = {"gcs_port": squatter.where, "token": "t", "pid": squatter.pid, "started": start_time(squatter.pid),
               "temp_dir": str(theirs), "log": str(theirs / "keep")}  # fmt: skip
    write_state(folder / "head.json", planted)
    head = None
    try:
        head = acquire_ray_head(runtime, env, own_ray_dir)
        assert head.pid != squatter.pid and head.gcs_port != squatter.where
        assert json.loads((folder / "head.json").read_text())["pid"] == head.pid
        assert start_time(squatter.pid) == planted["started"], "nobody's process was killed"
        assert (theirs / "keep").read_text() == "nobody's"
    finally:
        if head is not None:
            release_ray_head(head)
        connections = squatter.connections()
        shutil.rmtree(theirs, ignore_errors=True)
    assert connections == []


def test_a_warm_parent_socket_listened_on_by_another_user_gets_nothing(own_ray_dir: Path, tmp_path: Path) -> None:
    """The state file names a socket in the warm parent's folder on which nobody listens (bound there, then handed
    over: nobody cannot enter our folder): the holder connects, sees the listener is not its warm parent
    (``SO_PEERCRED``), sends nothing, and starts a warm parent of its own."""
    runtime, env = _gym_env()
    _, listed = probe(runtime, env)
    folder = helper_folder(own_ray_dir, f"warm-{key(runtime, env, listed.get('env_read', []))}")
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(folder / "socket-planted"))
    squatter = Listener("fd", str(bound.fileno()), pass_fds=(bound.fileno(),))
    bound.close()
    ours = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a process of ours as its "supervisor"
    planted = {"pid": ours.pid, "started": start_time(ours.pid), "socket": str(folder / "socket-planted"),
               "log": str(tmp_path / "log")}  # fmt: skip
    write_state(folder / "state.json", planted)
    parent = None
    try:
        parent = acquire_warm_parent(runtime, env, own_ray_dir)
        assert parent.pid != ours.pid
        assert parent.state["socket"] != planted["socket"]
    finally:
        if parent is not None:
            release_warm_parent(parent)
        ours.kill()
        ours.wait()
        connections = squatter.connections()
    assert connections == [{"bytes": 0, "fds": 0}]


# -- the default folder, made first by another user; each user's own folder ------------------------------------


def _private_root_as(argv_prefix: list[str], tmp: Path, python: str) -> str:
    """``private_root()`` as seen by a process of another user (the module is standard library only)."""
    module = tmp / "private_dir.py"
    code = (
        "import importlib.util, sys, tempfile\n"
        f"spec = importlib.util.spec_from_file_location('pd', {str(module)!r})\n"
        "pd = importlib.util.module_from_spec(spec); spec.loader.exec_module(pd)\n"
        "print(pd.private_root())\n"
    )
    env = {"TMPDIR": str(tmp), "PATH": "/usr/bin:/bin"}
    return subprocess.run([*argv_prefix, python, "-c", code], env=env, capture_output=True, text=True,
                          check=True, timeout=60).stdout.strip()  # fmt: skip


async def test_an_eval_runs_beside_a_default_folder_another_user_made_and_writes_nothing_into_it(
    nobody_tmp: Path, tmp_path: Path
) -> None:
    """nobody makes our default folder first (0777, with a ``head.json`` of its own in a head key's folder), and its
    own. An eval then runs (in a fresh process whose temporary folder is that one): it says once that it keeps its
    Ray head and warm parent in a private folder, reproduces its recording, and leaves nobody's folder as it was."""
    from tests.faults.test_first_use import _cli, _nothing_left
    from verifiers_nemo._stack import private_dir

    shutil.copy(private_dir.__file__, nobody_tmp / "private_dir.py")
    (nobody_tmp / "private_dir.py").chmod(0o644)
    squatted = nobody_tmp / f"vnr-ray-{os.getuid()}"
    made = (
        f"import os, json; os.mkdir({str(squatted)!r}); os.chmod({str(squatted)!r}, 0o777);"
        f" os.mkdir({str(squatted / 'ray-planted')!r}, 0o777);"
        f" json.dump({{'pid': 1}}, open({str(squatted / 'ray-planted' / 'head.json')!r}, 'w'))"
    )
    subprocess.run([*AS_NOBODY, SYSTEM_PYTHON, "-c", made], check=True, timeout=60)
    nobody_own = _private_root_as(AS_NOBODY, nobody_tmp, SYSTEM_PYTHON)
    assert nobody_own == str(nobody_tmp / f"vnr-ray-{NOBODY}")
    assert (os.stat(nobody_own).st_uid, stat.S_IMODE(os.stat(nobody_own).st_mode)) == (NOBODY, 0o700)

    def tree() -> list[tuple[str, int, int]]:
        return sorted((str(p), p.lstat().st_uid, p.lstat().st_mtime_ns) for p in squatted.rglob("*"))

    before = tree()
    run = await _cli(
        tmp_path, "squatted", "example_multi_step", "-n", "1",
        extra_env={"TMPDIR": str(nobody_tmp), "VERIFIERS_NEMO_RAY_DIR": ""},
        timeout=600,
    )  # fmt: skip
    assert run.code == 0, run.err
    assert "1/1 rewards equal the recorded ones" in run.out
    said = [line for line in run.err.splitlines() if "is not safe to use" in line]
    assert len(said) == 1 and f"{squatted} is not safe to use: it belongs to uid {NOBODY}" in said[0], run.err
    assert "keeps its Ray head and warm parent in " + str(nobody_tmp / f"vnr-private-{os.getuid()}-") in said[0]
    assert tree() == before
    await asyncio.wait_for(_nothing_left(run), 300)
