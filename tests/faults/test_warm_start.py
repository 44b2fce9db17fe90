"""The warm start, process by process: a server forked by its stack's warm supervisor is what a fresh interpreter
would be, exits and takes signals as one, dies with its launcher, and many start at once on a loaded machine.

No Gym stack here: a driver script stands for ``ng_run`` (the stack's supervisor forks it warm, as it forks
ng_run) and starts small apps the way nemo-gym starts servers (``cd DIR && source VENV/bin/activate && ...
python app.py``), once through the runtime itself (the plain start) and once through the launcher venv a warm
stack links. The same driver under the plain supervisor (no warm supervisor in its session) shows the launcher's
fallback. Both Gym releases (0.7: the test-only 3.13.0 runtime, told the 3.13.14 floor; see .ci/setup-gym07).
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from verifiers_nemo._gym.derived_env import ensure_derived_env
from verifiers_nemo._gym.runtime import find_gym_runtime
from verifiers_nemo._stack.config import StackConfig
from verifiers_nemo._stack.launchers import launcher_venv
from verifiers_nemo._stack.plan import child_env
from verifiers_nemo._stack.ray_head import join_env_without_token
from verifiers_nemo._stack.supervisor import WarmSupervisor, start_supervised, stop_supervised
from verifiers_nemo._stack.warm_parent import (
    WarmParent,
    WarmStartUnavailable,
    acquire_warm_parent,
    probe,
    release_warm_parent,
)

pytestmark = pytest.mark.e2e

GYM07 = Path(__file__).parents[2] / ".venv-gym07" / "bin" / "python"
RELEASES = ["0.4", pytest.param("0.7", marks=pytest.mark.skipif(not GYM07.exists(), reason="no .venv-gym07"))]
CROWD, BUSY_LOOPS = 24, 8
EXTRA = "tiktoken"
"""A package nemo-gym does not bring (small, with wheels and a native extension): a derived environment's."""

APP = textwrap.dedent(
    """
    import importlib, importlib.util, json, os, resource, signal, sys, time
    mode, out = sys.argv[1], sys.argv[2]
    EXTRA = "tiktoken"
    def view():
        import ray  # what a Gym server imports: the state after the same imports is compared
        fds = {}
        for fd in sorted(int(n) for n in os.listdir("/proc/self/fd")):
            try:
                target = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:
                continue
            fds[fd] = target.split(":")[0] if ":" in target else target
        del fds[max(fds)]  # the listing's own
        main = sys.modules["__main__"]
        with open("/proc/self/environ", "rb") as f:  # what other processes see: the environment it started with
            started_with = dict(e.decode().split("=", 1) for e in f.read().split(b"\\0") if b"=" in e)
        with open("/proc/self/cmdline", "rb") as f:
            command = f.read().rstrip(b"\\0").split(b"\\0")[1:-1]
        with open("/proc/self/comm") as f:
            comm = f.read().strip()
        return {
            "proc_environ": {k: v for k, v in started_with.items() if k != "RAY_AUTH_TOKEN"},
            "proc_cmdline_tail": [c.decode() for c in command], "comm": comm,
            # the result file's name is each run's own
            "argv": [*sys.argv[:-1], "OUT"], "orig_argv_tail": [*sys.orig_argv[1:-1], "OUT"],
            "executable": sys.executable, "path": sys.path,
            "env": {k: v for k, v in os.environ.items() if k != "RAY_AUTH_TOKEN"}, "cwd": os.getcwd(),
            "fds": fds, "umask": os.umask(0o22), "prefix": [sys.prefix, sys.base_prefix],
            "signals": {int(s): repr(signal.getsignal(s)) for s in signal.valid_signals()
                        if s not in (signal.SIGKILL, signal.SIGSTOP) and signal.getsignal(s) is not None},
            "blocked": sorted(map(int, signal.pthread_sigmask(signal.SIG_BLOCK, []))),
            "rlimits": {n: resource.getrlimit(getattr(resource, n)) for n in dir(resource) if n.startswith("RLIMIT_")},
            "main": {"name": __name__, "file": __file__, "keys": sorted(k for k in vars(main) if k.startswith("__")),
                     "loader": type(__loader__).__name__, "spec": __spec__},
            "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
            "flags": list(sys.flags), "ray_client_mode": os.environ.get("RAY_CLIENT_MODE"),
            "mp_dir": __import__("multiprocessing.process").process.ORIGINAL_DIR,
            "site_prefixes": __import__("site").PREFIXES,
            "paths": __import__("sysconfig").get_paths(),
            # the derived environment's own package, with its native extension (absent from the runtime)
            "extra": getattr(importlib.util.find_spec(EXTRA) and importlib.import_module(EXTRA), "__file__", None),
        }
    def report(**what):
        with open(out, "w") as f:
            json.dump({"forked": os.getppid() == os.getsid(0), "pid": os.getpid(), **what}, f)
    if mode == "view":
        report(view=view())
    elif mode == "exit3":
        report(); sys.exit(3)
    elif mode == "raise":
        report(); raise ValueError("boom")
    elif mode == "kill-self":
        report(); os.kill(os.getpid(), signal.SIGTERM); time.sleep(30)
    elif mode == "wait-usr1":
        signal.signal(signal.SIGUSR1, lambda *_: sys.exit(42))
        report(); time.sleep(60)
    elif mode in ("wait", "crowd"):
        if mode == "crowd":
            sum(i * i for i in range(200_000))
        report()
        if mode == "wait":
            time.sleep(60)
    """
)

