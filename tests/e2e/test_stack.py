"""GymStack on the real nemo-gym 0.4 launcher: start, answer, die, restart, stop, signals, and the machine's
shared Ray head (each test that watches the head start or stop has a head folder of its own: ``own_ray_dir``)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.e2e.conftest import env_config, wait_until
from verifiers_nemo import ConfigurationError
from verifiers_nemo._stack import GymStack, StackConfig
from verifiers_nemo._stack.procs import port_accepts, session_pids

pytestmark = pytest.mark.e2e
UNUSED_POLICY = "http://127.0.0.1:9"  # nothing calls the policy in these tests


def _config(root: Path, env: str) -> StackConfig:
    return StackConfig(env, (env_config(root, env),), UNUSED_POLICY)


def _get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.status


def _ports(stack: GymStack) -> list[int]:
    info = stack.info()
    return [int(url.rsplit(":", 1)[1]) for url in [info.head_url, *info.server_urls.values()]]


def test_two_stacks_start_answer_share_one_head_and_stop_without_leftovers(gym_root: Path, own_ray_dir: Path) -> None:
    """Two stacks of different environments at once, on disjoint ports, joined to one Ray head (the first starts
    it, the second joins it instead of starting a cluster). Stopping one (twice: idempotent) leaves nothing of it
    and leaves the head to the other; stopping the other stops the head, its files and its ports."""
    a = GymStack(_config(gym_root, "example_single_tool_call"))
    b = GymStack(_config(gym_root, "example_multi_step"))
    try:
        info = a.start()
        b.start()
        head = a.ray_head
        sid = a.launch.supervisor.pid
        a_ports, b_ports = _ports(a), _ports(b)
        assert not set(a_ports) & set(b_ports)
        assert set(info.server_urls) == {"example_single_tool_call", "example_single_tool_call_simple_agent"}
        assert info.agent_names == ("example_single_tool_call_simple_agent",)
        for stack in (a, b):
            for url in [stack.info().head_url, *stack.info().server_urls.values()]:
                assert url.startswith("http://127.0.0.1:")
                assert _get(url + "/") == 200
        assert a.agent_url() == info.server_urls["example_single_tool_call_simple_agent"]
        assert len(info.pids) > 3 and info.rss_bytes > 0
        assert session_pids(head.pid) and set(session_pids(head.pid)) <= set(info.pids)
        # one Ray head: the second stack joined it instead of starting a cluster
        assert b.ray_head is head and head.alive
        joined = f"Connecting to Ray cluster at specified address: {head.address}"
        assert all(joined in stack.log_path.read_text() for stack in (a, b))

        a.stop()
        a.stop()  # idempotent
        assert session_pids(sid) == []
        assert not any(port_accepts("127.0.0.1", port) for port in a_ports)
        assert head.alive  # still used by b
        assert _get(b.agent_url() + "/") == 200
    finally:
        a.stop()
        b.stop()
    assert not head.alive
    # The head had no other holder: it stops within a poll of its leases and a graceful teardown.
    wait_until(lambda: session_pids(head.pid) == [], timeout=20)
    wait_until(lambda: not head.temp_dir.exists(), timeout=5)  # Ray's session files were the head's own
    assert not any(port_accepts("127.0.0.1", port) for port in [*b_ports, head.gcs_port])
    assert list((head.folder / "leases").iterdir()) == [] and not (head.folder / "head.json").exists()


def test_a_dead_ray_head_is_detected_and_restart_starts_a_new_one(gym_root: Path, own_ray_dir: Path) -> None:
    stack = GymStack(_config(gym_root, "example_single_tool_call"))
    try:
        stack.start()
        generation, head = stack.generation, stack.ray_head
        os.killpg(head.pid, signal.SIGKILL)  # the head's supervisor and ray start, as an OOM kill would
        wait_until(lambda: stack.is_dead(generation), timeout=15)
        assert "Ray head" in (stack.dead_reason or "")

        info = stack.ensure_running()
        assert stack.ray_head is not head and stack.ray_head.alive
        for url in info.server_urls.values():
            assert _get(url + "/") == 200
    finally:
        stack.stop()
    wait_until(lambda: not session_pids(head.pid), timeout=20)


def test_killed_server_is_detected_and_restart_brings_the_stack_back(gym_root: Path) -> None:
    stack = GymStack(_config(gym_root, "example_single_tool_call"))
    deaths: list[tuple[int, str]] = []
    stack.on_death(lambda generation, reason: deaths.append((generation, reason)))
    try:
        stack.start()
        generation = stack.generation
        port = int(stack.info().server_urls["example_single_tool_call"].rsplit(":", 1)[1])
        pid = _listening_pid(port)
        assert _parent(pid) == stack.launch.supervisor.pid  # started warm: a fork of the stack's supervisor
        os.kill(pid, signal.SIGKILL)

        wait_until(lambda: stack.is_dead(generation), timeout=15)
        assert deaths and deaths[0][0] == generation and "example_single_tool_call" in deaths[0][1]
        assert not stack.running

        info = stack.ensure_running()
        assert stack.generation == generation + 1
        for url in info.server_urls.values():
            assert _get(url + "/") == 200
    finally:
        stack.stop()


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


def _listening_pid(port: int) -> int:
    """The pid of the process listening on 127.0.0.1:port (from /proc/net/tcp and fd links)."""
    inode = None
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                inode = fields[9]
    assert inode is not None, f"nothing listens on {port}"
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                if os.readlink(f"/proc/{pid}/fd/{fd}") == f"socket:[{inode}]":
                    return int(pid)
        except OSError:
            continue
    raise AssertionError(f"no process owns the socket on port {port}")


_OWNER = textwrap.dedent(
    """
    import json, signal, sys, time
    from pathlib import Path
    from verifiers_nemo._stack import GymStack, StackConfig
    # With the test's own VERIFIERS_NEMO_RAY_DIR this process is its head's only holder; else it joins the suite's.
    # A user's program, with Python's own Ctrl-C: after most of the suite (never alone) the SIGINT case has hung as
    # if SIGINT were ignored or blocked, both of which a child inherits from this test process.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    stack = GymStack(StackConfig("example_single_tool_call", (Path(sys.argv[1]),), "http://127.0.0.1:9"))
    info = stack.start()
    ports = [int(u.rsplit(":", 1)[1]) for u in [info.head_url, *info.server_urls.values()]]
    head, warm = stack.ray_head, stack.warm_parent
    print(json.dumps({"sid": stack.launch.supervisor.pid, "ports": ports, "dir": str(stack.launch.run_dir),
                      "head": {"sid": head.pid, "port": head.gcs_port, "dir": str(head.temp_dir),
                               "leases": str(head.folder / "leases")},
                      "warm": {"sid": warm.pid, "leases": str(warm.folder / "leases")}}), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL], ids=lambda s: s.name)
