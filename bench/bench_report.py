"""`verifiers-nemo report`: build time and file size for 1,000 and 10,000 synthetic rollouts (saved
with --save-trace: multi-turn tool calls, 3% typed errors, 2% masked), read + stats + plots + HTML."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.unit.report_runs import write_run
from verifiers_nemo._report import write_report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="1000,10000", help="rollout counts (4 rollouts per task)")
    args = parser.parse_args()
    print(f"{'rollouts':>9} {'results.jsonl MB':>17} {'build s':>8} {'report MB':>10}")
    with tempfile.TemporaryDirectory() as tmp:
        for n in (int(x) for x in args.sizes.split(",")):
            run = write_run(Path(tmp) / f"run{n}", tasks=n // 4, repeats=4, seed=n)
            started = time.perf_counter()
            report = write_report([run], Path(tmp) / f"report{n}.html")
            built = time.perf_counter() - started
            source = (run / "results.jsonl").stat().st_size / 1e6
            print(f"{n:>9,} {source:>17.1f} {built:>8.1f} {report.bytes / 1e6:>10.1f}", flush=True)


if __name__ == "__main__":
    main()