DRIVER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, textwrap, time
    app_dir, plain_venv, warm_venv, derived_venv, derived_warm_venv, out = sys.argv[1:7]
    def start(venv, mode, name):
        result = os.path.join(app_dir, f"{name}.json")
        command = f"cd {app_dir} && source {venv}/bin/activate && X=1 exec python app.py {mode} {result}"
        proc = subprocess.Popen(["bash", "-c", command], stderr=subprocess.PIPE, text=True)
        return proc, result
    def reported(result, timeout=60, proc=None):
        deadline = time.monotonic() + timeout
        while not os.path.exists(result) or not os.path.getsize(result):
            if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
                return None
            time.sleep(0.02)
        time.sleep(0.05)
        with open(result) as f:
            return json.load(f)
    def gone(pid, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().split(") ")[1][0] == "Z":
                        return True
            except OSError:
                return True
            time.sleep(0.05)
        return False
    results = {}
    for how, venv in (("plain", plain_venv), ("warm", warm_venv)):
        for mode in ("view", "exit3", "raise", "kill-self"):
            proc, result = start(venv, mode, f"{how}-{mode}")
            _, err = proc.communicate(timeout=120)
            results[f"{how}-{mode}"] = {"code": proc.returncode, "stderr": err, "report": reported(result, 1)}
        proc, result = start(venv, "wait-usr1", f"{how}-usr1")
        report = reported(result, proc=proc)
        proc.send_signal(signal.SIGUSR1)
        results[f"{how}-usr1"] = {"code": proc.wait(timeout=60), "report": report}
        proc, result = start(venv, "wait", f"{how}-term")
        report = reported(result, proc=proc)
        proc.send_signal(signal.SIGTERM)
        results[f"{how}-term"] = {"code": proc.wait(timeout=60), "report": report}
        proc, result = start(venv, "wait", f"{how}-killed")
        report = reported(result, proc=proc)
        proc.kill()
        proc.wait(timeout=60)
        results[f"{how}-killed"] = {"report": report, "app_gone": bool(report) and gone(report["pid"])}
    # A server in an environment derived from the runtime (its extra packages), plain and through its launcher venv.
    for how, venv in (("derived-plain", derived_venv), ("derived-warm", derived_warm_venv)):
        for mode in ("view", "exit3"):
            proc, result = start(venv, mode, f"{how}-{mode}")
            _, err = proc.communicate(timeout=120)
            results[f"{how}-{mode}"] = {"code": proc.returncode, "stderr": err, "report": reported(result, 1)}
    # A process of another session (a user's, another stack's) asks this stack's warm supervisor: no answer.
    knock = textwrap.dedent('''
        import socket, sys
        s = socket.socket(socket.AF_UNIX)
        s.connect(chr(0) + sys.argv[1])
        try:
            s.sendall(bytes([0, 0, 0, 2]) + b"{}")
            print("answered" if s.recv(100) else "dropped")
        except (BrokenPipeError, ConnectionResetError):
            print("dropped")
        ''')
    name = f"verifiers-nemo-warm-{os.getuid()}-{os.getsid(0)}"
    knocked = subprocess.run(["setsid", sys.executable, "-c", knock, name], capture_output=True, text=True, timeout=60)
    results["foreign"] = {"said": knocked.stdout.strip(), "code": knocked.returncode}
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(int(os.environ["BUSY"]))]
    started = time.monotonic()
    crowd = [start(warm_venv, "crowd", f"crowd-{i}") for i in range(int(os.environ["CROWD"]))]
    codes = [proc.wait(timeout=240) for proc, _ in crowd]
    results["crowd"] = {"codes": codes, "seconds": time.monotonic() - started,
                        "forked": [bool((reported(r, 5) or {}).get("forked")) for _, r in crowd]}
    for proc in busy:
        proc.kill()
        proc.wait()
    with open(out, "w") as f:
        json.dump(results, f)
    """
)


def _gym_env(python: str | None) -> tuple[Any, dict[str, str]]:
    """A Gym runtime and the environment its stacks' warm parent gets (as ``GymStack`` computes it)."""
    runtime = find_gym_runtime(python)
    env = child_env(os.environ, runtime.bin_dir, StackConfig("suite", (), "")) | join_env_without_token()
    return runtime, env


