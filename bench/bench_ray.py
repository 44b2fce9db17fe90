"""Rollouts over Ray actors (``NeMoGymPool(ray=...)``): throughput vs number of actors, and the driver's
CPU per result.

    .venv/bin/python bench/bench_ray.py [--actors 1,2,4] [--per-actor 2] [--latency-ms 200]
                                        [--seconds 15] [--quick] [--json PATH]

Method. One local Ray cluster is started here once (``ray.init(address="local", num_cpus=max(actors) + 2)``,
127.0.0.1, no dashboard); the pool joins it and leaves it up. For each actor count ``k`` a
``NeMoGymPool("example_single_tool_call", ray=True, workers=k, cpus_per_stack=1)`` is started (each
actor starts a whole Gym stack with its own Ray head), measured, and closed. The policy is the fake
Responses upstream of ``bench_throughput.py`` (a separate process, aiohttp on 127.0.0.1) with its
scripted single-tool-call policy: ``get_weather``, then an answer, i.e. ``m`` = 2 policy calls a
rollout (counted from the results' traces).

(1) Throughput vs actors, against the upstream's ``/lat<L>`` route (each call answered after ``L`` ms,
so the work waits on the policy): ``P`` rollouts in flight per actor (``concurrency = P x k``), so the
ideal rate is ``k x P / (m x L)`` and scales linearly with ``k``. A warm-up run of two waves is
discarded; the timed run is a whole number of waves (rollouts that start together end together, so
rollouts / seconds is the steady rate). Printed: rollouts/s, the ideal, efficiency (measured / ideal),
the ratio to k = 1 of this run, stack start time, and the share of the machine's CPUs in use (all
processes, other users' too: above ~70% the run is no longer wait-bound).

(2) Driver CPU per result, against the instant route (latency 0): the same pool runs
``--fast-rollouts x k`` rollouts at ``--fast-per-actor x k`` in flight; the CPU seconds of this process
(all threads: the asyncio loop, Ray's core-worker threads) and of its main thread alone (the event
loop: one core at most) are read from ``/proc`` before and after, divided by the results received;
also net of each process's idle CPU (measured for ``--idle-seconds`` with the pool up, nothing running).
The CPU of the other processes involved (Ray's local head: gcs_server, raylet, idle workers; the actor
processes; their Gym stacks; the upstream) is read the same way, for scale. (3) The pool's own choice
of a worker (``Seats.take``/``give_back``: seats bucketed by load) is timed with 1 to 1,000 stub seats, and the
extrapolation to 1,000 actors is printed: driver CPU a result x cluster result rate.

Clean-up is checked at the end: every process seen under this one (the actors, their Gym stacks and
Ray heads) must be gone after ``aclose()`` and ``ray.shutdown()``, and ``pgrep -f ng_run`` is listed.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import add_json_flag, cpu_seconds, write_json  # noqa: E402
from bench_throughput import spawn_upstream, stop_upstream  # noqa: E402

from verifiers_nemo import Endpoint, NeMoGymPool, NeMoGymTaskset  # noqa: E402

ENV = "example_single_tool_call"
MODEL = "bench-policy"
HOST = "127.0.0.1"

# -- processes ------------------------------------------------------------------------------------------


def _stat(pid: int | str, task: int | None = None) -> list[str] | None:
    path = f"/proc/{pid}/task/{task}/stat" if task is not None else f"/proc/{pid}/stat"
    try:
        with open(path) as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_table() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, start time in clock ticks since boot) of every process on the machine."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            fields = _stat(name)
            if fields is not None:
                table[int(name)] = (int(fields[1]), int(fields[19]))
    return table


def descendants(roots: set[int], table: dict[int, tuple[int, int]]) -> set[int]:
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), list(roots)
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def stack_processes(owners: set[int]) -> set[int]:
    """Every process of the Gym stacks that ``owners`` started: their supervisors' sessions. A supervisor works in
    its launch's run folder, ``<cache>/runs/<name>-<owner pid>-<token>``; started warm it is a fork of the
    machine's warm parent, no descendant of its owner."""
    from verifiers_nemo._gym import cache_dir

    runs = re.compile(re.escape(f"{cache_dir()}/runs/") + r"[^/]+-(\d+)-[0-9a-f]+")
    sessions: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit() and (fields := _stat(name)) is not None:
            sessions[int(name)] = int(fields[3])
    leaders = set()
    for pid, session in sessions.items():
        if pid == session:
            try:
                found = runs.fullmatch(os.readlink(f"/proc/{pid}/cwd"))
            except OSError:
                continue
            if found and int(found.group(1)) in owners:
                leaders.add(pid)
    return {pid for pid, session in sessions.items() if session in leaders}


