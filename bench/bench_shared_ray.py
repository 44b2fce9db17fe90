"""One Ray head per machine vs one per process: start time, processes and memory of a stack, side by side.

    .venv/bin/python bench/bench_shared_ray.py [--before REV] [--env example_multi_step] [--repeats 2]

Both designs run in this one run: "after" is this checkout; "before" is the tree at ``--before`` (default: the
commit before the machine's shared head), checked out with ``git worktree`` into a temporary folder and imported
from there. For each Gym runtime (nemo-gym 0.4 in this interpreter's venv, 0.7 in ``.venv-gym07`` when it exists):

- first: a fresh process starts a stack on a machine with no head of ours running (it starts the head too);
- later: a second process starts a stack while the first one holds its stack (an added env-server worker, or
  the next eval): after, it joins the first one's head; before, it starts a head of its own;
- added: what the second process's stack adds to the machine: the processes it started (its stack's, and before,
  its own Ray head's; not the process itself, which an env-server worker is either way) and their RSS and PSS
  (``/proc/PID/smaps_rollup``), read once it is ready;
- 2 procs PSS: everything of both processes, themselves included, and of the head(s).

Ready = ``GymStack.start()`` returned (every server answers). Each start is a new process; the heads folder is
a fresh one per repeat (``VERIFIERS_NEMO_RAY_DIR``), so "first" never finds a head left by another repeat.
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_json_flag, session_pids, write_json

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024 * 1024
DEFAULT_BEFORE = "0f518b6~1"
"""The last commit with a Ray head per process (0f518b6 made it one per machine)."""

_HOLDER = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from verifiers_nemo._gym.runtime import gym_root
    from verifiers_nemo._stack import GymStack, StackConfig
    env, python = sys.argv[1], sys.argv[2] or None
    config = gym_root(python) / "resources_servers" / env / "configs" / f"{env}.yaml"
    stack = GymStack(StackConfig(env, (config,), "http://127.0.0.1:9", gym_python=python))
    t = time.monotonic()
    stack.start()
    ready = time.monotonic() - t
    print(json.dumps({"ready_s": ready, "stack_sid": stack.launch.supervisor.pid, "head_sid": stack.ray_head.pid}),
          flush=True)
    sys.stdin.read()
    stack.stop()
    """
)


def _memory(pids: list[int]) -> tuple[int, int]:
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1]) * 1024
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1]) * 1024
        except OSError:
            continue
    return rss, pss


class Holder:
    """A process with one Gym stack, importing verifiers_nemo from ``tree``."""

    def __init__(self, tree: Path, env: str, python: str | None, heads_dir: Path) -> None:
        environ = dict(os.environ, PYTHONPATH=str(tree), VERIFIERS_NEMO_RAY_DIR=str(heads_dir))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, env, python or ""],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tree,
            env=environ,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the stack did not start in {tree} (exit {self.proc.wait()})")
        self.info = json.loads(line)

    def started_pids(self, head_is_own: bool) -> list[int]:
        """The processes this process started for its stack (and its head, when the head is its own)."""
        sids = [self.info["stack_sid"], *([self.info["head_sid"]] if head_is_own else [])]
        return session_pids(*sids)

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def measure(tree: Path, env: str, python: str | None, shared: bool) -> dict[str, float]:
    heads_dir = Path(tempfile.mkdtemp(prefix="vnr-b-"))
    first = second = None
    try:
        first = Holder(tree, env, python, heads_dir)
        second = Holder(tree, env, python, heads_dir)
        if shared:
            assert first.info["head_sid"] == second.info["head_sid"], "the second process did not join the head"
        added = second.started_pids(head_is_own=not shared)
        rss, pss = _memory(added)
        sids = {first.info[k] for k in ("stack_sid", "head_sid")} | {second.info[k] for k in ("stack_sid", "head_sid")}
        whole = _memory([first.proc.pid, second.proc.pid, *session_pids(*sids)])
        return {
            "first_s": first.info["ready_s"],
            "later_s": second.info["ready_s"],
            "added_processes": len(added),
            "added_rss_mib": rss / MIB,
            "added_pss_mib": pss / MIB,
            "two_processes_pss_mib": whole[1] / MIB,
        }
    finally:
        for holder in (second, first):
            if holder is not None:
                holder.close()
        time.sleep(2)  # the head stops within a poll of its last lease: no head of this repeat in the next
        shutil.rmtree(heads_dir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", default=DEFAULT_BEFORE, help="the git revision with a Ray head per process")
    parser.add_argument("--env", default="example_multi_step")
    parser.add_argument("--repeats", type=int, default=2)
    add_json_flag(parser)
    args = parser.parse_args()

    runtimes = {"0.4": None}
    gym07 = ROOT / ".venv-gym07" / "bin" / "python"
    if gym07.exists():
        runtimes["0.7"] = str(gym07)
    worktree = Path(tempfile.mkdtemp(prefix="bench-before-"))
    git = ["git", "-C", str(ROOT), "worktree"]
    subprocess.run([*git, "add", "-q", "--detach", str(worktree), args.before], check=True)
    rows: list[dict] = []
    try:
        for release, python in runtimes.items():
            for design, tree, shared in (("before", worktree, False), ("after", ROOT, True)):
                runs = [measure(tree, args.env, python, shared) for _ in range(args.repeats)]
                row = {"release": release, "design": design}
                row |= {key: statistics.median(run[key] for run in runs) for key in runs[0]}
                rows.append(row)
                print(json.dumps(row), flush=True)
    finally:
        subprocess.run([*git, "remove", "--force", str(worktree)], check=False)

    print(f"\n{args.env}, median of {args.repeats}; before = {args.before} (a Ray head per process), after = this tree")
    header = f"{'gym':<5}{'design':<8}{'first s':>9}{'later s':>9}{'added procs':>13}{'added RSS':>11}{'added PSS':>11}"
    print(header + f"{'2 procs PSS':>13}")
    for r in rows:
        print(
            f"{r['release']:<5}{r['design']:<8}{r['first_s']:>9.1f}{r['later_s']:>9.1f}{r['added_processes']:>13.0f}"
            f"{r['added_rss_mib']:>9.0f}Mi{r['added_pss_mib']:>9.0f}Mi{r['two_processes_pss_mib']:>11.0f}Mi"
        )
    write_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