def _run_driver(tmp: Path, python: str | None, warm: bool) -> dict[str, Any]:
    """The driver under a stack supervisor, forked warm or started plain; its results."""
    runtime, env = _gym_env(python)
    apps = tmp / "apps"
    apps.mkdir()
    (apps / "app.py").write_text(APP)
    (tmp / "driver.py").write_text(f"#!{runtime.python}\n{DRIVER}")  # a script of the runtime, as ng_run is
    (tmp / "driver.py").chmod(0o755)
    out = tmp / "results.json"
    derived = ensure_derived_env(runtime, (EXTRA,), label="the warm start's fault tests").path
    venvs = [runtime.prefix, launcher_venv(runtime), derived, launcher_venv(runtime, derived)]
    argv = [str(tmp / "driver.py"), str(apps), *map(str, venvs), str(out)]
    spec = {"argv": argv, "cwd": str(tmp), "log": str(tmp / "driver.log"), "grace_s": 2.0, "ports": [],
            "remove": [], "logs": []}  # fmt: skip
    env = {**env, "BUSY": str(BUSY_LOOPS), "CROWD": str(CROWD if warm else 0)}
    if warm:
        parent = acquire_warm_parent(runtime, {k: v for k, v in env.items() if k not in ("BUSY", "CROWD")})
        try:
            supervisor: Any = parent.supervise(spec, env, tmp)
        finally:
            release_warm_parent(parent)
        assert isinstance(supervisor, WarmSupervisor)
    else:
        supervisor = start_supervised(runtime.python, spec, cwd=tmp, env=env)
    supervisor.wait(timeout=600)
    stop_supervised(supervisor, "driver", 5.0)
    log = (tmp / "driver.log").read_text()
    assert out.exists(), f"the driver did not finish:\n{log[-3000:]}"
    return {"results": json.loads(out.read_text()), "log": log}


@pytest.fixture(scope="module", params=RELEASES)
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    python = str(GYM07) if request.param == "0.7" else None
    yield {
        "python": python,
        "warm": _run_driver(tmp_path_factory.mktemp(f"warm-{request.param}"), python, warm=True),
        "plain-supervisor": _run_driver(tmp_path_factory.mktemp(f"plain-{request.param}"), python, warm=False),
    }


def test_the_driver_itself_ran_warm_and_its_launched_apps_were_forked(runs: dict[str, Any]) -> None:
    warm = runs["warm"]["results"]
    assert "Gym processes start warm" in runs["warm"]["log"]
    assert all(warm[f"warm-{m}"]["report"]["forked"] for m in ("view", "exit3", "raise", "kill-self"))
    assert not any(warm[f"plain-{m}"]["report"]["forked"] for m in ("view", "exit3", "raise", "kill-self"))


