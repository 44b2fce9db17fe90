"""Benchmark: latency the routing proxy adds to a policy call, and its memory at 4,096 open routes.

Run: ``.venv/bin/python bench/bench_proxy.py [--requests 8000] [--rounds 4]``

Method. Three processes, so that no two of the parts share one Python interpreter (and its GIL):

* an instant fake upstream (aiohttp; answers ``POST /v1/responses`` with a fixed, Gym-valid
  Responses object);
* the proxy (``RoutingProxy`` with 4,096 open routes to that upstream);
* this process, which plays the Gym agents: ``c`` callers, each sending its next request as soon as
  the previous answer is read (closed loop), over one aiohttp session. Every call is timed from
  send to the last byte of the answer.

For each concurrency the same load is sent straight to the upstream ("direct") and through the
proxy, in alternating rounds (direct first in even rounds, proxy first in odd ones) so that drift
hits both alike; "added" is via-proxy minus direct at the same percentile. A closed loop at high
concurrency measures saturation: latency there is mostly queueing (Little's law: callers /
throughput), so the table also gives a paced run, where the callers together offer a fixed rate
well below saturation, as a policy-bound Gym rollout does (a real model takes seconds per call).

Memory is the proxy process's RSS: after start, after opening 4,096 routes, and after one
recorded call on each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import add_json_flag, cpu_seconds, pct, rss_self, write_json  # noqa: E402

from verifiers_nemo import Endpoint, RoutingProxy  # noqa: E402
from verifiers_nemo._routing import ROUTE_METADATA_KEY  # noqa: E402

N_ROUTES = 4096
MODEL = "bench-model"
INPUT = [
    {"role": "developer", "content": "You are a helpful assistant. Use the tools when needed."},
    {"role": "user", "content": "What is the weather in Paris today, and should I take an umbrella?"},
]
REPLY = {
    "id": "resp_bench",
    "object": "response",
    "created_at": 1700000000.0,
    "model": MODEL,
    "status": "completed",
    "output": [
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "status": "completed",
            "content": [
                {
                    "type": "output_text",
                    "text": "Light rain is expected; take an umbrella.",
                    "annotations": [],
                }
            ],
        }
    ],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
    "usage": {
        "input_tokens": 48,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": 12,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": 60,
    },
}


# -- child processes ---------------------------------------------------------------------------


def serve_upstream() -> None:
    """Child: the instant fake upstream. Prints its port, serves until stdin closes."""
    from aiohttp import web

    body = json.dumps(REPLY).encode()

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=body, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/responses", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=4096)
        await site.start()
        print(json.dumps({"port": runner.addresses[0][1]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(main())


def serve_proxy(upstream_url: str, loop: str) -> None:
    """Child: the proxy with N_ROUTES routes. Prints port, keys and RSS; answers 'rss' on stdin."""
    rss_start = rss_self() / 2**20
    proxy = RoutingProxy(use_uvloop=loop == "uvloop").start()
    rss_started = rss_self() / 2**20
    endpoint = Endpoint(base_url=upstream_url, model=MODEL, api_key="sk-bench")
    routes = [proxy.open_route(endpoint) for _ in range(N_ROUTES)]
    rss_routes = rss_self() / 2**20
    warm = [proxy.open_route(endpoint) for _ in range(64)]
    info = {
        "port": proxy.port,
        "keys": [r.key for r in routes],
        "warm_keys": [r.key for r in warm],
        "rss_start": rss_start,
        "rss_started": rss_started,
        "rss_routes": rss_routes,
    }
    print(json.dumps(info), flush=True)
    for line in sys.stdin:
        if line.strip() == "rss":
            calls = sum(len(r.calls) for r in routes + warm)
            print(json.dumps({"rss": rss_self() / 2**20, "calls": calls}), flush=True)
    proxy.stop()


def spawn(*args: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = subprocess.Popen([sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    return proc, json.loads(proc.stdout.readline())


# -- load --------------------------------------------------------------------------------------


async def run_load(
    session: aiohttp.ClientSession,
    url: str,
    bodies: list[bytes],
    callers: int,
    total: int,
    rate: float | None,
) -> tuple[list[float], float]:
    """``callers`` closed-loop callers share ``total`` requests; with ``rate`` (requests/s in all)
    each caller waits for its next slot. Returns the latencies and the wall time."""
    latencies: list[float] = []
    per_caller = max(1, total // callers)
    headers = {"Content-Type": "application/json"}
    interval = callers / rate if rate else 0.0

    async def caller(index: int) -> None:
        rnd = random.Random(index)
        next_at = time.perf_counter() + rnd.uniform(0, interval)
        for i in range(per_caller):
            if interval:
                delay = next_at - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at += interval
            body = bodies[(index * per_caller + i) % len(bodies)]
            started = time.perf_counter()
            async with session.post(url, data=body, headers=headers) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")
            latencies.append(time.perf_counter() - started)

    started = time.perf_counter()
    await asyncio.gather(*(caller(i) for i in range(callers)))
    return latencies, time.perf_counter() - started


async def bench(args: argparse.Namespace) -> None:
    load_before = f"{os.getloadavg()[0]:.1f}"
    upstream, up = spawn("_upstream")
    upstream_url = f"http://127.0.0.1:{up['port']}/v1"
    proxy, info = spawn("_proxy", upstream_url, args.loop)
    proxy_url = f"http://127.0.0.1:{info['port']}/v1/responses"
    direct_url = f"{upstream_url}/responses"
    keys: list[str] = info["keys"]
    direct_bodies = [json.dumps({"model": MODEL, "input": INPUT}).encode()]
    proxy_bodies = [
        json.dumps({"model": k, "metadata": {ROUTE_METADATA_KEY: k}, "input": INPUT}).encode() for k in keys
    ]
    warm_bodies = [
        json.dumps({"model": k, "metadata": {ROUTE_METADATA_KEY: k}, "input": INPUT}).encode()
        for k in info["warm_keys"]
    ]

    def proxy_rss() -> dict[str, Any]:
        assert proxy.stdin is not None and proxy.stdout is not None
        proxy.stdin.write("rss\n")
        proxy.stdin.flush()
        return json.loads(proxy.stdout.readline())

    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            # Warm up (connections, lazily built validators) on routes of their own, then one call
            # on each of the 4,096 routes: the memory of 4,096 routes that each recorded a call.
            await run_load(session, proxy_url, warm_bodies, 64, 2048, None)
            await run_load(session, direct_url, direct_bodies, 64, 2048, None)
            warm = proxy_rss()
            await run_load(session, proxy_url, proxy_bodies, 64, len(proxy_bodies), None)
            after_calls = proxy_rss()

            rows = []
            scenarios: list[tuple[str, int, float | None, int]] = [
                ("1", 1, None, max(500, args.requests // 4)),
                ("64", 64, None, args.requests),
                ("256", 256, None, args.requests),
                (f"256 paced {args.rate:g}/s", 256, args.rate, int(args.rate * args.paced_seconds)),
            ]
            for label, callers, rate, total in scenarios:
                per_round = max(callers, total // args.rounds)
                lat: dict[str, list[float]] = {"direct": [], "proxy": []}
                wall = {"direct": 0.0, "proxy": 0.0}
                cpu = {"direct": 0.0, "proxy": 0.0}
                for r in range(args.rounds):
                    order = ("direct", "proxy") if r % 2 == 0 else ("proxy", "direct")
                    for mode in order:
                        url, bodies = (direct_url, direct_bodies) if mode == "direct" else (proxy_url, proxy_bodies)
                        # CPU of the process that answers the caller: the upstream, or the proxy.
                        pid = upstream.pid if mode == "direct" else proxy.pid
                        cpu_before = cpu_seconds(pid)
                        got, seconds = await run_load(session, url, bodies, callers, per_round, rate)
                        cpu[mode] += cpu_seconds(pid) - cpu_before
                        lat[mode] += got
                        wall[mode] += seconds
                rows.append((label, lat, wall, cpu))
    finally:
        for proc in (proxy, upstream):
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in (proxy, upstream):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(
        f"\nProxy added latency per policy call, ms ({os.cpu_count()} CPUs, Python {sys.version.split()[0]}, "
        f"proxy loop {args.loop}; load average {load_before} before, {os.getloadavg()[0]:.1f} after)"
    )
    head = (
        f"{'callers':>18} {'calls':>6} | {'direct p50':>10} {'p99':>7} {'req/s':>6} | "
        f"{'proxy p50':>9} {'p99':>7} {'req/s':>6} | {'added p50':>9} {'p99':>7} | {'CPU/call':>8} {'(upstr.)':>8}"
    )
    print(head)
    print("-" * len(head))
    figures: dict[str, Any] = {"rows": {}}
    for label, lat, wall, cpu in rows:
        d50, d99 = pct(lat["direct"], 0.50) * 1000, pct(lat["direct"], 0.99) * 1000
        p50, p99 = pct(lat["proxy"], 0.50) * 1000, pct(lat["proxy"], 0.99) * 1000
        d_rate = len(lat["direct"]) / wall["direct"]
        p_rate = len(lat["proxy"]) / wall["proxy"]
        proxy_cpu_us = cpu["proxy"] / len(lat["proxy"]) * 1e6
        upstream_cpu_us = cpu["direct"] / len(lat["direct"]) * 1e6
        print(
            f"{label:>18} {len(lat['proxy']):>6} | {d50:>10.2f} {d99:>7.2f} {d_rate:>6.0f} | "
            f"{p50:>9.2f} {p99:>7.2f} {p_rate:>6.0f} | {p50 - d50:>9.2f} {p99 - d99:>7.2f} | "
            f"{proxy_cpu_us:>5.0f} us {upstream_cpu_us:>5.0f} us"
        )
        figures["rows"][label.strip()] = {
            "calls": len(lat["proxy"]),
            "d50": d50,
            "d99": d99,
            "p50": p50,
            "p99": p99,
            "a50": p50 - d50,
            "a99": p99 - d99,
            "cpu": round(proxy_cpu_us),
        }
    print(
        "CPU/call: CPU time of the proxy process per proxied call (both of its HTTP legs); "
        "(upstr.): the fake upstream's per direct call, for scale."
    )
    mean_direct = statistics.mean(rows[0][1]["direct"]) * 1000
    mean_proxy = statistics.mean(rows[0][1]["proxy"]) * 1000
    print(f"\nsingle caller mean: direct {mean_direct:.3f} ms, via proxy {mean_proxy:.3f} ms")
    print("\nProxy process memory (RSS, MiB)")
    print(f"  interpreter + imports            {info['rss_start']:8.1f}")
    print(f"  proxy started                    {info['rss_started']:8.1f}")
    routes_delta = info["rss_routes"] - info["rss_started"]
    print(f"  + {N_ROUTES} open routes            {info['rss_routes']:8.1f}   (+{routes_delta:.1f})")
    print(f"  after warm-up (other routes)     {warm['rss']:8.1f}")
    calls_delta = after_calls["rss"] - warm["rss"]
    print(
        f"  + one recorded call per route    {after_calls['rss']:8.1f}   (+{calls_delta:.1f}, "
        f"{after_calls['calls'] - warm['calls']} calls)"
    )
    figures.update(routes=N_ROUTES, routes_mb=round(routes_delta, 1), calls_mb=round(calls_delta, 1))
    write_json(args.json, figures)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_upstream":
        return serve_upstream()
    if len(sys.argv) > 1 and sys.argv[1] == "_proxy":
        return serve_proxy(sys.argv[2], sys.argv[3])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=8000, help="calls per mode per concurrency (closed loop)")
    parser.add_argument("--rounds", type=int, default=4, help="alternating direct/proxy rounds")
    parser.add_argument("--rate", type=float, default=500.0, help="offered requests/s of the paced run")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the proxy's event loop")
    parser.add_argument("--paced-seconds", type=float, default=8.0, help="duration of the paced run per mode")
    add_json_flag(parser)
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
