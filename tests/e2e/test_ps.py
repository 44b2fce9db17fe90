"""`verifiers-nemo ps` on a real stack: it lists the stack of a live process (its processes, ports, folders) and the
helpers it holds; once that process and its stack's supervisor are SIGKILLed together (what no clean-up of ours
can answer: the supervisor is what stops a stack whose owner died), the Gym servers left are shown as left over,
and `ps --clean` stops every one of them and removes the run folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.e2e.conftest import wait_until
from verifiers_nemo._gym.runtime import cache_dir
from verifiers_nemo._stack.procs import process_alive

ENV = "example_multi_step"
CLI = Path(sys.executable).with_name("verifiers-nemo")
HOLDER = """
import sys, time
from verifiers_nemo import NeMoGymHarness
harness = NeMoGymHarness(sys.argv[1])
stack = harness.start()
print("ready", flush=True)
time.sleep(600)
"""


def _ps(*args: str) -> str:
    done = subprocess.run([str(CLI), "ps", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _our_stack(owner: int) -> dict | None:
    return next((s for s in json.loads(_ps("--json"))["stacks"] if s["owner"] == owner), None)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def test_ps_lists_a_live_stack_and_clean_stops_what_its_killed_owner_and_supervisor_left() -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, ENV], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        stack = _our_stack(holder.pid)
        assert stack is not None and not stack["left_over"] and stack["env"] == ENV
        run_dir = Path(stack["run_dir"])
        assert run_dir.parent == cache_dir() / "runs" and run_dir.is_dir()
        assert len(stack["processes"]["ports"]) >= 3  # the resources server, the agent, the policy stand-in at least
        text = _ps()
        assert f"{stack['run_id']}  running for pid {holder.pid} (" in text
        assert any(holder.pid in h["holders"] for h in json.loads(_ps("--json"))["helpers"])  # the Ray head at least
        _ps("--clean")  # a live run's stack is not left over: nothing of it is touched
        after = _our_stack(holder.pid)
        assert (
            after is not None and not after["left_over"] and after["processes"]["ports"] == stack["processes"]["ports"]
        )

        # The owner and what stops its stack on its death, the supervisor (the session's leader) and the launcher
        # (gym env start / ng_run), SIGKILLed at once: the servers are left with nobody to stop them.
        launchers = [
            p for p in stack["processes"]["pids"] if "supervisor.py" in _cmdline(p) or " env start" in _cmdline(p)
        ]
        assert launchers, "no supervisor or launcher among the stack's processes"
        for pid in (holder.pid, *launchers):
            os.kill(pid, signal.SIGKILL)
        holder.wait(timeout=30)
        left = wait_until(
            lambda: (s := _our_stack(holder.pid)) and s["left_over"] and s, 60, "the stack shown as left over"
        )
        assert left["processes"]["pids"], "nothing was left to clean: the test killed too little"
        assert "LEFT OVER: its owner" in _ps()

        out = _ps("--clean")
        assert f"stack {stack['run_id']}: stopped" in out
        assert not any(process_alive(p) for p in left["processes"]["pids"])
        assert not run_dir.exists()
        assert _our_stack(holder.pid) is None
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=30)
        _ps("--clean")