def test_a_forked_server_sees_what_a_fresh_interpreter_sees(runs: dict[str, Any]) -> None:
    results = runs["warm"]["results"]
    plain, warm = results["plain-view"]["report"]["view"], results["warm-view"]["report"]["view"]
    assert warm == plain


def test_a_server_with_extra_packages_is_forked_too_and_sees_what_its_own_interpreter_sees(
    runs: dict[str, Any],
) -> None:
    """A server whose requirements live in an environment derived from the runtime: its launcher venv runs the
    launcher on that environment's interpreter, and the fork takes on its prefix, ``sys.path`` and ``sysconfig``
    paths; its own packages (a native extension among them) import from it as in its plain interpreter."""
    results = runs["warm"]["results"]
    plain, warm = results["derived-plain-view"]["report"], results["derived-warm-view"]["report"]
    assert warm["forked"] and not plain["forked"]
    assert warm["view"] == plain["view"]
    derived = plain["view"]["prefix"][0]
    assert derived != runs["warm"]["results"]["plain-view"]["report"]["view"]["prefix"][0]
    assert plain["view"]["extra"].startswith(derived) and plain["view"]["paths"]["purelib"].startswith(derived)
    assert results["derived-warm-exit3"]["code"] == results["derived-plain-exit3"]["code"] == 3
    assert results["derived-warm-exit3"]["report"]["forked"]


def test_exit_codes_and_deaths_by_signal_are_those_of_the_plain_start(runs: dict[str, Any]) -> None:
    results = runs["warm"]["results"]
    for mode, code in (("exit3", 3), ("raise", 1), ("kill-self", -signal.SIGTERM)):
        assert results[f"plain-{mode}"]["code"] == code
        assert results[f"warm-{mode}"]["code"] == code, mode
    assert results["warm-raise"]["stderr"] == results["plain-raise"]["stderr"]  # the traceback: the script's frames
    assert "ValueError: boom" in results["warm-raise"]["stderr"]


def test_signals_sent_to_the_launcher_reach_the_server(runs: dict[str, Any]) -> None:
    results = runs["warm"]["results"]
    assert results["warm-usr1"]["report"]["forked"]
    assert results["warm-usr1"]["code"] == results["plain-usr1"]["code"] == 42  # its handler ran
    assert results["warm-term"]["code"] == results["plain-term"]["code"] == -signal.SIGTERM


def test_a_server_dies_with_its_launcher_killed_outright(runs: dict[str, Any]) -> None:
    results = runs["warm"]["results"]
    assert results["warm-killed"]["report"]["forked"]
    assert results["warm-killed"]["app_gone"]
    assert results["plain-killed"]["app_gone"]


def test_many_servers_start_at_once_on_a_loaded_machine_without_a_hang(runs: dict[str, Any]) -> None:
    crowd = runs["warm"]["results"]["crowd"]
    assert crowd["codes"] == [0] * CROWD
    assert all(crowd["forked"])
    print(f"{CROWD} forked servers at once beside {BUSY_LOOPS} busy loops: {crowd['seconds']:.1f} s")


def test_a_process_of_another_session_gets_no_fork(runs: dict[str, Any]) -> None:
    assert runs["warm"]["results"]["foreign"] == {"said": "dropped", "code": 0}  # it connects: dropped unanswered


def test_a_stack_supervisor_is_not_forked_for_an_environment_the_preload_saw_otherwise(
    runs: dict[str, Any], tmp_path: Path
) -> None:
    """openai reads ``AZURE_OPENAI_AD_TOKEN`` when it is imported: a stack that passes one (``pass_env``) to its
    processes cannot be a fork of a warm parent that imported openai without it."""
    runtime, env = _gym_env(runs["python"])
    parent = acquire_warm_parent(runtime, env)
    try:
        spec = {"argv": ["true"], "cwd": str(tmp_path), "log": str(tmp_path / "log"), "ports": [], "remove": []}
        with pytest.raises(WarmStartUnavailable, match="AZURE_OPENAI_AD_TOKEN"):
            parent.supervise(spec, env | {"AZURE_OPENAI_AD_TOKEN": "not-a-token"}, tmp_path)
    finally:
        release_warm_parent(parent)


