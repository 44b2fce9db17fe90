"""Benchmark: exporting saved runs of any size as training data (issue 59): time and peak memory, 10,000 rollouts
against 100,000, side by side.

    .venv/bin/python bench/bench_export.py                                  # 10k and 100k, every format, Parquet
    .venv/bin/python bench/bench_export.py --sizes 2000,20000 --formats sft-tokens,preferences --suffix .jsonl
    .venv/bin/python bench/bench_export.py --shuffled                       # also the largest run in random order

Each size is a saved run made up once (``tests/unit/training_runs.py``: three-turn tool rollouts whose policy calls
recorded prompt and completion token IDs and logprobs, a 400-token first prompt, 64 tokens a turn, graded rewards, 4
rollouts a task; about 14 KB a line) in the order an eval writes it: each window of 64 rollouts (``-c 64``) in random
order. ``--shuffled`` adds the largest run with its lines in random order (a resumed run, or results of your own: the
grouped formats then hold tasks up to their memory bound and group the rest on disk). Each export is ``verifiers-nemo
export RUN --format F -o OUT`` in a fresh process (``_eval_process.py``: its peak RSS, ``VmHWM``, and CPU at exit).

Per export: rows written, the output's size, wall and CPU seconds, rollouts/s, peak RSS; then per format the peak
at the largest run over the smallest (bounded memory: about 1).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from _common import add_json_flag, write_json

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))

from tests.unit.training_runs import reward_of, rollout_record  # noqa: E402
from verifiers_nemo._export.options import FORMATS  # noqa: E402
from verifiers_nemo._protocol import dumps  # noqa: E402

ROLLOUTS_PER_TASK = 4
WINDOW = 64


@dataclass
class Export:
    format: str
    rollouts: int
    order: str
    rows: int = 0
    output_mb: float = 0.0
    wall_s: float = 0.0
    cpu_s: float = 0.0
    peak_mb: float = 0.0
    exit_code: int = 0


def make_run(folder: Path, rollouts: int, shuffled: bool) -> float:
    """A saved run of ``rollouts`` lines (see the module); its size in MB."""
    folder.mkdir(parents=True)
    rng = random.Random(rollouts)
    tasks = rollouts // ROLLOUTS_PER_TASK
    order = [(t, r) for t in range(tasks) for r in range(ROLLOUTS_PER_TASK)]
    if shuffled:
        rng.shuffle(order)
    else:
        for start in range(0, len(order), WINDOW):
            window = order[start : start + WINDOW]
            rng.shuffle(window)
            order[start : start + WINDOW] = window
    with open(folder / "results.jsonl", "wb") as out:
        for task, rollout in order:
            record = rollout_record(
                task, rollout, reward=reward_of(task, rollout), turns=3, tokens_per_turn=64, prompt_tokens=400
            )
            out.write(dumps(record) + b"\n")
    settings = {
        "env": "example_multi_step",
        "nemo_env": "example_multi_step",
        "policy": "endpoint",
        "model": "Qwen/Qwen3-8B",
        "rollouts_per_example": ROLLOUTS_PER_TASK,
        "save_trace": True,
        "exact_tokens": True,
        "sampling_args": {},
    }
    (folder / "metadata.json").write_text(
        json.dumps({"run_id": folder.name, "model": "Qwen/Qwen3-8B", "settings": settings})
    )
    return (folder / "results.jsonl").stat().st_size / 1e6


def export(run: Path, form: str, suffix: str, rollouts: int, order: str) -> Export:
    figures = Export(form, rollouts, order)
    out = run.parent / f"{run.name}-{form}{suffix}"
    stats = run.parent / "stats.json"
    env = {**os.environ, "BENCH_EVAL_STATS": str(stats)}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(BENCH / "_eval_process.py"), "export", str(run), "--format", form, "-o", str(out)],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    figures.wall_s = time.monotonic() - started
    figures.exit_code = done.returncode
    if done.returncode != 0:
        print(done.stderr[-2000:], file=sys.stderr)
        return figures
    measured = json.loads(stats.read_text())
    figures.peak_mb = measured["vm_hwm_kb"] / 1024
    figures.cpu_s = measured["cpu_s"]
    figures.output_mb = out.stat().st_size / 1e6
    from verifiers_nemo import training_data_description

    figures.rows = training_data_description(out)["counts"]["rows"]
    out.unlink()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,100000", help="rollouts of each run, comma-separated")
    parser.add_argument("--formats", default=",".join(FORMATS), help="formats to export, comma-separated")
    parser.add_argument("--suffix", default=".parquet", choices=(".parquet", ".jsonl"))
    parser.add_argument("--shuffled", action="store_true", help="also the largest run with its lines in random order")
    parser.add_argument(
        "--keep", type=Path, help="make the runs in this folder and keep them (default: a temporary one)"
    )
    add_json_flag(parser)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    forms = args.formats.split(",")
    work = args.keep or Path(tempfile.mkdtemp(prefix="bench_export_"))
    runs = [(size, "eval order") for size in sizes] + ([(max(sizes), "random order")] if args.shuffled else [])
    results: list[Export] = []
    try:
        for size, order in runs:
            run = work / f"run-{size}-{order.split()[0]}"
            if not (run / "results.jsonl").exists():
                t0 = time.monotonic()
                mb = make_run(run, size, order == "random order")
                print(
                    f"made a run of {size:,} rollouts ({order}): {mb:,.0f} MB in {time.monotonic() - t0:.0f}s",
                    flush=True,
                )
            for form in forms:
                figures = export(run, form, args.suffix, size, order)
                results.append(figures)
                print(
                    f"  {form:15} {figures.rows:>9,} rows {figures.output_mb:8.1f} MB {figures.wall_s:7.1f}s wall "
                    f"{figures.cpu_s:7.1f}s CPU {size / max(figures.wall_s, 1e-9):8.0f} rollouts/s "
                    f"peak {figures.peak_mb:6.1f} MB",
                    flush=True,
                )
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)
    print()
    print(f"| format | rollouts | order | rows | {args.suffix[1:]} MB | wall s | CPU s | rollouts/s | peak RSS MB |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r.format} | {r.rollouts:,} | {r.order} | {r.rows:,} | {r.output_mb:,.1f} | {r.wall_s:.1f} | "
            f"{r.cpu_s:.1f} | {r.rollouts / max(r.wall_s, 1e-9):,.0f} | {r.peak_mb:.1f} |"
        )
    print()
    small, large = min(sizes), max(sizes)
    print(
        f"| format | peak RSS MB at {small:,} | at {large:,} | ratio | CPU ms / rollout at {small:,} | at {large:,} |"
    )
    print("|---|---|---|---|---|---|")
    for form in forms:
        a = next((r for r in results if (r.format, r.rollouts, r.order) == (form, small, "eval order")), None)
        b = next((r for r in results if (r.format, r.rollouts, r.order) == (form, large, "eval order")), None)
        if a and b and a.peak_mb:
            print(
                f"| {form} | {a.peak_mb:.1f} | {b.peak_mb:.1f} | {b.peak_mb / a.peak_mb:.2f} | "
                f"{1000 * a.cpu_s / small:.2f} | {1000 * b.cpu_s / large:.2f} |"
            )
    write_json(args.json, [asdict(r) for r in results])


if __name__ == "__main__":
    main()