def main_thread_cpu() -> float:
    """CPU seconds of this process's main thread (the asyncio loop) alone."""
    fields = _stat(os.getpid(), os.getpid())
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK") if fields else 0.0


def machine_cpu() -> tuple[float, float]:
    """(busy, total) jiffies of the whole machine, from /proc/stat."""
    with open("/proc/stat") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return sum(values) - idle, sum(values)


class Meter:
    """CPU seconds by group of processes (and this process's main thread) between start and stop."""

    def __init__(self, groups: dict[str, set[int]]) -> None:
        self.groups = groups
        self.wall = time.perf_counter()
        self.machine = machine_cpu()
        self.main = main_thread_cpu()
        self.cpu = {name: cpu_seconds(*pids) for name, pids in groups.items()}

    def stop(self) -> dict[str, float]:
        busy, total = machine_cpu()
        out = {name: cpu_seconds(*pids) - self.cpu[name] for name, pids in self.groups.items()}
        out["driver main thread"] = main_thread_cpu() - self.main
        out["_machine_busy"] = (busy - self.machine[0]) / max(1, total - self.machine[1])
        out["_wall"] = time.perf_counter() - self.wall
        return out


def groups_of(pool: NeMoGymPool, upstream_pid: int) -> dict[str, set[int]]:
    """This process, Ray's local head (everything under this process that is not an actor's), the
    actor processes, their Gym stacks, and the upstream."""
    table = process_table()
    me = os.getpid()
    actors = {int(w["pid"]) for w in pool.workers if w.get("pid")}
    stacks = descendants(actors, table) | stack_processes(actors)
    upstream = {upstream_pid} | descendants({upstream_pid}, table)
    ray_head = descendants({me}, table) - actors - stacks - upstream
    return {
        "driver": {me},
        "Ray local head": ray_head,
        "actors": actors,
        "Gym stacks": stacks,
        "upstream": upstream,
    }


# -- runs -----------------------------------------------------------------------------------------------