def test_without_a_warm_supervisor_the_launcher_starts_the_plain_interpreter(runs: dict[str, Any]) -> None:
    results = runs["plain-supervisor"]["results"]
    for mode in ("view", "exit3", "raise", "kill-self", "usr1", "term"):
        assert not results[f"warm-{mode}"]["report"]["forked"], mode
        assert results[f"warm-{mode}"].get("code") == results[f"plain-{mode}"].get("code"), mode
    assert results["warm-view"]["report"]["view"] == results["plain-view"]["report"]["view"]
    assert results["warm-killed"]["app_gone"]
    assert not results["derived-warm-view"]["report"]["forked"]  # its own interpreter, as the plain start's
    assert results["derived-warm-view"]["report"]["view"] == results["derived-plain-view"]["report"]["view"]


def test_a_stack_the_warm_start_cannot_serve_starts_the_plain_way_and_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm parent refuses the stack's supervisor (its environment holds a variable openai reads at import):
    its processes start as fresh interpreters, the stack works, and the log says why, once (a restart asks no
    more)."""
    from tests.e2e.conftest import env_config
    from tests.e2e.test_stack import _get, _listening_pid, _parent
    from verifiers_nemo._gym.runtime import gym_root
    from verifiers_nemo._stack import GymStack

    monkeypatch.setenv("AZURE_OPENAI_AD_TOKEN", "not-a-token")
    config = StackConfig(
        "example_single_tool_call",
        (env_config(gym_root(), "example_single_tool_call"),),
        "http://127.0.0.1:9",
        pass_env=("AZURE_OPENAI_AD_TOKEN",),
    )
    stack = GymStack(config)
    caplog.set_level("WARNING", logger="verifiers_nemo")
    try:
        for _ in range(2):  # a start, then a restart
            info = stack.restart() if stack.running else stack.start()
            url = info.server_urls["example_single_tool_call"]
            assert _get(url + "/") == 200
            server = _listening_pid(int(url.rsplit(":", 1)[1]))
            assert _parent(server) != stack.launch.supervisor.pid  # a fresh interpreter, its shell's child
            assert not isinstance(stack.launch.supervisor, WarmSupervisor)
    finally:
        stack.stop()
    said = [r.getMessage() for r in caplog.records if "start the plain way" in r.getMessage()]
    assert len(said) == 1 and "AZURE_OPENAI_AD_TOKEN" in said[0], said


# -- a warm parent that stops as a new holder arrives; a request that fails after it was served -----------------


def _sleeper_spec(tmp: Path) -> dict[str, Any]:
    """A stack supervisor's spec whose launcher runs until it is stopped (``sleep``: started the plain way)."""
    return {"argv": ["sleep", "120"], "cwd": str(tmp), "log": str(tmp / "log"), "grace_s": 1.0, "ports": [],
            "remove": [], "logs": []}  # fmt: skip


def _forked_by(supervisor: WarmSupervisor) -> int:
    """The supervisor (lease holder side) of the warm parent that forked ``supervisor``: its parent's parent."""
    from tests.e2e.test_stack import _parent

    return _parent(_parent(supervisor.pid))


def _zygote_of(supervisor_pid: int) -> int:
    from tests.e2e.env_server_harness import cmdline, live_pids

    [zygote] = [  # its rearguard, a fork of it, names zygote.py too: in the spec it was given
        p
        for p, (ppid, _) in live_pids().items()
        if ppid == supervisor_pid and cmdline(p).split()[1].endswith("zygote.py")
    ]
    return zygote


def _gone(pid: int, timeout: float = 60.0) -> bool:
    from tests.e2e.conftest import wait_until
    from verifiers_nemo._stack.leases import start_time

    return bool(wait_until(lambda: start_time(pid) is None, timeout, f"pid {pid} gone"))