def test_owner_process_killed_by_signal_leaves_nothing_of_the_stack(
    gym_root: Path, sig: signal.Signals, request: pytest.FixtureRequest
) -> None:
    """SIGKILL: the owner is its Ray head's and warm parent's only holder (a head folder of its own), so they go too,
    its leases released by the kernel; its stack, whose processes are forks of the warm parent, goes with them.
    SIGTERM, SIGINT: the owner joins the suite's shared head and warm parent, which outlive it, less its leases."""
    own_head = sig == signal.SIGKILL
    if own_head:
        request.getfixturevalue("own_ray_dir")
    owner = subprocess.Popen(
        [sys.executable, "-c", _OWNER, str(env_config(gym_root, "example_single_tool_call"))],
        stdout=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).parents[2],
    )
    try:
        started = json.loads(owner.stdout.readline())
        head, warm = started["head"], started["warm"]
        sids = [started["sid"], head["sid"], warm["sid"]] if own_head else [started["sid"]]
        dirs = [started["dir"], head["dir"]] if own_head else [started["dir"]]
        ports = [*started["ports"], head["port"]] if own_head else started["ports"]
        assert all(session_pids(sid) for sid in [started["sid"], head["sid"], warm["sid"]])  # stack, head, warm parent
        owner.send_signal(sig)
        # SIGINT: the owner tears down in-process, bounded by the stack's stop_timeout (10 s); 60 s is that with
        # margin for a busy machine (quiet: under 1 s; 30 s was once too little at load 25).
        owner.wait(timeout=60)
        # Its stack goes with it; its own head goes once its supervisor sees the owner's lease dead (0.5 s polls).
        wait_until(lambda: not any(session_pids(sid) for sid in sids), timeout=30)
        # the run folder and the Ray head's files go too, even when the owner could not remove them (SIGKILL)
        wait_until(lambda: not any(Path(d).exists() for d in dirs), timeout=10)
        assert not any(port_accepts("127.0.0.1", port) for port in ports)
        if not own_head:  # the shared head and warm parent stay for their other holders, without the owner's leases
            for leases in (Path(head["leases"]), Path(warm["leases"])):
                wait_until(lambda: not any(p.name.startswith(f"{owner.pid}-") for p in leases.iterdir()), timeout=10)  # noqa: B023
            assert session_pids(head["sid"]) and port_accepts("127.0.0.1", head["port"])
            assert session_pids(warm["sid"])
    finally:
        if owner.poll() is None:
            owner.kill()


def test_config_without_an_agent_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "only_server.yaml"
    config.write_text("s:\n  resources_servers:\n    example_single_tool_call:\n      entrypoint: app.py\n")
    with pytest.raises(ConfigurationError, match="defines no Gym agent"):
        GymStack(StackConfig("x", (config,), UNUSED_POLICY))


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="does not exist"):
        GymStack(StackConfig("x", (tmp_path / "nope.yaml",), UNUSED_POLICY))


def test_shared_ray_false_lets_ng_run_start_its_own_ray(gym_root: Path) -> None:
    stack = GymStack(StackConfig("example_single_tool_call", (env_config(gym_root, "example_single_tool_call"),),
                                 UNUSED_POLICY, shared_ray=False))  # fmt: skip
    try:
        info = stack.start()
        assert stack.ray_head is None
        assert "NeMo Gym is starting a new Ray cluster" in stack.log_path.read_text()
        assert _get(info.server_urls["example_single_tool_call"] + "/") == 200
    finally:
        stack.stop()
