"""Exact-token mode vs the chat endpoint on a real vLLM, side by side in one run: latency per turn, where exact
mode spends it (render / generate / derender), and token contiguity of multi-turn tool rollouts.

    .venv/bin/python bench/bench_exact_tokens.py      # starts the real-model server (.ci/setup-real-model)
    .venv/bin/python bench/bench_exact_tokens.py --base-url http://127.0.0.1:8000/v1 --model smol

Both modes go through the same recording proxy to the same server, one rollout of each mode per (task, seed), in
alternating order, with the same requests (``tool_choice: required``, fixed seeds): every figure is from this run.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_json_flag, pct, write_json

from tests.realmodel.rollouts import TASKS, RecordingProxy, tool_rollout
from tests.realmodel.server import find_build, serve
from verifiers_nemo import check_contiguity
from verifiers_nemo._routing.trace import PolicyCall
from verifiers_nemo._upstreams import ChatCompletionsUpstream
from verifiers_nemo._upstreams.exact_tokens import ExactTokensUpstream

ROUTES = {
    "/v1/chat/completions/render": "render",
    "/inference/v1/generate": "generate",
    "/v1/chat/completions/derender": "derender",
    "/v1/chat/completions": "chat",
}


async def run(root: str, model: str, seeds: list[int], max_tokens: int, turns: int) -> dict[str, Any]:
    calls: dict[str, list[list[PolicyCall]]] = {"exact": [], "chat": []}
    route_seconds: dict[str, list[float]] = {name: [] for name in ROUTES.values()}
    async with aiohttp.ClientSession() as session, RecordingProxy(root, session) as proxy:
        endpoints = {
            "exact": proxy.endpoint(model, api="chat"),
            "chat": proxy.endpoint(model, api="chat", return_tokens=True),
        }
        order = ["exact", "chat"]
        for task, make in TASKS.items():
            for seed in seeds:
                for mode in order:
                    upstream = ExactTokensUpstream() if mode == "exact" else ChatCompletionsUpstream()
                    rollout = await tool_rollout(upstream, session, endpoints[mode], make(max_tokens, seed), turns)
                    calls[mode].append(rollout)
                    print(
                        f"  {task:8} seed {seed} {mode:5}: {len(rollout)} turns, {check_contiguity(rollout).message}",
                        file=sys.stderr,
                    )
                order.reverse()
        for exchange in proxy.exchanges:
            route_seconds[ROUTES.get(exchange["path"], exchange["path"])].append(exchange["seconds"])

    figures: dict[str, Any] = {"max_tokens": max_tokens, "max_turns": turns, "seeds": seeds, "modes": {}}
    for mode, rollouts in calls.items():
        flat = [call for rollout in rollouts for call in rollout]
        latency = [call.latency_s for call in flat]
        per_token = [call.latency_s / max(1, len(call.completion_token_ids or ())) for call in flat]
        later = [call.latency_s for call in flat if call.index > 0]
        multi = [rollout for rollout in rollouts if len(rollout) >= 2]
        figures["modes"][mode] = {
            "rollouts": len(rollouts),
            "turns": len(flat),
            "multi_turn_rollouts": len(multi),
            "contiguous_multi_turn_rollouts": sum(bool(check_contiguity(r)) for r in multi),
            "turn_s_mean": statistics.fmean(latency),
            "turn_s_p50": pct(latency, 0.5),
            "turn_s_max": max(latency),
            "later_turn_s_mean": statistics.fmean(later) if later else float("nan"),
            "ms_per_completion_token_mean": 1000 * statistics.fmean(per_token),
            "completion_tokens_mean": statistics.fmean(len(c.completion_token_ids or ()) for c in flat),
            "prompt_tokens_mean": statistics.fmean(len(c.prompt_token_ids or ()) for c in flat),
        }
    figures["routes"] = {
        name: {"calls": len(values), "s_mean": statistics.fmean(values), "s_total": sum(values)}
        for name, values in route_seconds.items()
        if values
    }
    return figures


def report(figures: dict[str, Any]) -> None:
    modes = figures["modes"]
    print(f"\nExact tokens vs chat endpoint ({figures['max_tokens']} max tokens, <= {figures['max_turns']} turns)")
    rows = [
        ("rollouts (multi-turn)", lambda m: f"{m['rollouts']} ({m['multi_turn_rollouts']})"),
        ("contiguous multi-turn", lambda m: f"{m['contiguous_multi_turn_rollouts']}/{m['multi_turn_rollouts']}"),
        ("turns", lambda m: str(m["turns"])),
        ("latency per turn, mean", lambda m: f"{m['turn_s_mean']:.2f} s"),
        ("latency per turn, p50", lambda m: f"{m['turn_s_p50']:.2f} s"),
        ("latency per later turn, mean", lambda m: f"{m['later_turn_s_mean']:.2f} s"),
        ("per completion token, mean", lambda m: f"{m['ms_per_completion_token_mean']:.0f} ms"),
        ("completion tokens per turn", lambda m: f"{m['completion_tokens_mean']:.1f}"),
        ("prompt tokens per turn", lambda m: f"{m['prompt_tokens_mean']:.0f}"),
    ]
    print(f"  {'':30} {'exact':>12} {'chat':>12}")
    for label, cell in rows:
        print(f"  {label:30} {cell(modes['exact']):>12} {cell(modes['chat']):>12}")
    ratio = modes["exact"]["turn_s_mean"] / modes["chat"]["turn_s_mean"]
    print(f"  exact / chat latency per turn: {ratio:.2f}x")
    print("  time per route (through the recording proxy):")
    for name, route in figures["routes"].items():
        mean_ms, total = 1000 * route["s_mean"], route["s_total"]
        print(f"    {name:9} {route['calls']:4} calls, {mean_ms:8.1f} ms mean, {total:7.1f} s total")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", help="a running vLLM (>= 0.32, --enable-scale-out); default: start one")
    parser.add_argument("--model", default="smol")
    parser.add_argument("--seeds", type=int, default=3, help="rollouts per task and mode")
    parser.add_argument("--max-tokens", type=int, default=80)
    parser.add_argument("--turns", type=int, default=3)
    add_json_flag(parser)
    args = parser.parse_args()
    seeds = list(range(1, args.seeds + 1))
    t0 = time.perf_counter()
    if args.base_url:
        root = args.base_url.rstrip("/").removesuffix("/v1")
        figures = asyncio.run(run(root, args.model, seeds, args.max_tokens, args.turns))
    else:
        with tempfile.TemporaryDirectory() as tmp, serve(find_build(), Path(tmp) / "server.log") as server:
            print(f"server started in {server.start_s:.1f} s", file=sys.stderr)
            figures = asyncio.run(run(server.root_url, server.model, seeds, args.max_tokens, args.turns))
            figures["server_start_s"] = server.start_s
    figures["wall_s"] = time.perf_counter() - t0
    report(figures)
    if "server_start_s" in figures:
        print(f"  server start: {figures['server_start_s']:.1f} s; whole run {figures['wall_s']:.0f} s")
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