def test_a_new_holder_never_joins_a_warm_parent_that_decided_to_stop(own_ray_dir: Path, tmp_path: Path) -> None:
    """The last holder leaves and the warm parent's supervisor decides to stop: under the folder's lock it removes
    the state file (no process may join it from then on), then takes its session down. A holder arriving in
    between (on a loaded machine its supervisor may wait seconds for the lock the newcomer holds while it starts
    the next warm parent) starts and uses a new warm parent: never the old one, whose warm parent still listens
    until the teardown reaches it (measured: the newcomer's request went to it, which died on it: EPIPE, and its
    stack started plain). Here the old supervisor is held still (SIGSTOP) right after that decision."""
    from verifiers_nemo._stack.leases import locked

    runtime, env = _gym_env(None)
    first = acquire_warm_parent(runtime, env, own_ray_dir)
    old, folder = first.pid, first.folder
    stopped = False
    second = None
    try:
        served = first.supervise(_sleeper_spec(tmp_path), env, tmp_path)  # ready and serving
        stop_supervised(served, "sleeper", 5.0)
        os.kill(old, signal.SIGSTOP)
        stopped = True
        release_warm_parent(first)  # the last holder leaves
        with locked(folder / "lock"):  # what its supervisor does next: the state file goes first
            (folder / "state.json").unlink()
        second = acquire_warm_parent(runtime, env, own_ray_dir)
        assert second.pid != old
        supervisor = second.supervise(_sleeper_spec(tmp_path), env, tmp_path)
        try:
            assert _forked_by(supervisor) == second.pid, "the stack's supervisor was forked by the stopping parent"
        finally:
            stop_supervised(supervisor, "sleeper", 5.0)
        os.kill(old, signal.SIGCONT)  # the old one finishes stopping: the new one's socket is not its to remove
        stopped = False
        os.kill(old, signal.SIGTERM)
        assert _gone(old)
        third = WarmParent(runtime, env, folder, probe(runtime, env)[0])  # another process's hold on it
        try:
            assert third.pid == second.pid
            supervisor = third.supervise(_sleeper_spec(tmp_path), env, tmp_path)
            assert _forked_by(supervisor) == second.pid
            stop_supervised(supervisor, "sleeper", 5.0)
        finally:
            third.leave()
    finally:
        if stopped:
            os.kill(old, signal.SIGCONT)
        if second is not None:
            release_warm_parent(second)


def test_a_warm_parent_whose_warm_process_is_gone_is_replaced_not_joined(own_ray_dir: Path, tmp_path: Path) -> None:
    """A warm parent whose warm process exited while its supervisor has not yet taken the rest down (held still
    here: SIGSTOP) still has its state file: a new holder sees its socket refuse connections, takes what is left
    of it down and starts another (as a dead Ray head is told by its GCS port), instead of waiting on it."""
    runtime, env = _gym_env(None)
    first = acquire_warm_parent(runtime, env, own_ray_dir)
    old = first.pid
    second = None
    try:
        stop_supervised(first.supervise(_sleeper_spec(tmp_path), env, tmp_path), "sleeper", 5.0)
        zygote = _zygote_of(old)
        os.kill(old, signal.SIGSTOP)
        os.kill(zygote, signal.SIGKILL)
        assert _gone(zygote)
        release_warm_parent(first)
        second = acquire_warm_parent(runtime, env, own_ray_dir)
        assert second.pid != old
        assert _gone(old, 60.0), "what was left of the old warm parent was not taken down"
        supervisor = second.supervise(_sleeper_spec(tmp_path), env, tmp_path)
        assert _forked_by(supervisor) == second.pid
        stop_supervised(supervisor, "sleeper", 5.0)
    finally:
        from verifiers_nemo._stack.leases import start_time

        if start_time(old) is not None:
            os.kill(old, signal.SIGCONT)
        if second is not None:
            release_warm_parent(second)


def test_a_request_the_warm_parent_read_answered_and_closed_at_once_was_sent() -> None:
    """The owner's side of a warm request on a loaded machine: the warm parent reads the whole request, forks the
    stack's supervisor, answers and closes before the sender's ``send`` returns. That request was sent: no EPIPE
    (which the owner took for a refusal, starting the stack plain beside the supervisor forked for it)."""
    import socket

    from verifiers_nemo._gym_side import wire

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)

    class AnsweredAtOnce:
        """Our socket, with the warm parent faster than its sender: done with the request as soon as it is written."""

        def sendmsg(self, buffers: list[bytes], ancillary: list[Any]) -> int:
            sent = ours.sendmsg(buffers, ancillary)
            peer = wire.Channel(theirs)
            request, fds = peer.recv()
            for fd in fds:
                os.close(fd)
            peer.send({"pid": 1, "asked": request})
            peer.close()
            return sent

        def sendall(self, data: bytes) -> None:
            ours.sendall(data)

    read_end, write_end = os.pipe()
    try:
        wire.Channel(AnsweredAtOnce()).send({"spec": {"argv": ["ng_run"]}}, [read_end])  # type: ignore[arg-type]
        reply, _ = wire.Channel(ours).recv()
        assert reply == {"pid": 1, "asked": {"spec": {"argv": ["ng_run"]}}}
    finally:
        os.close(read_end)
        os.close(write_end)
        ours.close()