def make_tasks(n: int) -> list[Any]:
    base = list(NeMoGymTaskset(ENV))
    return [dataclasses.replace(base[i % len(base)], rollout_index=i // len(base)) for i in range(n)]


async def timed_run(
    pool: NeMoGymPool, n: int, endpoint: Endpoint, concurrency: int, groups: dict[str, set[int]]
) -> dict[str, Any]:
    errors: Counter[str] = Counter()
    calls = rewards = ok = 0
    tasks = make_tasks(n)
    done_before = [w["done"] for w in pool.workers]
    meter = Meter(groups)
    count = 0
    async for result in pool.run(tasks, endpoint, concurrency=concurrency):
        count += 1
        if result.error is not None:
            errors[result.error.type] += 1
        else:
            ok += 1
            calls += len(result.trace)
            rewards += result.reward or 0.0
    cpu = meter.stop()
    seconds = cpu.pop("_wall")
    busy = cpu.pop("_machine_busy")
    return {
        "rollouts": count,
        "concurrency": concurrency,
        "seconds": seconds,
        "rate": count / seconds if seconds > 0 else float("nan"),
        "errors": dict(errors),
        "calls_per_rollout": calls / ok if ok else float("nan"),
        "reward_mean": rewards / ok if ok else float("nan"),
        "machine_busy": busy,
        "cores": sum(secs for name, secs in cpu.items() if name != "driver main thread") / seconds,
        "per_worker": [w["done"] - d for w, d in zip(pool.workers, done_before, strict=True)],
        "cpu_ms_per_result": {name: secs * 1000 / max(1, count) for name, secs in cpu.items()},
    }


def remember(seen: dict[int, int], pids: set[int]) -> None:
    """Note ``pids`` with their start times (a pid reused later by another process is not ours)."""
    for pid in pids:
        fields = _stat(pid)
        if fields is not None:
            seen.setdefault(pid, int(fields[19]))


async def bench_actors(k: int, args: argparse.Namespace, port: int, upstream_pid: int, seen: dict[int, int]) -> dict:
    slow = Endpoint(base_url=f"http://{HOST}:{port}/lat{args.latency_ms}/v1", model=MODEL)
    fast = Endpoint(base_url=f"http://{HOST}:{port}/v1", model=MODEL)
    pool = NeMoGymPool(ENV, ray=True, workers=k, cpus_per_stack=1)
    out: dict[str, Any] = {"actors": k}
    try:
        started = time.perf_counter()
        await pool.astart()
        out["start_s"] = time.perf_counter() - started
        out["worker_start_s"] = [w.get("start_s") for w in pool.workers]
        out["workers_pids"] = [w.get("pid") for w in pool.workers]
        groups = groups_of(pool, upstream_pid)
        remember(seen, groups["Ray local head"] | groups["actors"] | groups["Gym stacks"])
        out["processes"] = {name: len(pids) for name, pids in groups.items()}
        print(
            f"  k={k}: {k} actor(s) up in {out['start_s']:.1f}s (each stack: "
            + ", ".join(f"{s:.1f}s" for s in out["worker_start_s"] if s is not None)
            + f"); {len(groups['Gym stacks'])} Gym/Ray processes under the actors",
            flush=True,
        )

        concurrency = args.per_actor * k
        await timed_run(pool, 2 * concurrency, slow, concurrency, groups)  # warm-up: connections, imports
        meter = Meter(groups)  # idle: the pool up, nothing running (what every process costs regardless)
        await asyncio.sleep(args.idle_seconds)
        idle = meter.stop()
        wall = idle.pop("_wall")
        idle.pop("_machine_busy")
        out["idle_cores"] = {name: secs / wall for name, secs in idle.items()}
        waves = max(1, round(args.seconds / (2 * args.latency_ms / 1000)))  # a rollout: 2 calls of L
        out["slow"] = await timed_run(pool, waves * concurrency, slow, concurrency, groups)
        s = out["slow"]
        print(f"  k={k}: {s['rollouts']} rollouts at {concurrency} in flight, {args.latency_ms} ms upstream: "
              f"{s['rate']:.1f}/s ({s['seconds']:.1f}s, errors {sum(s['errors'].values())})", flush=True)  # fmt: skip

        fast_c = args.fast_per_actor * k
        groups = groups_of(pool, upstream_pid)
        remember(seen, groups["Ray local head"] | groups["actors"] | groups["Gym stacks"])
        out["fast"] = await timed_run(pool, args.fast_rollouts * k, fast, fast_c, groups)
        f = out["fast"]
        print(f"  k={k}: {f['rollouts']} rollouts at {fast_c} in flight, instant upstream: {f['rate']:.1f}/s, "
              f"driver {f['cpu_ms_per_result']['driver']:.2f} ms CPU/result", flush=True)  # fmt: skip
    finally:
        started = time.perf_counter()
        await pool.aclose()
        out["close_s"] = time.perf_counter() - started
    return out


def dispatch_cost(sizes: list[int], repeats: int = 500, rounds: int = 5) -> dict[int, float]:
    """Microseconds the pool spends choosing a worker and giving it back (``Seats.take``/``give_back``)
    with ``n`` live seats of one environment (best of ``rounds``: the machine's other load only ever adds)."""
    from verifiers_nemo._scale.seats import Seat, Seats

    out = {}
    for n in sizes:
        seats = Seats()
        for i in range(n):
            seats.add(Seat(SimpleNamespace(env=ENV, label="stub"), in_flight=i % 7))  # type: ignore[arg-type]
        best = float("inf")
        for _ in range(rounds):
            started = time.perf_counter()
            for _ in range(repeats):
                seat = seats.take()
                assert seat is not None
                seats.give_back(seat)
            best = min(best, (time.perf_counter() - started) / repeats * 1e6)
        out[n] = best
    return out


# -- report ---------------------------------------------------------------------------------------------


def print_report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    runs = figures["runs"]
    L = args.latency_ms / 1000
    print(f"\n[1] Throughput vs Ray actors, {ENV}, {args.latency_ms} ms upstream, {args.per_actor} rollouts in flight "
          f"per actor (one local Ray cluster, {os.cpu_count()} CPUs)")  # fmt: skip
    head = ("actors", "in flight", "rollouts", "m", "rollouts/s", "ideal", "efficiency", "vs k=1", "ideal vs k=1",
            "start s", "close s", "our cores", "machine busy", "errors")  # fmt: skip
    fmt = "{:>6}  {:>9}  {:>8}  {:>4}  {:>10}  {:>7}  {:>10}  {:>6}  {:>12}  {:>7}  {:>7}  {:>9}  {:>12}  {:>6}"
    print(fmt.format(*head))
    base = runs[0]["slow"]["rate"] if runs else float("nan")
    base_k = runs[0]["actors"] if runs else 1
    for r in runs:
        s = r["slow"]
        m = s["calls_per_rollout"]
        ideal = r["actors"] * args.per_actor / (m * L)
        s["ideal"] = ideal
        print(fmt.format(r["actors"], s["concurrency"], s["rollouts"], f"{m:.1f}", f"{s['rate']:.1f}", f"{ideal:.1f}",
                         f"{s['rate'] / ideal:.0%}", f"{s['rate'] / base:.2f}x", f"{r['actors'] / base_k:.2f}x",
                         f"{r['start_s']:.1f}", f"{r['close_s']:.1f}", f"{s['cores']:.2f}",
                         f"{s['machine_busy']:.0%}",
                         sum(s["errors"].values())))  # fmt: skip
    print(f"  ideal = k x P / (m x L): P = {args.per_actor} in flight per actor, m = policy calls per rollout (from "
          f"the traces), L = {args.latency_ms} ms; the gap to it at k = 1 is the Gym stack's own time per rollout "
          "(agent, resources server, proxy), not the pool's")  # fmt: skip
    print("  start s: pool.astart() wall time, all actors' stacks started at once (each starts its own Ray head);"
          " close s: pool.aclose(); our cores: CPU seconds a second of every process of this run; machine busy:"
          " share of all CPUs in use, other users' processes included")  # fmt: skip

    print(f"\n[2] Driver CPU per result, instant upstream ({args.fast_per_actor} in flight per actor; ms CPU per "
          "result, by process group)")  # fmt: skip
    groups = ["driver", "driver main thread", "Ray local head", "actors", "Gym stacks", "upstream"]
    fmt2 = "{:>6}  {:>8}  {:>10}  {:>7}  {:>18}  {:>14}  {:>7}  {:>10}  {:>8}  {:>12}  {}"
    print(fmt2.format("actors", "rollouts", "results/s", "driver", "driver main thread", "Ray local head",
                      "actors", "Gym stacks", "upstream", "machine busy", "results per actor"))  # fmt: skip
    for r in runs:
        f, c = r["fast"], r["fast"]["cpu_ms_per_result"]
        print(fmt2.format(r["actors"], f["rollouts"], f"{f['rate']:.1f}", *(f"{c[g]:.2f}" for g in groups),
                          f"{f['machine_busy']:.0%}", "/".join(map(str, f["per_worker"]))))  # fmt: skip
    print("  same, against the slow upstream (the timed runs of [1]):")
    for r in runs:
        s, c = r["slow"], r["slow"]["cpu_ms_per_result"]
        print(fmt2.format(r["actors"], s["rollouts"], f"{s['rate']:.1f}", *(f"{c[g]:.2f}" for g in groups),
                          f"{s['machine_busy']:.0%}", "/".join(map(str, s["per_worker"]))))  # fmt: skip
    print(f"  idle, the pool up and nothing running ({args.idle_seconds:.0f} s; % of a core):")
    for r in runs:
        c = r["idle_cores"]
        print(fmt2.format(r["actors"], "", "", *(f"{c[g]:.1%}" for g in groups), "", ""))
    print("  net of idle (ms CPU a result once the idle cost over the run's seconds is taken off), instant upstream:")
    for r in runs:
        f = r["fast"]
        net = {g: f["cpu_ms_per_result"][g] - r["idle_cores"][g] * f["seconds"] * 1000 / f["rollouts"] for g in groups}
        f["net_ms_per_result"] = net
        print(fmt2.format(r["actors"], f["rollouts"], f"{f['rate']:.1f}", *(f"{net[g]:.2f}" for g in groups), "", ""))
    print("  driver = this process, all threads (asyncio loop + Ray core worker); main thread = the loop alone;")
    print("  Ray local head = gcs_server, raylet, idle Ray workers (here only because the cluster is local)")

    dc = figures["dispatch_us"]
    print("\n[3] Choosing a worker (Seats.take + give_back, seats bucketed by load), µs per rollout by seats: "
          + ", ".join(f"{n}: {us:.1f}" for n, us in dc.items()))  # fmt: skip

    if runs:
        top = runs[-1]
        drv = top["fast"]["cpu_ms_per_result"]["driver"]
        loop = top["fast"]["cpu_ms_per_result"]["driver main thread"]
        growth = drv / runs[0]["fast"]["cpu_ms_per_result"]["driver"]
        scan = max(0.0, dc.get(1000, 0.0) - dc.get(top["actors"], 0.0)) / 1000  # ms more a result at 1,000 seats
        loop_1000 = loop + scan
        per_actor_slow = top["slow"]["rate"] / top["actors"]
        per_actor_fast = runs[0]["fast"]["rate"] / runs[0]["actors"]
        print(f"\n[4] On paper: 1,000 actors, one driver. From k = {top['actors']} (instant upstream): "
              f"{drv:.2f} ms driver CPU a result, of which {loop:.2f} ms on the event loop (k = {top['actors']} "
              f"vs k = {runs[0]['actors']}: {growth:.2f}x a result); at 1,000 seats the worker choice adds "
              f"{scan * 1000:.0f} µs, so {loop_1000:.2f} ms of loop a result; net of idle: "
              f"{top['fast']['net_ms_per_result']['driver']:.2f} ms driver, "
              f"{top['fast']['net_ms_per_result']['driver main thread']:.2f} ms loop. Gross figures below: "
              "a driver's idle cost need not stay flat with 1,000 actors")  # fmt: skip
        print(f"  one event loop (one thread) tops out at 1000 / {loop_1000:.2f} = {1000 / loop_1000:,.0f} "
              f"results/s; the driver's other threads (Ray's) spread over cores; driver CPU needed = {drv:.2f} ms "
              "x rate")  # fmt: skip
        fmt4 = "  {:<58}  {:>10}  {:>12}  {:>15}  {:>22}"
        print(fmt4.format("per-actor rate (rollouts/s)", "cluster /s", "driver cores", "event loop busy",
                          "actors one loop feeds"))  # fmt: skip
        scenarios = [
            (f"{per_actor_slow:.1f}: this run's, {args.per_actor} in flight at {args.latency_ms} ms", per_actor_slow),
            (f"{per_actor_fast:.1f}: a stack's CPU-bound rate here (instant upstream)", per_actor_fast),
            ("10", 10.0),
            ("1 (e.g. 32 in flight, 30 s a rollout)", 1.0),
        ]
        figures["extrapolation"] = {"driver_ms": drv, "loop_ms": loop, "loop_ms_at_1000": loop_1000, "rows": []}
        for label, rate in scenarios:
            cluster = 1000 * rate
            row = {"label": label, "per_actor": rate, "cluster": cluster, "driver_cores": cluster * drv / 1000,
                   "loop_busy": cluster * loop_1000 / 1000, "actors_per_loop": 1000 / loop_1000 / rate}  # fmt: skip
            figures["extrapolation"]["rows"].append(row)
            print(fmt4.format(label, f"{cluster:,.0f}", f"{row['driver_cores']:.2f}", f"{row['loop_busy']:.0%}",
                              f"{row['actors_per_loop']:,.0f}"))  # fmt: skip
        print("  linear in the rate (the driver's cost is per result); event loop busy over 100%: one driver "
              "cannot keep up, and results queue in Ray until it does")  # fmt: skip

    print(f"\n[5] Clean-up: {figures['cleanup']}")


# -- main -----------------------------------------------------------------------------------------------


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import ray

    actors = [int(a) for a in args.actors.split(",") if a]
    figures: dict[str, Any] = {"load": [os.getloadavg()[0]], "args": vars(args) | {"json": None}, "runs": []}
    figures["dispatch_us"] = dispatch_cost(sorted({1, *actors, 10, 100, 1000}))
    upstream: subprocess.Popen[str] | None = None
    seen: dict[int, int] = {}
    began = time.perf_counter()
    try:
        upstream, port = spawn_upstream()
        started = time.perf_counter()
        # address="local": a new cluster, never the one /tmp/ray/ray_current_cluster names (another user's)
        ray.init(address="local", num_cpus=max(actors) + 2, include_dashboard=False, _node_ip_address=HOST,
                 log_to_driver=False, logging_level="ERROR")  # fmt: skip
        figures["ray_init_s"] = time.perf_counter() - started
        print(f"Ray: local cluster up in {figures['ray_init_s']:.1f}s; upstream on port {port}", flush=True)
        for k in actors:
            figures["runs"].append(await bench_actors(k, args, port, upstream.pid, seen))
    finally:
        remember(seen, descendants({os.getpid()}, process_table()) - ({upstream.pid} if upstream else set()))
        if ray.is_initialized():
            ray.shutdown()
        if upstream is not None:
            stop_upstream(upstream)
        figures["cleanup"], figures["cleanup_left"] = check_cleanup(seen)
    figures["total_s"] = time.perf_counter() - began
    figures["load"].append(os.getloadavg()[0])
    return figures


def check_cleanup(seen: dict[int, int], wait_s: float = 30.0) -> tuple[str, list[int]]:
    """Every process seen under this one during the run must be gone (same pid and start time)."""
    deadline = time.monotonic() + wait_s
    while True:
        now = process_table()
        left = sorted(pid for pid, start in seen.items() if pid in now and now[pid][1] == start)
        left = [pid for pid in left if pid != os.getpid()]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    ng_run = subprocess.run(["pgrep", "-f", "ng_run"], capture_output=True, text=True).stdout.split()
    ng_run = [p for p in ng_run if int(p) != os.getpid()]
    ours = f"{len(seen)} processes seen under this one (actors, Gym stacks, their Ray heads, Ray's local head)"
    verdict = "all gone" if not left else f"{len(left)} STILL ALIVE: {left[:20]}"
    mine_left = [p for p in ng_run if int(p) in seen]
    others = f"pgrep -f ng_run: {'none' if not ng_run else ' '.join(ng_run)}"
    if ng_run:
        others += f" ({len(mine_left)} of them from this run; the rest are other users')"
    return f"{ours}: {verdict}; {others}", left


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--actors", default="1,2,4", help="actor counts, comma-separated (one pool each, in order)")
    parser.add_argument("--per-actor", type=int, default=2, help="rollouts in flight per actor against the slow route")
    parser.add_argument("--latency-ms", type=int, default=200, help="the slow route's latency per policy call")
    parser.add_argument("--seconds", type=float, default=15.0, help="about how long each timed slow run lasts")
    parser.add_argument("--fast-rollouts", type=int, default=400, help="rollouts per actor against the instant route")
    parser.add_argument("--fast-per-actor", type=int, default=16, help="in flight per actor, instant route")
    parser.add_argument("--idle-seconds", type=float, default=5.0, help="idle CPU measured for this long per k")
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke test, not figures to quote")
    add_json_flag(parser)
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.fast_rollouts = min(args.seconds, 5.0), min(args.fast_rollouts, 150)
        args.idle_seconds = min(args.idle_seconds, 3.0)
    figures = asyncio.run(run(args))
    print_report(figures, args)
    print(f"\n(total {figures['total_s']:.0f} s; load average {figures['load'][0]:.1f} before, "
          f"{figures['load'][1]:.1f} after)")  # fmt: skip
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
