"""Gym processes started warm (forked from the machine's warm parent) vs plain (fresh interpreters), side by side.

    .venv/bin/python bench/bench_warm_start.py [--env example_multi_step] [--repeats 2] [--mix-repeats 1]

Both designs run in this one run, alternating, on this tree: "plain" is ``StackConfig(warm_start=False)`` /
``VERIFIERS_NEMO_WARM_START=0`` (every Gym process a fresh interpreter, as before the warm start), "warm" the
default. For each Gym runtime (nemo-gym 0.4 in this interpreter's venv, 0.7 in ``.venv-gym07`` when it exists;
0.7 there is the test-only 3.13.0 runtime told the 3.13.14 floor, see .ci/setup-gym07):

- first: a fresh process starts a stack on a machine with nothing of ours running (a fresh heads folder,
  ``VERIFIERS_NEMO_RAY_DIR``): it starts the Ray head too, and, warm, the warm parent (whose import list is
  cached once per runtime, as ``.ci/setup-tests`` and ``verifiers-nemo prepare`` do: that run is not timed);
- later: a second process starts a stack while the first holds its own (an added env-server worker);
- ready = ``GymStack.start()`` returned (every server answers); CPU-s = user + system seconds, at ready, of every
  process that start involved that is still alive (the owner process itself, the stack's session, and for the
  first start the Ray head's and the warm parent's sessions);
- processes / PSS a later stack adds: the processes of its stack's session (``/proc/PID/smaps_rollup``), and the
  machine's delta (the PSS of everything of both stacks, their Ray head and warm parent, and the first owner,
  after the second stack is ready, less the same before it started: pages a fork shares count once);
- the launcher's own cost: the CPU seconds and PSS of the launcher processes of the later stack (each stands in
  for its server: it relays signals and its exit status);
- mix: one ``verifiers-nemo eval`` of 8 offline environments (replay policy, one rollout each, a fresh heads
  folder): its "stack start" (all 8 stacks ready, started at once) and wall time.

The suite's CPU-seconds are measured by running the suite twice (``bench/README.md`` says how), not here.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_json_flag, cpu_seconds, gym_runtimes, session_pids, write_json

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
MIX = (
    "example_single_tool_call,example_multi_step,example_session_state_mgmt,example_tool_call_multireward,"
    "arc_agi,circle_count,format_verification,xlam_fc"
)
TARGETS = {"first": 0.4, "mix": 0.2, "later_added_pss_mib": 150.0}
"""Issue 44, on a quiet 2-core machine: a first stack in <= 0.4x the plain start's time, an 8-environment mix in
<= 0.2x, a later process's stack adding <= 150 MiB PSS, on both releases."""

_HOLDER = textwrap.dedent(
    """
    import json, resource, sys, time
    from verifiers_nemo._gym.runtime import gym_root
    from verifiers_nemo._stack import GymStack, StackConfig
    env, python, warm = sys.argv[1], sys.argv[2] or None, sys.argv[3] == "1"
    config = gym_root(python) / "resources_servers" / env / "configs" / f"{env}.yaml"
    stack = GymStack(StackConfig(env, (config,), "http://127.0.0.1:9", gym_python=python, warm_start=warm))
    t = time.monotonic()
    stack.start()
    ready = time.monotonic() - t
    own = resource.getrusage(resource.RUSAGE_SELF)
    parent = stack.warm_parent
    print(json.dumps({"ready_s": ready, "stack_sid": stack.launch.supervisor.pid, "head_sid": stack.ray_head.pid,
                      "warm_sid": parent.pid if parent is not None else None,
                      "forked": parent is not None and "start warm" in stack.log_path.read_text(),
                      "own_cpu_s": own.ru_utime + own.ru_stime}), flush=True)
    sys.stdin.read()
    stack.stop()
    """
)


