"""Run every benchmark under bench/ and print one summary table with the targets of issue 7.

    .venv/bin/python bench/run_all.py            # everything, ~21 minutes on 2 CPUs (bench_ray 3.5, eval_memory 6)
    .venv/bin/python bench/run_all.py --quick    # a smoke run with small counts (about 8 minutes; bench_ray: 2.5-3)
    .venv/bin/python bench/run_all.py --only throughput,proxy --all-envs

Each benchmark runs as its own subprocess, one after the other, and its own tables are shown as they
come; each writes its figures to a JSON file (``--json PATH``), read back here and printed together.
Nothing here is a hard-coded figure: every number in the summary comes from this run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import pct

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent


@dataclass
class Step:
    name: str
    script: str
    full: list[str]
    quick: list[str]


STEPS = [
    Step(
        "throughput",
        "bench_throughput.py",
        [],
        [
            "--concurrency",
            "1,64",
            "--scaling-max",
            "64",
            "--memory",
            "256",
            "--latency-samples",
            "30",
            "--slow-concurrency",
            "64",
            "--repeats",
            "1",
        ],
    ),
    Step(
        "proxy",
        "bench_proxy.py",
        ["--requests", "4000", "--rounds", "2", "--paced-seconds", "4"],
        ["--requests", "1000", "--rounds", "2", "--paced-seconds", "2"],
    ),
    Step("stack", "bench_stack.py", ["--repeats", "1"], ["--repeats", "1"]),
    Step("start_profile", "bench_start_profile.py", ["--repeats", "2"], ["--repeats", "1"]),
    Step("taskset", "bench_taskset.py", [], ["--rows", "100000"]),
    Step("ray", "bench_ray.py", ["--actors", "1,2,4"], ["--actors", "1,2,4", "--quick"]),
    Step("shared_ray", "bench_shared_ray.py", ["--repeats", "2"], ["--repeats", "1"]),
    Step("warm_start", "bench_warm_start.py", ["--repeats", "2"], ["--repeats", "1"]),
    Step(
        "eval_memory",
        "bench_eval_memory.py",
        ["--sizes", "2000,20000", "--ray-sizes", "10000"],
        ["--sizes", "500,2000", "--ray-sizes", ""],
    ),
    Step(
        "report_memory",
        "bench_report.py",
        ["--sizes", "2000,20000", "--shapes", "repeats"],
        ["--sizes", "500,2000", "--shapes", "repeats", "--no-export"],
    ),
]
EVAL_MEMORY_TARGET_MB = 16.0
"""Issue 37: from 2,000 to 20,000 rollouts of one eval the peak RSS grows by at most this much."""
SHARED_RAY_TARGETS = {  # the machine's shared Ray head (issue 30), quiet 2-core machine, example_multi_step
    "0.4": {"first_s": 7.0, "later_s": 4.0, "added_processes": 12, "added_pss_mib": 512},
    "0.7": {"first_s": 9.0, "later_s": 6.0},
}
WARM_START_TARGETS = {"first_s": 0.4, "mix_s": 0.2}
"""Issue 44 (quiet 2-core machine, both releases): warm / plain for a first stack and the 8-environment mix; and
what a later process's stack adds to the machine, at most ``WARM_START_ADDED_PSS_MIB``."""
WARM_START_ADDED_PSS_MIB = 150.0
EXTRA_ENVS = "example_single_tool_call,example_multi_step,example_session_state_mgmt"


def run_step(step: Step, argv: list[str]) -> tuple[int, float]:
    """Run one benchmark, echoing its output live; returns (exit code, seconds)."""
    print(f"\n{'=' * 100}\n>>> {step.script} {' '.join(argv)}", flush=True)
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(BENCH / step.script), *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        print(line, end="", flush=True)
    code = proc.wait()
    return code, time.monotonic() - started


# -- the summary ------------------------------------------------------------------------------------------


