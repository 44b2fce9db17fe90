"""What bounds the warm start from below: its parts measured alone, side by side with the plain start, in one run.

    .venv/bin/python bench/bench_warm_floor.py [--env example_multi_step] [--releases 0.4,0.7] [--no-mix]

Issue 44 asks, against the plain start (every Gym process a fresh interpreter), for a first stack in <= 0.4x the
time, an 8-environment mix in <= 0.2x and a later process's stack adding <= 150 MiB PSS. This benchmark measures
the parts a warm start cannot skip, each on a machine with nothing of ours running (a fresh heads folder), and
what they imply, per Gym runtime (0.4 in this venv, 0.7 in ``.venv-gym07``: the test-only 3.13.0 runtime told
the 3.13.14 floor):

- plain and warm: a first and a later process's stack (``bench_warm_start.measure_stacks``), and the mix
  (``measure_mix``) unless ``--no-mix``;
- the machine's Ray head alone (``acquire_ray_head`` as a first stack calls it): seconds until a driver can join,
  and the CPU-seconds of its processes by then. Every Gym server calls ``ray.init`` as it starts, so no stack is
  ready before its head; the head is Ray's own processes (``ray start``, its GCS, API server, raylet and agents),
  started by Ray, as released;
- the warm parent alone (``acquire_warm_parent``, until it serves): its preload's seconds and CPU-seconds;
- a later warm stack by role (``ng_run``, Gym servers, our policy server, launchers, supervisors, shells): CPU-s
  to ready and private dirty memory (pages it wrote: what it adds to the machine beyond what it shares);
- ``import nemo_gym`` (what a resources server imports of it: ``nemo_gym.server_utils`` and
  ``nemo_gym.base_resources_server``) in a fork of a process that imported the warm parent's preload, in the
  server's folder: the CPU-s and private dirty MiB each Gym process pays for it, since the warm parent never
  imports ``nemo_gym`` (its package import binds the working directory into ``WORKING_DIR``/``CACHE_DIR``/
  ``RESULTS_DIR`` and sets ``HF_HOME``/``HF_DATASETS_CACHE`` from it, and each Gym process runs in its own folder).

Floors printed: a first stack cannot be ready before its head is, plus a later stack's own start; and on
``os.cpu_count()`` CPUs no faster than the CPU-seconds it needs (head + preload + the stack) over the CPUs. The
mix the same with 8 stacks (``--env`` as the stand-in for each of the 8: the mix's own environments differ).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import add_json_flag, cpu_seconds, gym_runtimes, session_pids, write_json
from bench_warm_start import TARGETS, Holder, _prime_probe, measure_mix, measure_stacks

ROOT = Path(__file__).resolve().parents[1]
MIX_SIZE = 8

_ALONE = textwrap.dedent(
    """
    import json, os, sys, threading, time
    from dataclasses import replace
    from verifiers_nemo._gym.runtime import find_gym_runtime, gym_root
    from verifiers_nemo._stack import StackConfig
    from verifiers_nemo._stack.plan import child_env
    from verifiers_nemo._stack.ray_head import acquire_ray_head, release_ray_head
    from verifiers_nemo._stack.stack import warm_parent_env
    from verifiers_nemo._stack.warm_parent import acquire_warm_parent, release_warm_parent
    sys.path.insert(0, os.path.join(os.getcwd(), "bench"))
    from _common import cpu_seconds, session_pids
    env, python, part = sys.argv[1], sys.argv[2] or None, sys.argv[3]
    runtime = find_gym_runtime(python)
    config = StackConfig(env, (), "http://127.0.0.1:9", gym_python=python)
    done = {}
    def head():
        t = time.monotonic()
        h = acquire_ray_head(runtime, child_env(os.environ, runtime.bin_dir, replace(config, pass_env=())))
        done["head"] = (time.monotonic() - t, h.pid, h)
    def parent():
        t = time.monotonic()
        p = acquire_warm_parent(runtime, warm_parent_env(config, runtime))
        p._wait_ready()
        done["parent"] = (time.monotonic() - t, p.pid, p)
    threads = [threading.Thread(target=f) for name, f in (("head", head), ("parent", parent)) if part in (name, "both")]
    t = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    wall = time.monotonic() - t
    sids = [v[1] for v in done.values()]
    print(json.dumps({"wall_s": wall, "cpu_s": cpu_seconds(*session_pids(*sids)),
                      **{f"{k}_s": v[0] for k, v in done.items()}}), flush=True)
    if "head" in done:
        release_ray_head(done["head"][2])
    if "parent" in done:
        release_warm_parent(done["parent"][2])
    """
)

_FORK_IMPORT = textwrap.dedent(
    """
    import contextlib, gc, importlib, json, os, resource, sys
    listed, folder = json.load(open(sys.argv[1])), sys.argv[2]
    for name in listed["modules"]:
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    gc.collect()
    gc.freeze()
    def dirty_mib():
        for line in open("/proc/self/smaps_rollup"):
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    read_r, write_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.chdir(folder)
        before = dirty_mib()
        import nemo_gym.server_utils, nemo_gym.base_resources_server
        use = resource.getrusage(resource.RUSAGE_SELF)
        figures = {"cpu_s": use.ru_utime + use.ru_stime, "dirty_mib": dirty_mib() - before}
        os.write(write_w, json.dumps(figures).encode())
        os._exit(0)
    os.close(write_w)
    with os.fdopen(read_r) as reply:
        print(reply.read(), flush=True)
    os.waitpid(pid, 0)
    """
)


def _run_json(argv: list[str], heads_dir: Path, **extra: str) -> dict[str, Any]:
    environ = dict(os.environ, PYTHONPATH=str(ROOT), VERIFIERS_NEMO_RAY_DIR=str(heads_dir), **extra)
    done = subprocess.run(argv, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=300)
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{argv[:3]} failed ({done.returncode}):\n{done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    return json.loads(lines[-1])


def measure_alone(env: str, python: str | None, part: str) -> dict[str, Any]:
    """The Ray head, the warm parent, or both at once (as a first stack starts them), on a fresh heads folder."""
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-bf-"))
    try:
        return _run_json([sys.executable, "-c", _ALONE, env, python or "", part], heads_dir)
    finally:
        time.sleep(2)  # both stop within a poll of their last lease
        shutil.rmtree(heads_dir, ignore_errors=True)


def _role(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return "gone"
    if any(b"ng_run" in part for part in argv[:2]):
        return "ng_run"
    if len(argv) > 1 and b"warm-launchers" in os.path.realpath(argv[1]):
        return "launchers"
    if argv[-1:] == [b"app.py"]:
        return "policy server (ours)" if "responses_api_models" in cwd and "/runs/" in cwd else "Gym servers"
    if any(b"supervisor.py" in part for part in argv[:2]):
        return "supervisors (ours)"
    return "shells (bash, tee)"


def _private_dirty_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def measure_roles(env: str, python: str | None) -> dict[str, dict[str, float]]:
    """A later process's warm stack, by role: processes, CPU-s to ready, private dirty MiB."""
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-br-"))
    first = second = None
    try:
        first = Holder(env, python, True, heads_dir)
        second = Holder(env, python, True, heads_dir)
        roles: dict[str, dict[str, float]] = {}
        for pid in session_pids(second.info["stack_sid"]):
            row = roles.setdefault(_role(pid), {"processes": 0, "cpu_s": 0.0, "dirty_mib": 0.0})
            row["processes"] += 1
            row["cpu_s"] += cpu_seconds(pid)
            row["dirty_mib"] += _private_dirty_mib(pid)
        return roles
    finally:
        for holder in (second, first):
            if holder is not None:
                holder.close()
        time.sleep(2)
        shutil.rmtree(heads_dir, ignore_errors=True)