def test_a_stack_whose_warm_request_failed_after_a_supervisor_was_forked_for_it_starts_plain(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm parent forked the stack's supervisor, but the owner saw the request fail (the answer lost): the
    owner closes that supervisor's pipe and starts the stack the plain way. The forked supervisor, told so by its
    pipe, removes its launch's folders as it stops: the plain start works in folders of its own (measured: it shared
    them, lost them, and exited at once with no output)."""
    from tests.e2e.conftest import env_config
    from tests.e2e.test_stack import _get
    from verifiers_nemo._gym.runtime import gym_root
    from verifiers_nemo._stack import GymStack

    real_supervise = WarmParent.supervise
    forked: list[int] = []

    def answer_lost(
        self: WarmParent, spec: dict[str, Any], env: Any, cwd: Path, deadline: Any = None
    ) -> WarmSupervisor:
        supervisor = real_supervise(self, spec, env, cwd, deadline)
        forked.append(supervisor.pid)
        supervisor.stdin.close()  # as the owner does on a failed request: the forked supervisor stops
        supervisor.wait(timeout=60)
        supervisor.close()
        said = f"the warm parent (pid {self.pid}) did not answer: [Errno 32] Broken pipe"
        raise WarmStartUnavailable(said, transient=True)

    monkeypatch.setattr(WarmParent, "supervise", answer_lost)
    config = StackConfig(
        "example_single_tool_call", (env_config(gym_root(), "example_single_tool_call"),), "http://127.0.0.1:9"
    )
    stack = GymStack(config)
    caplog.set_level("WARNING", logger="verifiers_nemo")
    try:
        info = stack.start()
        assert forked, "the warm parent was not asked"
        assert _get(info.server_urls["example_single_tool_call"] + "/") == 200
        assert not isinstance(stack.launch.supervisor, WarmSupervisor)
        assert stack.launch.warm_refused and "Broken pipe" in stack.launch.warm_refused
    finally:
        stack.stop()
    said = [r.getMessage() for r in caplog.records if "start the plain way" in r.getMessage()]
    assert len(said) == 1 and "Broken pipe" in said[0], said


def test_a_warm_parent_that_did_not_answer_is_asked_again_at_the_stacks_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Not answering is not refusing: a stack whose warm request got no answer starts the plain way, and its
    restart is forked warm again (a refusal of the stack itself holds for its restarts)."""
    from tests.e2e.conftest import env_config
    from tests.e2e.test_stack import _get
    from verifiers_nemo._gym.runtime import gym_root
    from verifiers_nemo._stack import GymStack

    real_supervise = WarmParent.supervise
    asked: list[str] = []

    def silent_once(
        self: WarmParent, spec: dict[str, Any], env: Any, cwd: Path, deadline: Any = None
    ) -> WarmSupervisor:
        asked.append("failed" if not asked else "served")
        if asked[-1] == "failed":
            raise WarmStartUnavailable(f"the warm parent (pid {self.pid}) did not answer: timed out", transient=True)
        return real_supervise(self, spec, env, cwd, deadline)

    monkeypatch.setattr(WarmParent, "supervise", silent_once)
    config = StackConfig(
        "example_single_tool_call", (env_config(gym_root(), "example_single_tool_call"),), "http://127.0.0.1:9"
    )
    stack = GymStack(config)
    try:
        stack.start()
        assert not isinstance(stack.launch.supervisor, WarmSupervisor) and stack.launch.warm_retry
        info = stack.restart()
        assert asked == ["failed", "served"]
        assert isinstance(stack.launch.supervisor, WarmSupervisor) and stack.launch.warm_refused is None
        assert _get(info.server_urls["example_single_tool_call"] + "/") == 200
    finally:
        stack.stop()
