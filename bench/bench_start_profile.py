"""Where a warm GymStack start spends its time: ng_run's log lines timestamped as they appear, and CPU by process.

    .venv/bin/python bench/bench_start_profile.py [--env example_single_tool_call] [--repeats 3]

Each repeat starts a ``GymStack`` (warm: the default cache directory, venv links in place) while a
thread tails its ``ng_run.log`` every 20 ms, so each line gets the time it first appeared. The start
is cut into phases at nemo-gym's own log lines: our pre-launch work (requirements check, venv links,
config), ng_run's start-up (imports, config merge), Ray (connecting to the process's shared Ray head,
which a first start launches at the same moment as ng_run), head server, the Gym servers
(spawn, imports, Ray connect, uvicorn), and our readiness poll. At ready, the CPU seconds used so far
by each kind of process of the stack's session are summed (processes that already exited, e.g. the
requirements check, are not counted). Prints every repeat and the median.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_json_flag, cpu_seconds, write_json

from verifiers_nemo._gym.runtime import find_gym_runtime
from verifiers_nemo._stack import GymStack, StackConfig

PHASES = (
    ("pre-launch (ours)", "spawn"),
    ("ng_run imports + config", "ray_begin"),
    ("Ray start or connect", "ray_ready"),
    ("head server up", "head_up"),
    ("Gym servers up", "servers_up"),
    ("readiness poll (ours)", "ready"),
)
_RAY_BEGIN = re.compile(r"starting a new Ray cluster|Connecting to Ray cluster")
_RAY_READY = re.compile(r"Started Ray cluster at|Connected to Ray cluster")
_HEAD_UP = re.compile(r"^INFO:\s+Uvicorn running")
_SERVER_UP = re.compile(r"^\((\S+)\) INFO:\s+Uvicorn running")


def process_kind(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ")
    except OSError:
        return "gone"
    if b"app.py" in cmd:
        return "Gym servers"
    if b"ng_run" in cmd:
        return "ng_run (+ head server)"
    if b"supervisor.py" in cmd:
        return "supervisor (ours)"
    return "Ray processes"


def _stack(env: str, gym_python: str | None) -> GymStack:
    runtime = find_gym_runtime(gym_python)
    config = runtime.root / "resources_servers" / env / "configs" / f"{env}.yaml"
    return GymStack(StackConfig(env, (config,), "http://127.0.0.1:9", gym_python=gym_python))


def one_start(env: str, gym_python: str | None) -> tuple[dict[str, float], dict[str, float], dict[str, int]]:
    stack = _stack(env, gym_python)
    lines: list[tuple[float, str]] = []
    stop = threading.Event()
    t0 = time.monotonic()

    def tail() -> None:
        offset, pending = 0, b""
        while not stop.is_set():
            launch = stack._launch
            if launch is not None and launch.log_path.exists():
                with open(launch.log_path, "rb") as f:
                    f.seek(offset)
                    data = f.read()
                offset += len(data)
                *complete, pending = (pending + data).split(b"\n")
                now = time.monotonic() - t0
                lines.extend((now, line.decode(errors="replace")) for line in complete)
            time.sleep(0.02)

    thread = threading.Thread(target=tail, daemon=True)
    thread.start()
    try:
        info = stack.start()
        marks = {"ready": time.monotonic() - t0}
        cpu: dict[str, float] = {}
        procs: dict[str, int] = {}
        for pid in info.pids:
            kind = process_kind(pid)
            cpu[kind] = cpu.get(kind, 0.0) + cpu_seconds(pid)
            procs[kind] = procs.get(kind, 0) + 1
        time.sleep(0.1)  # let the tail thread read the last lines
        launch = stack._launch
        assert launch is not None
        marks["spawn"] = launch.started_at - t0
    finally:
        stop.set()
        thread.join()
        stack.stop()
    servers_up = []
    for at, line in lines:
        if "ray_begin" not in marks and _RAY_BEGIN.search(line):
            marks["ray_begin"] = at
        elif "ray_ready" not in marks and _RAY_READY.search(line):
            marks["ray_ready"] = at
        elif "head_up" not in marks and _HEAD_UP.search(line):
            marks["head_up"] = at
        elif _SERVER_UP.search(line):
            servers_up.append(at)
    if servers_up:
        marks["servers_up"] = max(servers_up)
    return marks, cpu, procs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="example_single_tool_call")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gym-python", default=None, help="the Gym runtime's interpreter (default: the managed one)")
    parser.add_argument("--joined", action="store_true", help="a keeper stack holds the Ray head meanwhile")
    add_json_flag(parser)
    args = parser.parse_args()

    load = os.getloadavg()[0]
    keeper = _stack(args.env, args.gym_python) if args.joined else None
    if keeper is not None:
        keeper.start()
    try:
        runs = [one_start(args.env, args.gym_python) for _ in range(args.repeats)]
    finally:
        if keeper is not None:
            keeper.stop()
    print(
        f"\nWarm GymStack start, {args.env}: phases from ng_run's own log lines, seconds "
        f"({os.cpu_count()} CPUs, load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)"
    )
    print(f"{'phase':<26}" + "".join(f"{f'run {i + 1}':>8}" for i in range(len(runs))) + f"{'median':>8}{'share':>7}")
    totals = [marks["ready"] for marks, _, _ in runs]
    previous = ["start"] * len(runs)
    phases: dict[str, list[float]] = {}
    for label, mark in PHASES:
        spans = []
        for i, (marks, _, _) in enumerate(runs):
            begin = 0.0 if previous[i] == "start" else marks.get(previous[i], float("nan"))
            spans.append(marks.get(mark, float("nan")) - begin)
            if mark in marks:
                previous[i] = mark
        median = statistics.median(spans)
        share = median / statistics.median(totals) * 100
        print(f"{label:<26}" + "".join(f"{s:>8.2f}" for s in spans) + f"{median:>8.2f}{share:>6.0f}%")
        phases[label] = [median, share]
    cells = "".join(f"{t:>8.2f}" for t in totals)
    print(f"{'total (start to ready)':<26}{cells}{statistics.median(totals):>8.2f}")
    phases["total (start to ready)"] = [statistics.median(totals), None]
    write_json(args.json, phases)

    print("\nCPU seconds used by the stack's processes up to ready (median over runs), and how many")
    kinds = sorted({k for _, cpu, _ in runs for k in cpu})
    for kind in kinds:
        used = statistics.median(cpu.get(kind, 0.0) for _, cpu, _ in runs)
        count = statistics.median(procs.get(kind, 0) for _, _, procs in runs)
        print(f"  {kind:<24}{used:>7.2f} CPU s  {count:>4.0f} processes")
    total = statistics.median(sum(cpu.values()) for _, cpu, _ in runs)
    print(f"  {'all':<24}{total:>7.2f} CPU s on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