def measure_fork_import(env: str, python: str | None) -> dict[str, float]:
    """``import nemo_gym`` (a resources server's part) in a fork of a process that imported the preload."""
    from verifiers_nemo._gym.runtime import find_gym_runtime, gym_root
    from verifiers_nemo._stack.config import StackConfig
    from verifiers_nemo._stack.plan import child_env
    from verifiers_nemo._stack.warm_parent import probe

    runtime = find_gym_runtime(python)
    path, _ = probe(runtime, child_env(os.environ, runtime.bin_dir, StackConfig("bench", (), "")))
    folder = gym_root(python) / "resources_servers" / env
    runs = [
        _run_json([str(runtime.python), "-c", _FORK_IMPORT, str(path), str(folder)], Path(tempfile.gettempdir()))
        for _ in range(3)
    ]
    return {key: statistics.median(run[key] for run in runs) for key in runs[0]}


def measure_release(env: str, python: str | None, mix: bool) -> dict[str, Any]:
    _prime_probe(python)
    row: dict[str, Any] = {}
    for design in ("plain", "warm"):
        row[design] = measure_stacks(env, python, design == "warm")
        print(json.dumps({design: row[design]}), flush=True)
    for part in ("head", "parent", "both"):
        row[part] = measure_alone(env, python, part)
        print(json.dumps({part: row[part]}), flush=True)
    row["roles"] = measure_roles(env, python)
    row["fork_import"] = measure_fork_import(env, python)
    print(json.dumps({"roles": row["roles"], "fork_import": row["fork_import"]}), flush=True)
    if mix:
        for design in ("plain", "warm"):
            row[design] |= measure_mix(python, design == "warm")
            print(json.dumps({design: row[design]}), flush=True)
    return row


