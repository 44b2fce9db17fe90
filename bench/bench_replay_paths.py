"""The two ways in to a replay, side by side over the catalogue, on both Gym releases: the CLI (`verifiers-nemo eval
ENV`, no `-b`: the replay policy, results saved) and the "Replay from Python" recipe of docs/guides/python.md run as
written (only the environment's name changed; `tests/e2e/docs_python.py` runs it as `python -m asyncio` would). For
each environment, each recorded row's outcome (error type, reward) of both; an environment where they differ on any
row is a disagreement. The count of disagreements must be 0.

    .venv/bin/python bench/bench_replay_paths.py [--releases 0.4 0.7] [--envs A B ...] [--jobs 2] [--json FILE]

Environments: every one of the release's catalogue with usable recordings and an agent, that is not broken as
packaged, needs no external service, and whose packages install here (tests/e2e/test_replay.py's CANNOT_START_HERE
left out), and not known not to reproduce as a whole (the CLI refuses those up front; a row known not to reproduce
is kept: both paths must agree on it too). Each path runs as its own
process, `--jobs` environments at a time (their stacks share the machine's Ray head for Gym stacks). Needs
`.venv-gym07` for 0.7 (`bash .ci/setup-gym07`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import add_json_flag, write_json  # noqa: E402

from tests.e2e.docs_python import doc_block  # noqa: E402
from tests.e2e.test_replay import CANNOT_START_HERE  # noqa: E402
from verifiers_nemo import NeMoGymTaskset, list_environments  # noqa: E402
from verifiers_nemo._gym import gym_root  # noqa: E402
from verifiers_nemo._replay import unreproducible_reason  # noqa: E402

RUNTIMES = {"0.4": ROOT / ".venv" / "bin" / "python", "0.7": ROOT / ".venv-gym07" / "bin" / "python"}
VERSIONS = {"0.4": "0.4.0", "0.7": "0.7.0"}
CLI = ROOT / ".venv" / "bin" / "verifiers-nemo"
RECIPE_ENV = "example_session_state_mgmt"
ROWS_LINE = "BENCH-ROWS "
LIMIT_S = 900

Rows = dict[int, tuple[str | None, float | None]]
"""Each recorded row's outcome: (error type or None, reward)."""


def environments(release: str) -> list[str]:
    """The environments the CLI replays on ``release`` (see the module docs)."""
    return sorted(
        e.name
        for e in list_environments(gym_root(str(RUNTIMES[release])))
        if e.has_example_rollouts
        and e.default_agent is not None
        and e.broken is None
        and not e.needs_external
        and e.name not in CANNOT_START_HERE
        and unreproducible_reason(e.name, gym_version=VERSIONS[release]) is None  # the CLI refuses those up front
    )


def recipe_for(env: str) -> str:
    """The docs' recipe, its environment renamed, and one line after it that prints what each row gave."""
    code = doc_block("ReplayServer.from_tasks")
    assert f'"{RECIPE_ENV}"' in code, "the docs' recipe names another environment: update RECIPE_ENV"
    shown = "{r.task_index: [r.error.type if r.error else None, r.reward] for r in results}"
    return code.replace(f'"{RECIPE_ENV}"', f'"{env}"') + f"\nimport json\nprint({ROWS_LINE!r} + json.dumps({shown}))\n"


async def _run(argv: list[str], env: dict[str, str], cwd: Path, stdin: str | None = None) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None), LIMIT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return -1, f"no answer within {LIMIT_S} s"
    return proc.returncode or 0, out.decode(errors="replace")


def _last_error(output: str) -> str:
    lines = [line for line in output.splitlines() if "error" in line.lower()] or output.splitlines() or ["?"]
    return lines[-1].strip()[:160]


async def via_cli(env_name: str, env: dict[str, str], folder: Path) -> Rows | str:
    out = folder / "cli"
    code, output = await _run([str(CLI), "eval", env_name, "-s", "-o", str(out)], env, folder)
    rows: Rows = {}
    for found in out.glob("*/*/results.jsonl"):
        for line in found.read_text().splitlines():
            record = json.loads(line)
            rows[record["task_index"]] = ((record.get("error") or {}).get("type"), record.get("reward"))
    return rows or f"exit {code}: {_last_error(output)}"  # no row: it did not run (its folder may be there)


