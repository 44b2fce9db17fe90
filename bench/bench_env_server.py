"""Episodes per second and memory per worker of `nemo-gym-env` served by verifiers' env server, as prime-rl
serves it, for 1, 2 and 4 workers.

    .venv/bin/python bench/bench_env_server.py [--workers 1,2,4] [--episodes 200] [--delay-ms 200]
                                               [--env example_multi_step] [--json PATH]

Method. One fake OpenAI-compatible upstream in this process (`tests/e2e/policies.py` `DualApiPolicy`, the
scripted policy that solves example_multi_step in 3-4 calls, speaking chat and Responses) that waits
``--delay-ms`` before every answer: a wait-bound model. For each worker count N: verifiers 0.4.0's
`serve_env` with a static pool of N pre-spawned workers (prime-rl's ``serve.pool.type = "static"``,
``num_workers = N``), each worker a spawned process running its own Gym stack, started from the verifiers
venv (`tests/e2e/env_server_driver.py serve`); the orchestrator's side is another process of that venv
(`... client`: `vf.load_taskset`, one `EnvClient`, every episode its task's data; chat API, as prime-rl
trains). A warm-up batch of 4 x N episodes waits until every worker has its stack up; then ``--episodes``
episodes are sent at once (all in flight together) and timed from the send to the last reply.
Memory: every second during the timed batch, the resident memory (RSS, shared pages counted in every
process, as `ps` shows) and the proportional share (PSS, shared pages split among their users: what the
processes cost the machine) of each worker's whole process tree (the worker, its Gym stack's supervisor,
ng_run, servers, and its Ray head's processes); the peak is reported, and the process count.
The figures depend on the machine's load: run it on a quiet machine, and compare only runs of one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiohttp import web  # noqa: E402

from bench._common import add_json_flag, pct, write_json  # noqa: E402
from tests.e2e.env_server_harness import (  # noqa: E402
    EpisodeClient,
    ServedEnv,
    descendants,
    env_config,
    wait_for,
)
from tests.e2e.policies import DualApiPolicy  # noqa: E402
from verifiers_nemo._stack.procs import rss_bytes  # noqa: E402

MIB = 1024 * 1024


class SlowPolicy(DualApiPolicy):
    """The scripted policy, answering each call after ``delay`` seconds."""

    def __init__(self, delay: float) -> None:
        super().__init__()
        self.delay = delay

    async def _responses(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        return await super()._responses(request)

    async def _chat(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.delay)
        return await super()._chat(request)


class UpstreamThread:
    """The upstream on an event loop of its own thread (the rest of the bench blocks)."""

    def __init__(self, delay: float) -> None:
        self.policy = SlowPolicy(delay)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with self.policy:
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> UpstreamThread:
        self._thread.start()
        self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


def pss_bytes(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1]) * 1024
                        break
        except OSError:
            continue
    return total


class MemorySampler:
    """Peak RSS / PSS and process count of each worker's tree, sampled every second."""

    def __init__(self, served: ServedEnv, workers: list[int]) -> None:
        self.served = served
        self.workers = workers
        self.peak = {w: {"rss": 0, "pss": 0, "processes": 0} for w in workers}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        for worker in self.workers:
            # its Gym stack: its descendants when started plain, forks of the warm parent when started warm
            tree = sorted({worker, *descendants(worker), *self.served.stack_pids(worker)})
            peak = self.peak[worker]
            peak["rss"] = max(peak["rss"], rss_bytes(tree))
            peak["pss"] = max(peak["pss"], pss_bytes(tree))
            peak["processes"] = max(peak["processes"], len(tree))

    def _run(self) -> None:
        while not self._done.wait(1.0):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def measure(workers: int, episodes: int, upstream: str, env: str, tmp: Path) -> dict[str, Any]:
    config = env_config(env, api="chat")
    started = time.monotonic()
    served = ServedEnv(tmp / f"w{workers}", config, pool="static", workers=workers)
    client = None
    try:
        client = EpisodeClient(tmp / f"w{workers}", served.address, config, upstream)
        client.send("warm-up", 4 * workers)
        warm = client.wait_episodes("warm-up", 4 * workers, 1800)
        ready_s = time.monotonic() - started
        pids = served.workers() if workers > 1 else [served.pid]
        assert len(pids) == workers, pids
        with MemorySampler(served, pids) as memory:
            sent = client.send("timed", episodes)
            done = client.wait_episodes("timed", episodes, 3600)
            elapsed = max(e["elapsed_s"] for e in done)
            wall = time.monotonic() - sent
        ok = [e for e in done if e["outcome"] == "ok"]
        latencies = [e["elapsed_s"] for e in done]
        figures = {
            "workers": workers,
            "episodes": episodes,
            "ok": len(ok),
            "warm_up_ok": sum(e["outcome"] == "ok" for e in warm),
            "ready_s": ready_s,
            "seconds": elapsed,
            "wall_s": wall,
            "episodes_per_s": episodes / elapsed,
            "latency_p50_s": pct(latencies, 0.5),
            "latency_p95_s": pct(latencies, 0.95),
            "latency_mean_s": statistics.fmean(latencies),
            "worker_rss_mib": [memory.peak[w]["rss"] / MIB for w in pids],
            "worker_pss_mib": [memory.peak[w]["pss"] / MIB for w in pids],
            "worker_processes": [memory.peak[w]["processes"] for w in pids],
            "broker_rss_mib": rss_bytes([served.pid]) / MIB if workers > 1 else 0.0,
            "errors": sorted({err for e in done for err in e.get("errors", [])})[:5],
        }
    finally:
        if client is not None:
            client.close()
        stop_s = served.stop()
    figures["stop_s"] = stop_s
    try:
        wait_for(lambda: not served.left_behind(), 120, "the server's processes gone")
    except AssertionError:
        pass
    figures["left_behind"] = served.left_behind()
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", default="1,2,4", help="worker counts, comma-separated")
    parser.add_argument("--episodes", type=int, default=200, help="episodes in flight at once per point")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the upstream's wait per model call")
    parser.add_argument("--env", default="example_multi_step")
    add_json_flag(parser)
    args = parser.parse_args()
    counts = [int(n) for n in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-env-server-") as tmp, UpstreamThread(args.delay_ms / 1000) as up:
        for workers in counts:
            row = measure(workers, args.episodes, up.policy.base_url, args.env, Path(tmp))
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(
        f"\n{args.env}, {args.episodes} episodes at once, upstream {args.delay_ms:g} ms per call, chat API; "
        "static pool (prime-rl serve.pool.type = static)"
    )
    header = f"{'workers':>7} {'ok':>9} {'ep/s':>6} {'ep/s/worker':>11} {'p50 s':>6} {'p95 s':>6} "
    print(header + f"{'RSS/worker MiB':>15} {'PSS/worker MiB':>15} {'procs/worker':>12} {'ready s':>8}")
    for row in rows:
        rss = statistics.fmean(row["worker_rss_mib"])
        pss = statistics.fmean(row["worker_pss_mib"])
        print(
            f"{row['workers']:>7} {row['ok']:>4}/{row['episodes']:<4} {row['episodes_per_s']:>6.2f} "
            f"{row['episodes_per_s'] / row['workers']:>11.2f} "
            f"{row['latency_p50_s']:>6.1f} {row['latency_p95_s']:>6.1f} "
            f"{rss:>15.0f} {pss:>15.0f} {max(row['worker_processes']):>12} {row['ready_s']:>8.0f}"
        )
    write_json(args.json, {"env_server": rows, "delay_ms": args.delay_ms, "episodes": args.episodes})


if __name__ == "__main__":
    main()
