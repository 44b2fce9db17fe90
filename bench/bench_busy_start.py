"""A machine's first Gym stack on a busy machine: which order of its parts starts it soonest.

    .venv/bin/python bench/bench_busy_start.py [--busy 8] [--repeats 2] [--orders together,head_first,plain]

On a machine's first stack three things start: the shared Ray head (every Gym server is a Ray driver: nothing is
ready before it), the warm parent's preload (the Gym runtime's third-party imports, once) and then the stack, whose
processes fork from the warm parent. Issue 50 measured, with 8 busy loops on 2 cores, first starts of 70-100 s and
a Ray head that missed a fixed 120 s deadline. This benchmark starts ``--busy`` busy loops (killed at the end), then
for each repeat, alternating, a fresh process with a fresh heads folder (``VERIFIERS_NEMO_RAY_DIR``: nothing of
ours running) starts one stack (``--env``) in one of these orders:

- ``together``: the warm parent is started first and prepares while the Ray head starts (its preload competes with
  the head for the busy CPUs);
- ``head_first``: the Ray head is started and waited for, then the warm parent and the stack;
- ``plain``: no warm parent (``warm_start=False``), the servers as fresh interpreters: the reference.

Each row: seconds until the Ray head was ready (the ``head_first`` order waits for it alone; in the others it is
read from the process's log), until the stack answered, and the CPU-seconds of the processes of the head, the warm
parent and the stack by then. A warm parent's preload can not be run at a lower priority instead: the stacks it
forks would inherit that priority, and an unprivileged user cannot raise it back.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, cpu_seconds, gym_runtimes, session_pids, write_json
from bench_warm_start import _prime_probe

ROOT = Path(__file__).resolve().parents[1]

_FIRST = textwrap.dedent(
    """
    import json, logging, sys, time
    from dataclasses import replace
    t0 = time.monotonic()
    head_ready = []
    class _Seen(logging.Handler):
        def emit(self, record):
            if "Ray head for Gym stacks ready" in record.getMessage() and not head_ready:
                head_ready.append(time.monotonic() - t0)
    logging.getLogger("verifiers_nemo").addHandler(_Seen())
    logging.getLogger("verifiers_nemo").setLevel(logging.INFO)
    from verifiers_nemo._gym.runtime import find_gym_runtime, gym_root
    from verifiers_nemo._stack import GymStack, StackConfig
    from verifiers_nemo._stack.plan import child_env
    from verifiers_nemo._stack.ray_head import acquire_ray_head
    from verifiers_nemo._stack.stack import warm_parent_env
    from verifiers_nemo._stack.warm_parent import acquire_warm_parent
    import os
    env, python, order = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    config = StackConfig(env, (gym_root(python) / "resources_servers" / env / "configs" / f"{env}.yaml",),
                         "http://127.0.0.1:9", gym_python=python, warm_start=order != "plain")
    runtime = find_gym_runtime(python)
    t0 = time.monotonic()
    if order == "together":
        acquire_warm_parent(runtime, warm_parent_env(config, runtime))  # held: the stack joins it
    elif order == "head_first":
        acquire_ray_head(runtime, child_env(os.environ, runtime.bin_dir, replace(config, pass_env=())))
    stack = GymStack(config)
    stack.start()
    ready = time.monotonic() - t0
    parent = stack.warm_parent
    print(json.dumps({"ready_s": ready, "head_s": head_ready[0] if head_ready else None,
                      "stack_sid": stack.launch.supervisor.pid, "head_sid": stack.ray_head.pid,
                      "warm_sid": parent.pid if parent is not None else None}), flush=True)
    sys.stdin.read()
    stack.stop()
    """
)


def _busy_loops(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(["sh", "-c", "while :; do :; done"], start_new_session=True) for _ in range(count)]


def _first_start(env: str, python: str | None, order: str) -> dict[str, Any]:
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-bb-"))
    environ = dict(os.environ, PYTHONPATH=str(ROOT), VERIFIERS_NEMO_RAY_DIR=str(heads_dir))
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-c", _FIRST, env, python or "", order],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=environ,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            return {"order": order, "failed": f"exit {proc.wait()}", "wall_s": time.monotonic() - started}
        info = json.loads(line)
        sids = [info["head_sid"], info["warm_sid"], info["stack_sid"]]
        info["cpu_s"] = cpu_seconds(*session_pids(*sids))  # the live processes' CPU so far (exited ones: not counted)
        return {"order": order, **info}
    finally:
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(heads_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="example_multi_step")
    parser.add_argument("--busy", type=int, default=8, help="busy loops while the starts run (0: a quiet machine)")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--orders", default="together,head_first")
    parser.add_argument("--releases", default="0.4")
    add_json_flag(parser)
    args = parser.parse_args()

    orders = args.orders.split(",")
    rows: list[dict[str, Any]] = []
    for release, python in gym_runtimes(args.releases).items():
        _prime_probe(python)
        loops = _busy_loops(args.busy)
        try:
            time.sleep(2.0)  # the loops running before the first start
            load = os.getloadavg()[0]
            for repeat in range(args.repeats):
                for order in orders if repeat % 2 == 0 else orders[::-1]:
                    row = {"release": release, "repeat": repeat, **_first_start(args.env, python, order)}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
        finally:
            for loop in loops:
                os.killpg(loop.pid, signal.SIGKILL)
                loop.wait()
        print(f"\nnemo-gym {release}, {args.env}, {args.busy} busy loops on {os.cpu_count()} CPUs (load {load:.1f}):")
        print(f"{'order':<12} {'ready s (each)':<24} {'median':>7} {'head s (each)':<22} {'CPU-s (each)':<20}")
        for order in orders:
            mine = [r for r in rows if r["release"] == release and r["order"] == order]
            ready = [r["ready_s"] for r in mine if "ready_s" in r]
            heads = [r["head_s"] for r in mine if r.get("head_s") is not None]
            cpu = [r["cpu_s"] for r in mine if "cpu_s" in r]
            failed = [r["failed"] for r in mine if "failed" in r]
            print(
                f"{order:<12} {' '.join(f'{v:.1f}' for v in ready):<24} "
                f"{statistics.median(ready) if ready else float('nan'):>7.1f} "
                f"{' '.join(f'{v:.1f}' for v in heads):<22} {' '.join(f'{v:.1f}' for v in cpu):<20}"
                + (f" failed: {failed}" if failed else "")
            )
    write_json(args.json, rows)


if __name__ == "__main__":
    main()