async def via_recipe(env_name: str, env: dict[str, str], folder: Path) -> Rows | str:
    runner = [str(RUNTIMES["0.4"]), str(ROOT / "tests" / "e2e" / "docs_python.py")]
    code, output = await _run(runner, env, folder, stdin=recipe_for(env_name))
    line = next((line for line in output.splitlines() if line.startswith(ROWS_LINE)), None)
    if line is None:
        return f"exit {code}: {_last_error(output)}"
    return {int(k): (v[0], v[1]) for k, v in json.loads(line[len(ROWS_LINE) :]).items()}


def agree(a: Rows | str, b: Rows | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str)  # both refused: the same way in, the same answer
    if a.keys() != b.keys():
        return False
    for row in a:
        (error_a, reward_a), (error_b, reward_b) = a[row], b[row]
        if error_a != error_b:
            return False
        if (reward_a is None) != (reward_b is None) or (
            reward_a is not None and not math.isclose(float(reward_a), float(reward_b))  # type: ignore[arg-type]
        ):
            return False
    return True


def reproduced(rows: Rows | str, recorded: dict[int, Any]) -> str:
    if isinstance(rows, str):
        return "refused"
    same = sum(
        1
        for row, (error, reward) in rows.items()
        if error is None and reward is not None and math.isclose(float(reward), float(recorded.get(row, math.nan)))
    )
    return f"{same}/{len(recorded)}"


async def compare(release: str, names: list[str], jobs: int, scratch: Path) -> list[dict[str, Any]]:
    python = RUNTIMES[release]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["VERIFIERS_NEMO_GYM_PYTHON"] = str(python)
    gate = asyncio.Semaphore(jobs)
    root = gym_root(str(python))

    async def one(name: str) -> dict[str, Any]:
        async with gate:
            folder = scratch / release / name
            folder.mkdir(parents=True)
            started = time.monotonic()
            cli, recipe = await asyncio.gather(via_cli(name, env, folder), via_recipe(name, env, folder))
            recorded = {t.task_index: t.recorded_reward for t in NeMoGymTaskset(name, recorded=True, root=root)}
            row = {
                "env": name,
                "rows": len(recorded),
                "cli": reproduced(cli, recorded),
                "recipe": reproduced(recipe, recorded),
                "agree": agree(cli, recipe),
                "seconds": round(time.monotonic() - started, 1),
            }
            if not row["agree"]:
                row["detail"] = {"cli": cli, "recipe": recipe}
            print(
                f"  {release} {name:45s} cli {row['cli']:>7s} recipe {row['recipe']:>7s} "
                f"{'agree' if row['agree'] else 'DISAGREE'} ({row['seconds']:.0f} s)",
                flush=True,
            )
            return row

    return list(await asyncio.gather(*(one(name) for name in names)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES))
    parser.add_argument("--envs", nargs="+", help="these environments only (default: the catalogue's, see above)")
    parser.add_argument("--jobs", type=int, default=2, help="environments at a time (default 2)")
    add_json_flag(parser)
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-replay-paths-") as scratch:
        for release in args.releases:
            names = args.envs or environments(release)
            print(f"nemo-gym {release}: {len(names)} environments, CLI vs the docs' recipe", flush=True)
            rows = asyncio.run(compare(release, names, args.jobs, Path(scratch)))
            disagreeing = [r["env"] for r in rows if not r["agree"]]
            neither = [r["env"] for r in rows if r["cli"] == r["recipe"] == "refused"]
            figures[release] = {"environments": len(rows), "disagreeing": disagreeing, "neither_ran": neither}
            figures[release]["rows"] = rows
    print("\nrelease  environments  disagreeing  neither ran  (CLI vs the docs' Python recipe, every recorded row)")
    for release, result in figures.items():
        differ, neither = result["disagreeing"], result["neither_ran"]
        print(f"{release:8s} {result['environments']:12d}  {len(differ):11d}  {len(neither):11d}"
              f"  disagreeing: {', '.join(differ) or '-'}; neither ran: {', '.join(neither) or '-'}")  # fmt: skip
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