def _pss(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
        except OSError:
            continue
    return total / MIB


def _launchers(pids: list[int]) -> list[int]:
    """The launcher processes among ``pids``: ``python LAUNCHER app.py``, the launcher named as nemo-gym ran it
    (0.4: from PATH, the launcher venv's own path; 0.7: through the server's venv link)."""
    found = []
    for pid in pids:
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        except OSError:
            continue
        if len(argv) > 1 and b"warm-launchers" in os.path.realpath(argv[1]):
            found.append(pid)
    return found


class Holder:
    """A process with one Gym stack (plain or warm), held until ``close``."""

    def __init__(self, env: str, python: str | None, warm: bool, heads_dir: Path) -> None:
        environ = dict(os.environ, PYTHONPATH=str(ROOT), VERIFIERS_NEMO_RAY_DIR=str(heads_dir))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, env, python or "", "1" if warm else "0"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=environ,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the stack did not start (exit {self.proc.wait()})")
        self.info = json.loads(line)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure_stacks(env: str, python: str | None, warm: bool) -> dict[str, float]:
    """A first and a later process's stack on a machine with nothing of ours running."""
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-bw-"))
    first = second = None
    try:
        first = Holder(env, python, warm, heads_dir)
        if first.info["forked"] != warm:
            raise RuntimeError(f"asked {'warm' if warm else 'plain'}, the stack started otherwise")
        shared = [first.info["head_sid"], first.info["warm_sid"]]
        first_pids = session_pids(first.info["stack_sid"], *shared)
        first_cpu = cpu_seconds(*first_pids) + first.info["own_cpu_s"]
        before = _pss([first.proc.pid, *first_pids])
        second = Holder(env, python, warm, heads_dir)
        added = session_pids(second.info["stack_sid"])
        after = _pss([first.proc.pid, *session_pids(first.info["stack_sid"], second.info["stack_sid"], *shared)])
        launchers = _launchers(added)
        return {
            "first_s": first.info["ready_s"],
            "first_cpu_s": first_cpu,
            "later_s": second.info["ready_s"],
            "later_cpu_s": cpu_seconds(*added) + second.info["own_cpu_s"],
            "later_processes": len(added),
            "later_pss_mib": _pss(added),
            "later_added_pss_mib": after - before,
            "launchers": len(launchers),
            "launcher_cpu_s": cpu_seconds(*launchers) / len(launchers) if launchers else 0.0,
            "launcher_pss_mib": _pss(launchers) / len(launchers) if launchers else 0.0,
        }
    finally:
        for holder in (second, first):
            if holder is not None:
                holder.close()
        time.sleep(2)  # the head and the warm parent stop within a poll of their last lease
        shutil.rmtree(heads_dir, ignore_errors=True)


def measure_mix(python: str | None, warm: bool) -> dict[str, float]:
    """One eval of the 8-environment mix on a machine with nothing of ours running."""
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-bm-"))
    out = Path(tempfile.mkdtemp(prefix="vnr-bm-out-"))
    environ = dict(os.environ, VERIFIERS_NEMO_RAY_DIR=str(heads_dir), VERIFIERS_NEMO_WARM_START="1" if warm else "0")
    if python:
        environ["VERIFIERS_NEMO_GYM_PYTHON"] = python
    try:
        started = time.monotonic()
        cli = ROOT / ".venv" / "bin" / "verifiers-nemo"
        done = subprocess.run(
            [str(cli), "eval", MIX, "-n", "1", "-r", "1", "-o", str(out)],
            env=environ,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        wall = time.monotonic() - started
        if done.returncode != 0:
            raise RuntimeError(f"the mix eval failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        (metadata,) = out.rglob("metadata.json")
        (session,) = json.loads(metadata.read_text())["sessions"]
        return {"mix_s": session["stack_start_s"], "mix_wall_s": wall}
    finally:
        time.sleep(2)
        shutil.rmtree(heads_dir, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def _prime_probe(python: str | None) -> None:
    """The warm parent's import list, cached once per runtime (what set-up does): not part of any start timed."""
    from verifiers_nemo._gym.runtime import find_gym_runtime
    from verifiers_nemo._stack.config import StackConfig
    from verifiers_nemo._stack.plan import child_env
    from verifiers_nemo._stack.warm_parent import probe

    runtime = find_gym_runtime(python)
    path, listed = probe(runtime, child_env(os.environ, runtime.bin_dir, StackConfig("bench", (), "")))
    print(f"warm parent's import list for {runtime.python}: {len(listed['modules'])} modules ({path})", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="example_multi_step")
    parser.add_argument("--repeats", type=int, default=2, help="first/later stack pairs per design and release")
    parser.add_argument("--mix-repeats", type=int, default=1, help="8-environment evals per design and release")
    parser.add_argument("--releases", default="0.4,0.7")
    add_json_flag(parser)
    args = parser.parse_args()

    runtimes = gym_runtimes(args.releases)
    load_before = os.getloadavg()[0]
    rows: list[dict[str, Any]] = []
    for release, python in runtimes.items():
        _prime_probe(python)
        runs: dict[str, list[dict[str, float]]] = {"plain": [], "warm": []}
        for _ in range(args.repeats):
            for design in ("plain", "warm"):  # alternating, so that a change of load hits both
                runs[design].append(measure_stacks(args.env, python, design == "warm"))
                print(json.dumps({"release": release, "design": design, **runs[design][-1]}), flush=True)
        mixes: dict[str, list[dict[str, float]]] = {"plain": [], "warm": []}
        for _ in range(args.mix_repeats):
            for design in ("plain", "warm"):
                mixes[design].append(measure_mix(python, design == "warm"))
                print(json.dumps({"release": release, "design": design, **mixes[design][-1]}), flush=True)
        for design in ("plain", "warm"):
            row: dict[str, Any] = {"release": release, "design": design}
            for key in runs[design][0]:
                row[key] = statistics.median(run[key] for run in runs[design])
            for key in mixes[design][0] if mixes[design] else ():
                row[key] = statistics.median(run[key] for run in mixes[design])
            rows.append(row)
    load_after = os.getloadavg()[0]
    _print_table(rows, args, (load_before, load_after))
    write_json(args.json, {"rows": rows, "load": [load_before, load_after], "cpus": os.cpu_count()})


def _print_table(rows: list[dict[str, Any]], args: argparse.Namespace, load: tuple[float, float]) -> None:
    print(
        f"\n{args.env} (first, later) and an 8-environment mix, median of {args.repeats} (mix: {args.mix_repeats}); "
        f"{os.cpu_count()} CPUs, load average {load[0]:.1f} before, {load[1]:.1f} after"
    )
    columns = [
        ("first_s", "first s", 1),
        ("first_cpu_s", "CPU-s", 1),
        ("later_s", "later s", 1),
        ("later_cpu_s", "CPU-s", 1),
        ("later_processes", "procs", 0),
        ("later_pss_mib", "PSS MiB", 0),
        ("later_added_pss_mib", "+machine", 0),
        ("mix_s", "mix s", 1),
        ("mix_wall_s", "mix wall", 1),
    ]
    print(f"{'gym':<5}{'design':<7}" + "".join(f"{label:>10}" for _, label, _ in columns))
    by = {(r["release"], r["design"]): r for r in rows}
    for r in rows:
        print(
            f"{r['release']:<5}{r['design']:<7}"
            + "".join(f"{r.get(key, float('nan')):>10.{digits}f}" for key, _, digits in columns)
        )
    print("\nwarm / plain (targets: first <= 0.4x, mix <= 0.2x, a later stack adds <= 150 MiB PSS)")
    for release in dict.fromkeys(r["release"] for r in rows):
        plain, warm = by.get((release, "plain")), by.get((release, "warm"))
        if plain is None or warm is None:
            continue
        first = warm["first_s"] / plain["first_s"]
        mix = warm["mix_s"] / plain["mix_s"] if "mix_s" in warm else float("nan")
        pss = warm["later_added_pss_mib"]
        cpu_first = warm["first_cpu_s"] / plain["first_cpu_s"]
        cpu_later = warm["later_cpu_s"] / plain["later_cpu_s"]
        print(
            f"nemo-gym {release}: first {first:.2f}x ({_met(first <= TARGETS['first'])}), "
            f"later {warm['later_s'] / plain['later_s']:.2f}x, CPU-s to ready first {cpu_first:.2f}x later "
            f"{cpu_later:.2f}x, mix {mix:.2f}x ({_met(mix <= TARGETS['mix'])}), a later stack adds {pss:.0f} MiB PSS "
            f"({_met(pss <= TARGETS['later_added_pss_mib'])}; plain {plain['later_added_pss_mib']:.0f}); launcher: "
            f"{warm['launcher_cpu_s']:.3f} CPU-s, {warm['launcher_pss_mib']:.1f} MiB PSS each"
        )


def _met(ok: bool) -> str:
    return "met" if ok else "NOT MET"


if __name__ == "__main__":
    main()
