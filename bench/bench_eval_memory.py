"""Benchmark: the eval process's peak memory, throughput and CPU per rollout as a run grows (issue 37).

    .venv/bin/python bench/bench_eval_memory.py                       # 2k / 10k / 20k / 200k here, 10k / 200k --ray
    .venv/bin/python bench/bench_eval_memory.py --sizes 2000,20000 --ray-sizes 10000
    .venv/bin/python bench/bench_eval_memory.py --before-python /work/main/.venv/bin/python --before-sizes 2000,10000

Each run is ``verifiers-nemo eval ENV -n 5 -r R -c 64 -s`` with the replay policy (the recorded rollouts
answer: no model, no GPU), as a user types it, in a fresh process of its own (``_eval_process.py`` runs the
CLI's ``main`` and, at exit, writes the process's peak RSS, ``VmHWM``, and CPU seconds). ``--ray`` runs add
``--ray local --workers 1`` (one Ray actor owns the Gym stack; the eval process is Ray's driver). The runs go
one after the other, smallest first, so the figures of one table come from one session of the machine.

Per run: peak RSS of the eval process; its growth over the smallest run of the same code and mode (the
figure issue 37 bounds: at most 16 MB from 2,000 to 20,000 rollouts); rollouts/s over the rollouts phase
(``metadata.json``'s timing); the eval process's CPU per rollout from its first saved result to its exit (so
the imports and the stack start are not in it); and that every rollout was saved and scored (lines of
``results.jsonl``, the summary's scored count and the replay verdict).

``--before-python`` runs the same commands with another interpreter's ``verifiers_nemo`` (e.g. main's
``.venv``, a checkout from before the streaming eval) for a before/after table in the same session.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from _common import add_json_flag, cpu_seconds, write_json

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
GROWTH_LIMIT_MB = 16.0
"""Issue 37: from 2,000 to 20,000 rollouts of one eval the peak RSS grows by at most this much."""


@dataclass
class Run:
    code: str
    mode: str
    rollouts: int
    peak_mb: float = 0.0
    rollouts_per_s: float | None = None
    cpu_ms_per_rollout: float | None = None
    cpu_s: float = 0.0
    wall_s: float = 0.0
    saved: int = 0
    scored: int = 0
    reproduced: str = ""
    errors: dict[str, int] | None = None
    module: str = ""
    """Where the ``verifiers_nemo`` that ran was imported from."""
    exit_code: int = 0


def _lines(path: Path) -> int:
    if not path.exists():
        return 0
    with open(path, "rb") as handle:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: handle.read(1 << 20), b""))


def run_eval(python: str, code: str, mode: str, rollouts: int, env: str, examples: int, concurrency: int) -> Run:
    """One eval in a fresh process; its figures."""
    work = Path(tempfile.mkdtemp(prefix="bench_eval_memory_"))
    stats = work / "stats.json"
    out = work / "out"
    args = [env, "-n", str(examples), "-r", str(rollouts // examples), "-c", str(concurrency), "-s", "-o", str(out)]
    if mode == "ray":
        args += ["--ray", "local", "--workers", "1"]
    run = Run(code, mode, rollouts)
    try:
        started = time.monotonic()
        with open(work / "output.txt", "wb") as output:
            proc = subprocess.Popen(
                [python, str(BENCH / "_eval_process.py"), "eval", *args],
                cwd=work,
                env=dict(os.environ, BENCH_EVAL_STATS=str(stats)),
                stdout=output,
                stderr=subprocess.STDOUT,
            )
        cpu_at_first: float | None = None
        while proc.poll() is None:
            if cpu_at_first is None and any(p.stat().st_size for p in out.glob("*/*/results.jsonl")):
                cpu_at_first = cpu_seconds(proc.pid)
            time.sleep(0.2)
        run.exit_code = proc.wait()
        run.wall_s = time.monotonic() - started
        if run.exit_code:
            print((work / "output.txt").read_text(errors="replace")[-3000:], file=sys.stderr)
        figures = json.loads(stats.read_text())
        run.peak_mb = figures["vm_hwm_kb"] / 1024
        run.cpu_s = figures["cpu_s"]
        run.module = figures.get("module", "")
        (folder,) = [p.parent for p in out.glob("*/*/metadata.json")]
        run.saved = _lines(folder / "results.jsonl")
        metadata = json.loads((folder / "metadata.json").read_text())
        summary = metadata["summary"]
        run.scored = summary["rollouts"]["scored"]
        run.errors = summary.get("errors_by_type") or {}
        run.rollouts_per_s = summary["timing"].get("rollouts_per_s")
        replay = summary.get("replay") or {}
        run.reproduced = f"{replay.get('reproduced')}/{replay.get('compared')}"
        if cpu_at_first is not None and run.saved > 1:
            run.cpu_ms_per_rollout = (run.cpu_s - cpu_at_first) / (run.saved - 1) * 1000
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return run


def print_table(runs: list[Run]) -> None:
    head = f"{'code':<8} {'mode':<6} {'rollouts':>9} {'peak RSS MB':>12} {'growth MB':>10} {'rollouts/s':>11}"
    head += f" {'CPU ms/rollout':>15} {'wall s':>8}  saved / scored / replay"
    print(head)
    print("-" * len(head))
    for run in runs:
        base = next(r for r in runs if r.code == run.code and r.mode == run.mode)
        rate = f"{run.rollouts_per_s:.1f}" if run.rollouts_per_s else "n/a"
        cpu = f"{run.cpu_ms_per_rollout:.2f}" if run.cpu_ms_per_rollout is not None else "n/a"
        print(
            f"{run.code:<8} {run.mode:<6} {run.rollouts:>9,} {run.peak_mb:>12.1f} {run.peak_mb - base.peak_mb:>+10.1f} "
            f"{rate:>11} {cpu:>15} {run.wall_s:>8.0f}  {run.saved:,} / {run.scored:,} / {run.reproduced}"
            + (f"  errors {run.errors}" if run.errors else "")
            + (f"  (exit {run.exit_code})" if run.exit_code else "")
        )


def growth_check(runs: list[Run], code: str = "after") -> dict[str, Any] | None:
    """Issue 37's bound: the peak RSS growth from 2,000 to 20,000 rollouts (local), when both were run."""
    by_size = {r.rollouts: r for r in runs if r.code == code and r.mode == "local"}
    if 2000 not in by_size or 20000 not in by_size:
        return None
    growth = by_size[20000].peak_mb - by_size[2000].peak_mb
    complete = all(by_size[n].saved == n and by_size[n].scored == n for n in (2000, 20000))
    return {"growth_mb": growth, "limit_mb": GROWTH_LIMIT_MB, "complete": complete}


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="example_single_tool_call")
    parser.add_argument("--examples", type=int, default=5, help="-n (the replay policy has 5 recordings an env)")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--sizes", default="2000,10000,20000,200000", help="rollouts of the local runs")
    parser.add_argument("--ray-sizes", default="10000,200000", help="rollouts of the --ray runs ('' for none)")
    parser.add_argument("--before-python", help="an interpreter whose verifiers_nemo is the 'before' code")
    parser.add_argument("--before-sizes", default="2000,10000,20000")
    add_json_flag(parser)
    args = parser.parse_args()

    plan: list[tuple[str, str, str, int]] = []
    if args.before_python:
        plan += [(args.before_python, "before", "local", n) for n in _sizes(args.before_sizes)]
    plan += [(sys.executable, "after", "local", n) for n in _sizes(args.sizes)]
    plan += [(sys.executable, "after", "ray", n) for n in _sizes(args.ray_sizes)]
    load = os.getloadavg()[0]
    print(
        f"{args.env}, replay policy, -n {args.examples} -c {args.concurrency} -s; {os.cpu_count()} CPUs, "
        f"load average {load:.1f}; {len(plan)} runs, one after the other\n"
    )
    runs: list[Run] = []
    for python, code, mode, size in plan:
        run = run_eval(python, code, mode, size, args.env, args.examples, args.concurrency)
        runs.append(run)
        print(f"  {code} {mode} {size:,}: peak {run.peak_mb:.1f} MB, {run.wall_s:.0f} s ({run.module})", flush=True)
    print()
    print_table(runs)
    check = growth_check(runs)
    if check is not None:
        verdict = "met" if check["growth_mb"] <= GROWTH_LIMIT_MB and check["complete"] else "NOT MET"
        print(
            f"\npeak RSS growth from 2,000 to 20,000 rollouts (after, local): {check['growth_mb']:+.1f} MB "
            f"(target <= {GROWTH_LIMIT_MB:.0f} MB, every rollout saved and scored): {verdict}"
        )
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    write_json(args.json, {"runs": [asdict(r) for r in runs], "growth": check, "load": [load, os.getloadavg()[0]]})


if __name__ == "__main__":
    main()
