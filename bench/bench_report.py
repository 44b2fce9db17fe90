"""Benchmark: `verifiers-nemo report` and `verifiers-nemo export --inspect` as a run grows (issue 37): peak RSS,
wall and CPU time, and the size of what they write, this tree and (``--before REV``) another revision's code, side
by side in one session.

    .venv/bin/python bench/bench_report.py                                  # 2k / 20k / 200k rollouts, this tree
    .venv/bin/python bench/bench_report.py --before 9aa074e --before-sizes 2000,20000
    .venv/bin/python bench/bench_report.py --sizes 2000,20000 --shapes repeats --no-export

The runs: synthetic ``results.jsonl`` lines in the exact shape ``verifiers-nemo eval -s --save-trace`` writes
(``tests/unit/report_runs.py``: 1-3 tool calls a rollout with every policy call's request and reply, 3% typed
errors, 2% masked; ~12 KB a line), written once per size. Two shapes: ``repeats`` (``--tasks`` tasks, default 100,
with as many rollouts each as the size needs: what O(tasks) needs stays the same across sizes, so any growth is
per rollout) and ``generation`` (one rollout per task, a data-generation run: the tasks grow with the rollouts).

Each command runs as a user types it (``report RUN -o FILE``, ``export RUN --inspect -o FILE``) in a fresh
process of its own (``_eval_process.py`` runs the CLI's ``main`` and writes the process's ``VmHWM`` and CPU at
exit), the report with this tree's ``.venv``, the export with ``.venv-inspect`` (inspect-ai). ``--before REV``
unpacks ``git archive REV`` into a temporary folder and runs the same commands with its ``verifiers_nemo`` first
on ``PYTHONPATH``. The growth column is over the smallest size of the same code, command and shape; issue 37's
bound is the report's growth from 2,000 to 20,000 rollouts (``repeats``): at most 16 MB.
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

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from _common import add_json_flag, write_json  # noqa: E402

from tests.unit.report_runs import write_run  # noqa: E402

GROWTH_LIMIT_MB = 16.0
"""Issue 37: from 2,000 to 20,000 rollouts the report's peak RSS grows by at most this much."""
PYTHONS = {"report": ROOT / ".venv" / "bin" / "python", "export": ROOT / ".venv-inspect" / "bin" / "python"}


@dataclass
class Measure:
    code: str
    command: str
    shape: str
    rollouts: int
    tasks: int
    peak_mb: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    output_mb: float = 0.0
    note: str = ""
    """What the command said about the rollouts it shows (or why it failed)."""
    module: str = ""
    exit_code: int = 0


