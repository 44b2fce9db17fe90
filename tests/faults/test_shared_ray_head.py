"""The machine's shared Ray head, on the real thing: processes share it and never each other's faults.

Each test has a head folder of its own (``own_ray_dir``: ``VERIFIERS_NEMO_RAY_DIR``), which its child
processes inherit, so it watches its own head start and stop whatever else the suite holds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.e2e.conftest import env_config, wait_until
from tests.e2e.test_cli import CLI, _child_env
from verifiers_nemo._eval import read_results
from verifiers_nemo._stack.procs import session_pids

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).parents[2]

_HOLDER = textwrap.dedent(
    """
    # A process with a Gym stack: prints where its stack and the head it joined are, then, for every line
    # on stdin, waits for its stack to be found dead, restarts it and prints again. EOF: exit.
    import json, sys, time
    from pathlib import Path
    from verifiers_nemo._stack import GymStack, StackConfig
    stack = GymStack(StackConfig(sys.argv[1], (Path(sys.argv[2]),), "http://127.0.0.1:9"))

    def report(info):
        print(json.dumps({"head": stack.ray_head.pid, "address": stack.ray_head.address,
                          "sid": stack.launch.supervisor.pid, "agent": stack.agent_url(),
                          "generation": info.generation}), flush=True)

    report(stack.start())
    for line in sys.stdin:
        generation = stack.generation
        deadline = time.monotonic() + 30
        while not stack.is_dead(generation) and time.monotonic() < deadline:
            time.sleep(0.05)
        report(stack.ensure_running())
    stack.stop()
    """
)

_ACQUIRE = textwrap.dedent(
    """
    # Wait for the go file, then take the machine's head (starting it if none runs); print it; hold it until EOF.
    import json, os, sys, time
    from pathlib import Path
    from verifiers_nemo._gym import find_gym_runtime
    from verifiers_nemo._stack.ray_head import acquire_ray_head
    runtime = find_gym_runtime()
    go = Path(sys.argv[1])
    while not go.exists():
        time.sleep(0.005)
    head = acquire_ray_head(runtime, dict(os.environ))
    print(json.dumps({"head": head.pid, "address": head.address, "temp_dir": str(head.temp_dir)}), flush=True)
    sys.stdin.read()
    """
)


def _start(script: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


def _read(proc: subprocess.Popen[str]) -> dict:
    line = proc.stdout.readline() if proc.stdout else ""
    assert line, f"the process exited ({proc.poll()}) before saying where its stack is"
    return json.loads(line)


def _programs(head_pid: int) -> list[str]:
    """The first argument of every process of the head's session (Ray workers rename theirs ``ray::...``)."""
    programs = []
    for pid in session_pids(head_pid):
        try:
            programs.append(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace"))
        except OSError:
            continue
    return programs


def _gcs_servers(head_pid: int) -> int:
    return sum(program.endswith("/gcs_server") for program in _programs(head_pid))


def _ray_workers(head_pid: int) -> list[str]:
    """Ray worker processes (idle or running a task), not the node's own agents."""
    agents = {"ray::DashboardAgent", "ray::RuntimeEnvAgent"}
    return [p for p in _programs(head_pid) if p.startswith("ray::") and p not in agents]


def _raylet_environ(head_pid: int) -> dict[str, str]:
    """The environment of the head's raylet, which starts the dashboard agent with it. (Not the agent's own: Ray
    renames the agent's process, and ``setproctitle`` may overwrite the memory ``/proc/PID/environ`` reads.)"""
    for pid in session_pids(head_pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].endswith(b"/raylet"):
                pairs = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                return dict(p.decode(errors="replace").split("=", 1) for p in pairs if b"=" in p)
        except OSError:
            continue
    raise AssertionError("the head has no raylet")


def _stop(*procs: subprocess.Popen[str]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def _agent_answers(url: str) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(url + "/", timeout=5) as response:
            return response.status == 200
    except OSError:
        return False


def test_concurrent_first_starts_make_one_head_that_stops_with_its_last_holder(
    tmp_path: Path, own_ray_dir: Path
) -> None:
    go = tmp_path / "go"
    holders = [_start(_ACQUIRE, str(go)) for _ in range(3)]
    try:
        time.sleep(0.5)  # every holder waits on the go file (importing verifiers_nemo is quick)
        go.touch()
        heads = [_read(p) for p in holders]
        assert len({h["head"] for h in heads}) == 1 and len({h["address"] for h in heads}) == 1
        head = heads[0]["head"]
        assert _gcs_servers(head) == 1  # one head, not one per racer
        assert _ray_workers(head) == []  # no Ray worker that nothing uses

        holders[0].stdin.close()
        holders[0].wait(timeout=90)
        os.kill(holders[1].pid, signal.SIGKILL)  # a holder that dies without a word: its lease is reaped
        holders[1].wait(timeout=90)
        time.sleep(2)
        assert session_pids(head), "the head stopped while a process still held it"

        holders[2].stdin.close()
        holders[2].wait(timeout=90)
        wait_until(lambda: not session_pids(head), timeout=90, what="the head to stop after its last holder")
        assert not Path(heads[0]["temp_dir"]).exists()
    finally:
        _stop(*holders)


def test_a_holder_killed_mid_run_leaves_the_other_process_s_rollouts_whole(tmp_path: Path, own_ray_dir: Path) -> None:
    """Two `verifiers-nemo eval` processes on one head; one is SIGKILLed mid-run: the other finishes every
    rollout, and once it exits no process of the head is left."""
    env = _child_env()
    args = ["eval", "example_multi_step", "-n", "5", "-r", "8", "-c", "2", "-s"]
    dirs = [tmp_path / "victim", tmp_path / "survivor"]
    for d in dirs:
        d.mkdir()
    logs = [open(d / "cli.log", "w") for d in dirs]  # noqa: SIM115 (closed below)
    victim, survivor = (
        subprocess.Popen([CLI, *args], cwd=d, env=env, stdout=log, stderr=subprocess.STDOUT)
        for d, log in zip(dirs, logs, strict=True)
    )
    folder = next(iter(own_ray_dir.iterdir()), None)
    try:
        wait_until(lambda: any(own_ray_dir.glob("*/head.json")), timeout=180, what="a head to start")
        folder = next(own_ray_dir.glob("*/head.json")).parent
        head = json.loads((folder / "head.json").read_text())["pid"]

        def rows(d: Path) -> int:
            return sum(len(p.read_text().splitlines()) for p in d.glob("outputs/**/results.jsonl"))

        # Both mid-run: both hold the head, and the victim has rollouts done with more to go.
        wait_until(lambda: len(list((folder / "leases").iterdir())) == 2, timeout=180, what="both to hold it")
        wait_until(lambda: rows(dirs[0]) >= 2, timeout=180, what="the victim's first rollouts")
        assert rows(dirs[0]) < 40 and victim.poll() is None
        victim.kill()
        victim.wait(timeout=60)

        assert survivor.wait(timeout=300) == 0, (dirs[1] / "cli.log").read_text()[-3000:]
        (path,) = dirs[1].glob("outputs/**/results.jsonl")
        results, _ = read_results(path)
        assert len(results) == 40 and all(r.get("error") is None for r in results)
        assert all(r["reward"] == r["recorded_reward"] for r in results if "recorded_reward" in r)
        wait_until(lambda: not session_pids(head), timeout=90, what="the head to stop after its last holder")
        assert list((folder / "leases").iterdir()) == []
    finally:
        _stop(victim, survivor)
        for log in logs:
            log.close()


def test_a_killed_head_is_replaced_and_every_holder_s_stack_recovers(gym_root: Path, own_ray_dir: Path) -> None:
    config = str(env_config(gym_root, "example_single_tool_call"))
    holders = [_start(_HOLDER, "example_single_tool_call", config) for _ in range(2)]
    try:
        first = [_read(p) for p in holders]
        assert first[0]["head"] == first[1]["head"]
        assert _ray_workers(first[0]["head"]) == []  # Gym's drivers connected: Ray prestarted no idle worker
        # node reports for a dashboard the head does not run: once a minute, not every 2.5 s
        assert _raylet_environ(first[0]["head"]).get("REPORTER_UPDATE_INTERVAL_MS") == "60000"
        os.killpg(first[0]["head"], signal.SIGKILL)  # the head's whole process group, as an OOM kill could

        for proc in holders:
            proc.stdin.write("restart\n")
            proc.stdin.flush()
        again = [_read(p) for p in holders]
        assert again[0]["head"] == again[1]["head"] != first[0]["head"]  # one new head, joined by both
        assert all(a["generation"] == f["generation"] + 1 for a, f in zip(again, first, strict=True))
        assert all(_agent_answers(a["agent"]) for a in again)
        new_head = again[0]["head"]
        for proc in holders:
            proc.stdin.close()
            proc.wait(timeout=60)
        wait_until(lambda: not session_pids(new_head), timeout=90, what="the new head to stop")
        assert not any(session_pids(f["head"]) for f in first)
    finally:
        _stop(*holders)


def test_a_head_whose_node_registers_late_is_waited_for(tmp_path: Path, gym_root: Path, own_ray_dir: Path) -> None:
    """A head that takes longer to register its node than Gym's drivers wait for it (on a loaded machine:
    more than Ray's 60 s): stacks start, because ng_run is launched only once the node is registered.

    The slow head without the load: Ray's own test switch delays the GCS's RegisterNode handler by 8 s, and
    the drivers (ng_run and its servers) wait only 4 s for a node (``RAY_gcs_server_request_timeout_seconds``).
    Launched at once, their ``ray.init`` fails exactly as on the busy machine ("No node info found")."""
    venv = Path(sys.executable).parent
    bin_dir = tmp_path / "runtime" / "bin"
    bin_dir.mkdir(parents=True)
    wrappers = {
        "python": f'exec {venv}/python "$@"',
        "ray": 'export RAY_testing_asio_delay_us="NodeInfoGcsService.grpc_server.RegisterNode=8000000:8000000"\n'
        f'exec {venv}/ray "$@"',
        "ng_run": f'export RAY_gcs_server_request_timeout_seconds=4\nexec {venv}/ng_run "$@"',
    }
    for name, body in wrappers.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    script = textwrap.dedent(
        """
        import logging, sys, time
        from pathlib import Path
        from verifiers_nemo._stack import GymStack, StackConfig
        logging.basicConfig(level=logging.WARNING)  # a start tried again says so on stderr
        t = time.monotonic()
        stack = GymStack(StackConfig("example_single_tool_call", (Path(sys.argv[1]),), "http://127.0.0.1:9",
                                     gym_python=sys.argv[2]))
        info = stack.start()
        print(f"ready in {time.monotonic() - t:.1f}s, head at {stack.ray_head.address}", flush=True)
        print(stack.log_path.read_text())
        stack.stop()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(env_config(gym_root, "example_single_tool_call")), str(bin_dir / "python")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "ready in" in done.stdout
    # Started at the first try: no driver gave up on the head (the start is not merely rescued by a retry).
    assert "retrying" not in done.stderr, done.stderr[-3000:]
    assert "No node info found" not in done.stdout and "Failed to connect to Ray cluster" not in done.stdout