class Table:
    def __init__(self) -> None:
        self.rows: list[tuple[str, ...]] = []

    def add(self, measure: str, ours: str, reference: str = "", ratio: str = "", target: str = "", verdict: str = ""):
        self.rows.append((measure, ours, reference, ratio, target, verdict))

    def section(self, title: str) -> None:
        self.rows.append((f"-- {title}", "", "", "", "", ""))

    def print(self) -> None:
        head = ("measure", "ours", "stock / reference", "ratio", "target", "")
        widths = [max(len(r[i]) for r in [head, *self.rows]) for i in range(6)]
        widths[0] = max(len(r[0]) for r in [head, *self.rows] if not r[0].startswith("-- "))
        fmt = "  ".join(f"{{:<{w}}}" if i in (0, 4, 5) else f"{{:>{w}}}" for i, w in enumerate(widths))
        print(fmt.format(*head))
        print("-" * (sum(widths) + 10))
        for row in self.rows:
            print(row[0] if row[0].startswith("-- ") else fmt.format(*row))


def met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


def summarize(results: dict[str, Any], load: tuple[float, float], durations: dict[str, float]) -> None:
    t = Table()
    tp = results.get("throughput")
    if isinstance(tp, dict):
        for env, out in tp["envs"].items():
            t.section(f"rollout throughput, {env}, instant upstream (rollouts/s; harness vs ng_collect_rollouts)")
            for r in out["throughput"]:
                c = r["concurrency"]
                ratio = r["ours"] / r["stock"] if r["stock"] > 0 else float("nan")
                target = {64: 1.0, 1024: 0.9}.get(c)
                ours_cpu, stock_cpu = sum(r["ours_cpu_ms"].values()), sum(r["stock_cpu_ms"].values())
                runs = "/".join(f"{x:.2f}" for x in r.get("ratio_runs", []))
                t.add(
                    f"c={c} ({r['rollouts']} rollouts, errors {r['ours_errors']}/{r['stock_errors']}; runs {runs})",
                    f"{r['ours']:.1f}",
                    f"{r['stock']:.1f}",
                    f"{ratio:.2f}x",
                    f">= {target:.1f}x" if target else "",
                    met(ratio >= target) if target else "",
                )
                t.add(
                    f"  CPU ms per rollout, all processes, c={c}",
                    f"{ours_cpu:.1f}",
                    f"{stock_cpu:.1f}",
                    f"{stock_cpu / ours_cpu:.2f}x" if ours_cpu else "",
                )
            slow = out.get("throughput_slow")
            if slow:
                t.section(f"rollout throughput, {env}, 200 ms upstream (rollouts/s; harness vs ng_collect_rollouts)")
                for r in slow:
                    ratio = r["ours"] / r["stock"] if r["stock"] > 0 else float("nan")
                    errors = f"errors {r['ours_errors']}/{r['stock_errors']}"
                    t.add(
                        f"c={r['concurrency']} ({r['rollouts']} rollouts, {errors})",
                        f"{r['ours']:.1f}",
                        f"{r['stock']:.1f}",
                        f"{ratio:.2f}x",
                    )
            lat = out.get("latency_ms")
            if lat:
                h, d, s = lat["harness"], lat["direct_ours"], lat["direct_stock"]
                t.section(f"latency per rollout at concurrency 1, {env} (ms, p50 / p99)")
                t.add("harness.rollout() vs direct /run on our stack (floor)",
                      f"{pct(h, .5):.1f} / {pct(h, .99):.1f}", f"{pct(d, .5):.1f} / {pct(d, .99):.1f}",
                      f"+{pct(h, .5) - pct(d, .5):.1f} / +{pct(h, .99) - pct(d, .99):.1f}")  # fmt: skip
                t.add("direct /run on the stock stack (via openai_model)", "",
                      f"{pct(s, .5):.1f} / {pct(s, .99):.1f}")  # fmt: skip
            mem = out.get("memory")
            if mem:
                idle = mem[0]
                t.section(f"memory, {env}, 200 ms upstream (RSS; harness process = harness + proxy)")
                t.add("harness process RSS idle (MB)", f"{idle['rss'] / 1e6:.0f}")
                t.add("Gym stack RSS idle (MB)", f"{idle['stack_rss'] / 1e6:.0f}",
                      f"{out.get('stock_stack_rss_idle', 0) / 1e6:.0f}")  # fmt: skip
                for m in mem[1:]:
                    per = (m["rss"] - idle["rss"]) / 1e6 / m["target"] * 1000
                    t.add(f"{m['target']:,} rollouts at once: in flight / errors",
                          f"{m['in_flight']} / {m['errors']}", "", "", "0 errors", met(m["errors"] == 0))  # fmt: skip
                    t.add(f"  extra harness MB per 1,000 in flight ({m['target']:,})", f"{per:.1f}", "", "",
                          "< 50 MB", met(per < 50))  # fmt: skip
                    t.add(f"  stack RSS at {m['target']:,} in flight (MB)", f"{m['stack_rss'] / 1e6:.0f}")
            scaling = out.get("scaling")
            if scaling:
                best = max(scaling, key=lambda s: s["ours"])
                knee = next(s for s in scaling if s["ours"] >= 0.9 * best["ours"])
                t.section(f"scaling, {env}, harness (see the chart above)")
                t.add("peak rollouts/s (at concurrency)", f"{best['ours']:.1f} (c={best['concurrency']})")
                t.add("knee: first concurrency within 90% of the peak", f"c={knee['concurrency']}")
                last = scaling[-1]
                t.add(f"at c={last['concurrency']}", f"{last['ours']:.1f}", "", f"{last['ours'] / best['ours']:.2f}x")
    elif tp is not None:
        t.section("rollout throughput")
        t.add("bench_throughput.py", tp)

    px = results.get("proxy")
    if isinstance(px, dict):
        t.section("proxy added latency per policy call (ms, p50 / p99; via proxy minus direct)")
        for label, r in px["rows"].items():
            added = f"+{float(r['a50']):.2f} / +{float(r['a99']):.2f}"
            direct = f"direct {float(r['d50']):.2f} / {float(r['d99']):.2f}"
            t.add(f"callers: {label}", added, direct, "", "", f"{r['cpu']} us CPU/call")
        if px["routes_mb"]:
            t.add("proxy RSS for 4,096 open routes (+MB)", f"+{px['routes_mb']}")
            t.add("  + one recorded call on each (+MB)", f"+{px['calls_mb']}")
    elif px is not None:
        t.section("proxy")
        t.add("bench_proxy.py", px)

    st = results.get("stack")
    if isinstance(st, dict):
        t.section("stack start to ready (s), GymStack vs stock ng_run")
        labels = {
            "warm": "warm start (first stack: starts the Ray head)",
            "joined": "warm start, Ray head already up (restart, 2nd env)",
            "own Ray": "warm start, ng_run's own Ray (shared_ray=False)",
            "cold": "cold start",
        }
        for kind, label in labels.items():
            if kind in st:
                ours, stock = st[kind]["ours"], st[kind]["stock"]
                target = ("< 10 s", met(ours < 10)) if kind == "warm" else ("", "")
                t.add(label, f"{ours:.1f}", f"{stock:.1f}", f"{stock / ours:.2f}x faster", *target)
    elif st is not None:
        t.section("stack start")
        t.add("bench_stack.py", st)

    sp = results.get("start_profile")
    if isinstance(sp, dict) and sp:
        t.section("what a warm start spends its time on (bench_start_profile.py, median)")
        for label, (secs, share) in sp.items():
            t.add(label, f"{secs:.2f} s", "", f"{share:.0f}%" if share is not None else "")
    elif sp is not None:
        t.section("start profile")
        t.add("bench_start_profile.py", str(sp))

    ts = results.get("taskset")
    if isinstance(ts, dict):
        t.section(f"taskset load, {ts['rows']} rows ({ts['mb']} MB JSONL)")
        for case, r in ts["cases"].items():
            t.add(case, f"{r['secs']} s", "", "", "", f"peak {r['peak']} MB (+{r['added']})")
    elif ts is not None:
        t.section("taskset")
        t.add("bench_taskset.py", ts)

    ry = results.get("ray")
    if isinstance(ry, dict) and ry.get("runs"):
        first = ry["runs"][0]
        t.section(f"Ray actors, {ry['args']['latency_ms']} ms upstream, {ry['args']['per_actor']} in flight per actor "
                  "(rollouts/s; ideal k x P / (m x L))")  # fmt: skip
        for r in ry["runs"]:
            s = r["slow"]
            t.add(f"{r['actors']} actor(s) (start {r['start_s']:.1f} s, errors {sum(s['errors'].values())})",
                  f"{s['rate']:.1f}", f"ideal {s['ideal']:.1f}", f"{s['rate'] / first['slow']['rate']:.2f}x",
                  f"linear: {r['actors'] / first['actors']:.2f}x")  # fmt: skip
        t.section("Ray driver CPU per result, instant upstream (ms; all threads / event loop)")
        for r in ry["runs"]:
            c = r["fast"]["cpu_ms_per_result"]
            t.add(f"{r['actors']} actor(s), {r['fast']['rate']:.1f} results/s",
                  f"{c['driver']:.2f} / {c['driver main thread']:.2f}")  # fmt: skip
        ex = ry.get("extrapolation")
        if ex:
            t.add("one event loop's ceiling at 1,000 actors (results/s)", f"{1000 / ex['loop_ms_at_1000']:,.0f}")
        left = ry.get("cleanup_left", [])
        t.add("processes of the run left after clean-up", str(len(left)), "", "", "0", met(not left))
    elif ry is not None:
        t.section("Ray actors")
        t.add("bench_ray.py", str(ry))

    sr = results.get("shared_ray")
    if isinstance(sr, dict):
        t.section("one Ray head per machine vs per process (bench_shared_ray.py; ours = after, reference = before)")
        rows = {(r["release"], r["design"]): r for r in sr["rows"]}
        for release, targets in SHARED_RAY_TARGETS.items():
            after, before = rows.get((release, "after")), rows.get((release, "before"))
            if after is None or before is None:
                continue
            for key, label in (("first_s", "first stack, s"), ("later_s", "a later process's stack, s"),
                               ("added_processes", "processes an added stack starts"),
                               ("added_pss_mib", "PSS an added stack adds, MiB")):  # fmt: skip
                goal = targets.get(key)
                ratio = f"{before[key] / after[key]:.2f}x" if after[key] else ""
                target = (f"<= {goal:g}", met(after[key] <= goal)) if goal is not None else ("", "")
                t.add(f"nemo-gym {release}: {label}", f"{after[key]:.1f}", f"{before[key]:.1f}", ratio, *target)
    elif sr is not None:
        t.section("shared Ray head")
        t.add("bench_shared_ray.py", str(sr))

    ws = results.get("warm_start")
    if isinstance(ws, dict):
        t.section("Gym processes started warm vs plain (bench_warm_start.py; ours = warm, reference = plain)")
        rows = {(r["release"], r["design"]): r for r in ws["rows"]}
        for release in dict.fromkeys(r["release"] for r in ws["rows"]):
            warm, plain = rows.get((release, "warm")), rows.get((release, "plain"))
            if warm is None or plain is None:
                continue
            for key, label in (("first_s", "first stack, s"), ("first_cpu_s", "  its CPU-s to ready"),
                               ("later_s", "a later process's stack, s"), ("later_cpu_s", "  its CPU-s to ready"),
                               ("mix_s", "8-environment mix ready, s")):  # fmt: skip
                if key not in warm:
                    continue
                ratio = warm[key] / plain[key] if plain[key] else float("nan")
                goal = WARM_START_TARGETS.get(key)
                target = (f"<= {goal:g}x", met(ratio <= goal)) if goal is not None else ("", "")
                t.add(f"nemo-gym {release}: {label}", f"{warm[key]:.1f}", f"{plain[key]:.1f}", f"{ratio:.2f}x", *target)
            added = warm["later_added_pss_mib"]
            t.add(f"nemo-gym {release}: PSS a later stack adds, MiB", f"{added:.0f}",
                  f"{plain['later_added_pss_mib']:.0f}", "", f"<= {WARM_START_ADDED_PSS_MIB:g}",
                  met(added <= WARM_START_ADDED_PSS_MIB))  # fmt: skip
    elif ws is not None:
        t.section("warm start")
        t.add("bench_warm_start.py", str(ws))

    em = results.get("eval_memory")
    if isinstance(em, dict):
        t.section("eval process, replay policy, -n 5 -c 64 -s (bench_eval_memory.py; peak RSS, rollouts/s, CPU)")
        smallest: dict[tuple[str, str], float] = {}
        for r in em["runs"]:
            base = smallest.setdefault((r["code"], r["mode"]), r["peak_mb"])
            cpu = f"{r['cpu_ms_per_rollout']:.2f} ms CPU" if r["cpu_ms_per_rollout"] is not None else ""
            rate = f"{r['rollouts_per_s']:.1f}/s" if r["rollouts_per_s"] else "n/a"
            t.add(f"{r['code']} {r['mode']}, {r['rollouts']:,} rollouts (peak MB, growth)",
                  f"{r['peak_mb']:.1f}", f"{r['peak_mb'] - base:+.1f}", rate, cpu)  # fmt: skip
        growth = em.get("growth")
        if growth:
            ok = growth["growth_mb"] <= EVAL_MEMORY_TARGET_MB and growth["complete"]
            t.add("peak RSS growth, 2,000 -> 20,000 rollouts, all saved and scored (MB)",
                  f"{growth['growth_mb']:+.1f}", "", "", f"<= {EVAL_MEMORY_TARGET_MB:.0f} MB", met(ok))  # fmt: skip
    elif em is not None:
        t.section("eval memory")
        t.add("bench_eval_memory.py", str(em))

    rm = results.get("report_memory")
    if isinstance(rm, dict):
        t.section("report and export --inspect of a saved run, 100 tasks (bench_report.py; peak RSS, growth, wall)")
        for r in rm["runs"]:
            base = next(x for x in rm["runs"] if (x["code"], x["command"]) == (r["code"], r["command"]))
            t.add(f"{r['code']} {r['command']}, {r['rollouts']:,} rollouts (peak MB, growth, s)",
                  f"{r['peak_mb']:.1f}", f"{r['peak_mb'] - base['peak_mb']:+.1f}", f"{r['wall_s']:.1f}")  # fmt: skip
        growth = rm.get("growth")
        if growth:
            ok = growth["growth_mb"] <= growth["limit_mb"]
            t.add("report peak RSS growth, 2,000 -> 20,000 rollouts (MB)",
                  f"{growth['growth_mb']:+.1f}", "", "", f"<= {growth['limit_mb']:.0f} MB", met(ok))  # fmt: skip
    elif rm is not None:
        t.section("report memory")
        t.add("bench_report.py", str(rm))

    print(f"\n{'=' * 100}")
    print(
        f"SUMMARY ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, load average {load[0]:.1f} before, "
        f"{load[1]:.1f} after; {sum(durations.values()) / 60:.1f} minutes: "
        + ", ".join(f"{name} {secs / 60:.1f}" for name, secs in durations.items())
        + ")\n"
    )
    t.print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small counts: a smoke run, not figures to quote")
    parser.add_argument("--only", help=f"comma-separated subset of: {', '.join(s.name for s in STEPS)}")
    parser.add_argument(
        "--all-envs",
        action="store_true",
        help=f"throughput on {EXTRA_ENVS} (adds about 4 minutes; the first env also gets memory and scaling)",
    )
    args = parser.parse_args()
    wanted = set(args.only.split(",")) if args.only else {s.name for s in STEPS}
    unknown = wanted - {s.name for s in STEPS}
    if unknown:
        parser.error(f"unknown benchmark(s) {sorted(unknown)}; choose from {[s.name for s in STEPS]}")

    results: dict[str, Any] = {}
    durations: dict[str, float] = {}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_run_all_") as tmp:
        for step in STEPS:
            if step.name not in wanted:
                continue
            json_path = Path(tmp) / f"{step.name}.json"
            argv = [*(step.quick if args.quick else step.full), "--json", str(json_path)]
            if step.name == "throughput" and args.all_envs:
                argv += ["--envs", EXTRA_ENVS]
            code, durations[step.name] = run_step(step, argv)
            if code != 0:
                results[step.name] = f"failed (exit {code}); see its output above"
            else:
                results[step.name] = json.loads(json_path.read_text())
    summarize(results, (load_before, os.getloadavg()[0]), durations)
    failed = [name for name, r in results.items() if isinstance(r, str)]
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
