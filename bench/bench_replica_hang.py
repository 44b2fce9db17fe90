"""A replica that hangs mid-run, and one that is merely slow: `verifiers-nemo eval -b A,B,C` over three policy
servers (the processes of ``bench_replica_death.py``), side by side with the same run with no fault.

* ``none``: three live replicas;
* ``freeze``: C stops itself with SIGSTOP when its 21st call arrives (the kernel still accepts connections; nothing
  answers them), as a frozen engine does;
* ``slow``: every call of C after its 20th is answered after ``--slow-s`` seconds (longer than the hang watch's 5 s),
  while ``GET /models`` answers at once: a loaded engine, which must stay in the rotation.

Each run prints rollouts scored / errored / moved, its wall time and the ratio to the run with no fault, and the
summary's Replicas row. ``--timeout`` is the eval's (default 120 s, as the issue's run):

    PYTHONPATH=$PWD .venv/bin/python bench/bench_replica_hang.py
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_replica_death import ENV, MODEL, _start_server


def run_once(fault: str, examples: int, repeats: int, concurrency: int, after: int, slow_s: float, timeout: float):
    with tempfile.TemporaryDirectory(prefix="bench-hang-") as tmp:
        folder = Path(tmp)
        servers = [_start_server(folder, "a", None), _start_server(folder, "b", None)]
        servers.append(_start_server(folder, "c", None if fault == "none" else after, fault, slow_s))
        try:
            env = {**os.environ}
            env.pop("OPENAI_API_KEY", None)
            cli = Path(sys.executable).with_name("verifiers-nemo")
            urls = ",".join(url for _, url in servers)
            args = [str(cli), "eval", ENV, "-b", urls, "-m", MODEL, "--timeout", str(timeout), "-t", "64"]
            args += ["-n", str(examples), "-r", str(repeats), "-c", str(concurrency), "-s", "-o", str(folder / "out")]
            started = time.monotonic()
            done = subprocess.run(args, env=env, cwd=folder, capture_output=True, text=True, timeout=1800)
            wall = time.monotonic() - started
            (metadata_path,) = (folder / "out").glob("*/*/metadata.json")
            metadata = json.loads(metadata_path.read_text())
            lines = [json.loads(x) for x in (metadata_path.parent / "results.jsonl").read_text().splitlines() if x]
        finally:
            for proc, _ in servers:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGCONT)
                    proc.kill()
                proc.wait(timeout=10)
        rollouts = metadata["summary"]["rollouts"]
        stack = next((x for x in done.stdout.splitlines() if x.startswith("Timing")), "")
        return {
            "fault": fault,
            "exit": done.returncode,
            "scored": rollouts["scored"],
            "errored": rollouts["errored"],
            "errors_by_type": metadata["summary"]["errors_by_type"],
            "moved": sum(1 for r in lines if r.get("failed_over")),
            "outages": metadata["summary"].get("replicas") or [],
            "wall_s": round(wall, 1),
            "replicas_row": [x for x in done.stdout.splitlines() if x.startswith(("Replicas", "          "))][:3],
            "timing_row": stack,
            "c_url": servers[2][1],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--after", type=int, default=20, help="calls C answers before its fault (default 20)")
    parser.add_argument("--slow-s", type=float, default=8.0, help="seconds the slow C takes a call (default 8)")
    parser.add_argument("-n", "--examples", type=int, default=5)
    parser.add_argument("-r", "--repeats", type=int, default=60, help="rollouts per example (5 x 60 = 300)")
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--faults", default="none,freeze,slow")
    args = parser.parse_args()
    runs = [
        run_once(f, args.examples, args.repeats, args.concurrency, args.after, args.slow_s, args.timeout)
        for f in args.faults.split(",")
    ]
    base = next((r["wall_s"] for r in runs if r["fault"] == "none"), None)
    total = args.examples * args.repeats
    print(f"{total} rollouts of {ENV}, {args.concurrency} at once, three replicas; C faults after {args.after} calls")
    print(f"{'fault':<8}{'scored':>8}{'errored':>9}{'moved':>7}{'wall s':>8}{'x none':>8}  C out of the rotation")
    for r in runs:
        ratio = f"{r['wall_s'] / base:.2f}" if base else "-"
        c_out = [o for o in r["outages"] if r["c_url"] in o["replica"]]
        others = [o for o in r["outages"] if r["c_url"] not in o["replica"]]
        said = (
            "; ".join(
                f"{o['outages']}x, {o['seconds']:.1f} s in all"
                f"{' (still out at the end)' if o.get('still_down') else ''}: {o['reason'][:100]}"
                for o in c_out
            )
            or "never"
        )
        print(f"{r['fault']:<8}{r['scored']:>8}{r['errored']:>9}{r['moved']:>7}{r['wall_s']:>8}{ratio:>8}  {said}")
        if others:
            print(f"        other replicas out: {others}")
        if r["errors_by_type"]:
            print(f"        errors: {r['errors_by_type']}")
        print(f"        {r['timing_row']}")


if __name__ == "__main__":
    main()