def make_run(work: Path, shape: str, rollouts: int, tasks: int) -> tuple[Path, int]:
    """A run folder of ``rollouts`` synthetic rollouts; its path and task count."""
    tasks = rollouts if shape == "generation" else tasks
    folder = work / f"run-{shape}-{rollouts}"
    if not folder.exists():
        started = time.monotonic()
        write_run(folder, tasks=tasks, repeats=rollouts // tasks, seed=rollouts)
        size = (folder / "results.jsonl").stat().st_size / 1e6
        print(f"  wrote {rollouts:,} rollouts ({tasks:,} tasks, {size:,.0f} MB) in {time.monotonic() - started:.0f}s")
    return folder, tasks


def measure(code: str, source: Path | None, command: str, shape: str, run: Path, rollouts: int, tasks: int) -> Measure:
    """One command in a fresh process; its figures."""
    work = Path(tempfile.mkdtemp(prefix="bench_report_"))
    stats, output = work / "stats.json", work / ("report.html" if command == "report" else "log.eval")
    argv = ["report", str(run), "-o", str(output)] if command == "report" else ["export", str(run), "--inspect"]
    if command == "export":
        argv += ["-o", str(output)]
    env = dict(os.environ, BENCH_EVAL_STATS=str(stats))
    if source is not None:
        env["PYTHONPATH"] = str(source)
    figures = Measure(code, command, shape, rollouts, tasks)
    try:
        started = time.monotonic()
        proc = subprocess.run(
            [str(PYTHONS[command]), str(BENCH / "_eval_process.py"), *argv],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=6 * 3600,
        )
        figures.wall_s = time.monotonic() - started
        figures.exit_code = proc.returncode
        said = [line for line in proc.stderr.splitlines() if "shows" in line or "samples are" in line]
        figures.note = said[0].split(" shows ", 1)[-1].split(" are ", 1)[-1][:40] if said else ""
        if proc.returncode:
            figures.note = proc.stderr.strip().splitlines()[-1][:120] if proc.stderr.strip() else "failed"
        if stats.exists():
            measured = json.loads(stats.read_text())
            figures.peak_mb = measured["vm_hwm_kb"] / 1024
            figures.cpu_s = measured["cpu_s"]
            figures.module = measured.get("module", "")
        if output.exists():
            figures.output_mb = output.stat().st_size / 1e6
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return figures


def print_table(rows: list[Measure]) -> None:
    head = (
        f"{'code':<7} {'command':<7} {'shape':<10} {'rollouts':>9} {'tasks':>8} {'peak RSS MB':>12} "
        f"{'growth MB':>10} {'wall s':>7} {'CPU s':>7} {'output MB':>10}  shown"
    )
    print(head)
    print("-" * len(head))
    for row in rows:
        base = next(r for r in rows if (r.code, r.command, r.shape) == (row.code, row.command, row.shape))
        print(
            f"{row.code:<7} {row.command:<7} {row.shape:<10} {row.rollouts:>9,} {row.tasks:>8,} {row.peak_mb:>12.1f} "
            f"{row.peak_mb - base.peak_mb:>+10.1f} {row.wall_s:>7.1f} {row.cpu_s:>7.1f} {row.output_mb:>10.1f}  "
            f"{row.note or 'all'}" + (f"  (exit {row.exit_code})" if row.exit_code else "")
        )


def growth_check(rows: list[Measure]) -> dict[str, float] | None:
    """Issue 37's bound on the report (this tree, ``repeats``), when 2,000 and 20,000 were both run."""
    by_size = {r.rollouts: r for r in rows if (r.code, r.command, r.shape) == ("after", "report", "repeats")}
    if 2000 not in by_size or 20000 not in by_size:
        return None
    return {"growth_mb": by_size[20000].peak_mb - by_size[2000].peak_mb, "limit_mb": GROWTH_LIMIT_MB}


def _sizes(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="2000,20000,200000", help="rollouts per run, this tree")
    parser.add_argument("--tasks", type=int, default=100, help="tasks of the repeats shape")
    parser.add_argument("--shapes", default="repeats,generation", help="repeats and/or generation")
    parser.add_argument("--generation-sizes", default="20000,200000", help="rollouts of the generation shape")
    parser.add_argument("--before", metavar="REV", help="also run REV's code (git archive), same commands")
    parser.add_argument("--before-sizes", default="2000,20000", help="rollouts per run for --before")
    parser.add_argument("--no-export", action="store_true", help="only the report")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="write the runs here and keep them")
    add_json_flag(parser)
    args = parser.parse_args()
    commands = ["report"] if args.no_export else ["report", "export"]
    shapes = [s for s in args.shapes.split(",") if s]
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_report_runs_"))
    work.mkdir(parents=True, exist_ok=True)
    before_source: Path | None = None
    plan: list[tuple[str, Path | None, str, int]] = []
    if args.before:
        before_source = work / f"before-{args.before}"
        if not before_source.exists():
            before_source.mkdir()
            archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(before_source)], input=archive, check=True)
        plan += [("before", before_source, "repeats", n) for n in _sizes(args.before_sizes)]
    for shape in shapes:
        sizes = _sizes(args.sizes if shape == "repeats" else args.generation_sizes)
        plan += [("after", None, shape, n) for n in sizes]
    rows: list[Measure] = []
    try:
        for code, source, shape, rollouts in plan:
            run, tasks = make_run(work, shape, rollouts, args.tasks)
            for command in commands:
                row = measure(code, source, command, shape, run, rollouts, tasks)
                rows.append(row)
                print(
                    f"  {code} {command} {shape} {rollouts:,}: peak {row.peak_mb:.1f} MB, {row.wall_s:.1f}s "
                    f"({row.module or 'no module'})",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print_table(rows)
    check = growth_check(rows)
    if check is not None:
        verdict = "met" if check["growth_mb"] <= check["limit_mb"] else "NOT met"
        growth = check["growth_mb"]
        print(f"\nreport peak RSS growth from 2,000 to 20,000 rollouts: {growth:+.1f} MB (target <= 16 MB: {verdict})")
    write_json(args.json, {"runs": [asdict(r) for r in rows], "growth": check})


if __name__ == "__main__":
    main()