def report(release: str, row: dict[str, Any], cpus: int) -> None:
    plain, warm, head, parent, both = (row[k] for k in ("plain", "warm", "head", "parent", "both"))
    roles, imp = row["roles"], row["fork_import"]
    print(f"\nnemo-gym {release} ({cpus} CPUs)")
    print(
        f"  plain: first stack {plain['first_s']:.1f} s ({plain['first_cpu_s']:.1f} CPU-s), later stack "
        f"{plain['later_s']:.1f} s ({plain['later_cpu_s']:.1f}), it adds {plain['later_added_pss_mib']:.0f} MiB PSS"
    )
    print(
        f"  warm:  first stack {warm['first_s']:.1f} s ({warm['first_cpu_s']:.1f} CPU-s), later stack "
        f"{warm['later_s']:.1f} s ({warm['later_cpu_s']:.1f}), it adds {warm['later_added_pss_mib']:.0f} MiB PSS"
    )
    print(
        f"  the Ray head alone {head['wall_s']:.1f} s ({head['cpu_s']:.1f} CPU-s); the warm parent alone "
        f"{parent['wall_s']:.1f} s ({parent['cpu_s']:.1f} CPU-s); both at once {both['wall_s']:.1f} s "
        f"({both['cpu_s']:.1f} CPU-s)"
    )
    print("  a later warm stack by role:      procs   CPU-s  private dirty MiB")
    for name, r in sorted(roles.items(), key=lambda kv: -kv[1]["dirty_mib"]):
        print(f"    {name:<28}{r['processes']:>7.0f}{r['cpu_s']:>8.2f}{r['dirty_mib']:>10.1f}")
    total_dirty = sum(r["dirty_mib"] for r in roles.values())
    gym_procs = roles.get("ng_run", {}).get("processes", 0) + roles.get("Gym servers", {}).get("processes", 0)
    print(
        f"    {'all':<28}{sum(r['processes'] for r in roles.values()):>7.0f}"
        f"{sum(r['cpu_s'] for r in roles.values()):>8.2f}{total_dirty:>10.1f}"
    )
    print(
        f"  import nemo_gym in a fork of the preloaded parent: {imp['cpu_s']:.2f} CPU-s, {imp['dirty_mib']:.1f} MiB "
        f"private dirty, in each of the stack's {gym_procs:.0f} Gym processes: {gym_procs * imp['cpu_s']:.2f} CPU-s, "
        f"{gym_procs * imp['dirty_mib']:.0f} MiB of the stack's"
    )
    stack_cpu = sum(r["cpu_s"] for r in roles.values())  # the stack's own processes (no owner's imports)
    target = TARGETS["first"] * plain["first_s"]
    path_floor = head["wall_s"] + warm["later_s"]
    cpu_floor = (head["cpu_s"] + parent["cpu_s"] + stack_cpu) / cpus
    print(
        f"  first stack: target {target:.1f} s (0.4 x {plain['first_s']:.1f}); "
        f"floor {max(path_floor, cpu_floor):.1f} s "
        f"= max(head alone + a later stack {path_floor:.1f} s, CPU-s (head + preload + stack) / {cpus} CPUs "
        f"{cpu_floor:.1f} s); the head alone is {head['wall_s'] / plain['first_s']:.2f}x the plain first stack"
    )
    if "mix_s" in plain:
        target = TARGETS["mix"] * plain["mix_s"]
        floor = (head["cpu_s"] + parent["cpu_s"] + MIX_SIZE * stack_cpu) / cpus
        print(
            f"  mix: plain {plain['mix_s']:.1f} s, warm {warm['mix_s']:.1f} s ({warm['mix_s'] / plain['mix_s']:.2f}x); "
            f"target {target:.1f} s (0.2x); CPU floor {floor:.1f} s = (head + preload + {MIX_SIZE} x a later stack's "
            f"{stack_cpu:.1f} CPU-s) / {cpus} CPUs; were nemo_gym's import shared, "
            f"{(head['cpu_s'] + parent['cpu_s'] + MIX_SIZE * (stack_cpu - gym_procs * imp['cpu_s'])) / cpus:.1f} s"
        )
    without = warm["later_added_pss_mib"] - gym_procs * imp["dirty_mib"]
    print(
        f"  a later stack adds {warm['later_added_pss_mib']:.0f} MiB PSS "
        f"(target <= {TARGETS['later_added_pss_mib']:.0f}); "
        f"less nemo_gym's import in its Gym processes it would be {without:.0f} MiB"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env", default="example_multi_step")
    parser.add_argument("--releases", default="0.4,0.7")
    parser.add_argument("--no-mix", action="store_true", help="skip the 8-environment mix (plain and warm)")
    add_json_flag(parser)
    args = parser.parse_args()
    runtimes = gym_runtimes(args.releases)
    load_before = os.getloadavg()[0]
    rows = {release: measure_release(args.env, python, not args.no_mix) for release, python in runtimes.items()}
    cpus = os.cpu_count() or 1
    print(f"\n{args.env}; load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    for release, row in rows.items():
        report(release, row, cpus)
    write_json(args.json, {"rows": rows, "cpus": cpus, "load_before": load_before})


if __name__ == "__main__":
    main()
