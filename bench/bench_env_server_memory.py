"""Memory of a long run of `nemo-gym-env` in verifiers' env server, and who keeps what per episode (issue 37).

    .venv/bin/python bench/bench_env_server_memory.py [--batches 10] [--batch 1000] [--traced-batches 3]
                                                      [--traced-batch 500] [--env example_multi_step]

The server is prime-rl's env server (`tests/e2e/env_server_driver.py serve`, verifiers 0.4.0's `serve_env`, one
static worker: the server process runs the environment and its Gym stack), driven by prime-rl's orchestrator
side (`... client`, chat API) against an instant scripted upstream (`bench_env_server.py`'s, no delay), as
`bench_env_server.py` drives it. After a warm-up batch, ``--batches`` batches of ``--batch`` episodes are sent,
each all at once; after each, the server process's RSS (itself, not its Gym stack) is read, and the growth per
episode is the least-squares slope over the batches.

A second server, run with Python's allocations traced (`_env_server_traced.py`: ``tracemalloc``, one frame),
takes ``--traced-batches`` batches; the bytes still held after a full collection, by the source file that
allocated them, are read after the first batch and after the last, and the difference per episode is split
into our code (``verifiers_nemo``), verifiers (``verifiers/``) and everything else (the standard library,
zmq, msgpack, pydantic, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tests.e2e.env_server_harness as harness  # noqa: E402
from bench._common import add_json_flag, write_json  # noqa: E402
from bench.bench_env_server import UpstreamThread  # noqa: E402
from tests.e2e.env_server_harness import EpisodeClient, ServedEnv, env_config  # noqa: E402
from verifiers_nemo._stack.procs import rss_bytes  # noqa: E402

TRACED_DRIVER = Path(__file__).with_name("_env_server_traced.py")
MIB = 1024 * 1024


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys over xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _serve(tmp: Path, config: dict[str, Any], trace_dir: Path | None) -> ServedEnv:
    harness.DRIVER = TRACED_DRIVER  # the driver as it is, run by a wrapper that can trace allocations
    if trace_dir is not None:
        os.environ["BENCH_TRACE_DIR"] = str(trace_dir)
    try:
        return ServedEnv(tmp, config, pool="static", workers=1)
    finally:
        os.environ.pop("BENCH_TRACE_DIR", None)


def _run_batch(client: EpisodeClient, name: str, count: int) -> tuple[int, float]:
    started = time.monotonic()
    client.send(name, count)
    done = client.wait_episodes(name, count, 3600)
    return sum(e["outcome"] == "ok" for e in done), time.monotonic() - started


def soak(tmp: Path, config: dict[str, Any], upstream: str, batches: int, batch: int) -> dict[str, Any]:
    served = _serve(tmp / "soak", config, None)
    client = None
    try:
        client = EpisodeClient(tmp / "soak", served.address, config, upstream)
        _run_batch(client, "warm-up", batch // 4)
        rss_warm = rss_bytes([served.pid])
        points, ok, seconds = [], 0, 0.0
        for index in range(batches):
            good, took = _run_batch(client, f"b{index}", batch)
            ok, seconds = ok + good, seconds + took
            points.append(((index + 1) * batch, rss_bytes([served.pid])))
            print(f"  soak: {points[-1][0]:,} episodes, server RSS {points[-1][1] / MIB:.1f} MiB", flush=True)
    finally:
        if client is not None:
            client.close()
        served.stop()
    xs, ys = [float(x) for x, _ in points[1:]], [float(y) for _, y in points[1:]]
    return {
        "episodes": batches * batch,
        "ok": ok,
        "episodes_per_s": batches * batch / seconds,
        "rss_warm_mib": rss_warm / MIB,
        "rss_mib": [y / MIB for _, y in points],
        "bytes_per_episode": slope(xs, ys) if len(xs) > 1 else None,
    }


def _snapshot(trace_dir: Path, pid: int, name: str) -> dict[str, int]:
    (trace_dir / f"{pid}.want-{name}").touch()
    answer = trace_dir / f"{pid}.{name}.json"
    harness.wait_for(answer.exists, 600, f"the traced server's {name} snapshot")
    return json.loads(answer.read_text())


def _package(filename: str) -> str:
    if "/verifiers_nemo/" in filename:
        return "verifiers_nemo (ours)"
    if "/site-packages/verifiers/" in filename:
        return "verifiers"
    return "other (stdlib, zmq, msgpack, pydantic, ...)"


def traced(tmp: Path, config: dict[str, Any], upstream: str, batches: int, batch: int) -> dict[str, Any]:
    trace_dir = tmp / "traces"
    trace_dir.mkdir()
    served = _serve(tmp / "traced", config, trace_dir)
    client = None
    try:
        client = EpisodeClient(tmp / "traced", served.address, config, upstream)
        _run_batch(client, "warm-up", batch)
        before = _snapshot(trace_dir, served.pid, "before")
        ok = 0
        for index in range(batches):
            good, _ = _run_batch(client, f"t{index}", batch)
            ok += good
            print(f"  traced: {(index + 1) * batch:,} episodes", flush=True)
        after = _snapshot(trace_dir, served.pid, "after")
    finally:
        if client is not None:
            client.close()
        served.stop()
    episodes = batches * batch
    by_package: dict[str, float] = {}
    by_file: dict[str, float] = {}
    for filename in set(before) | set(after):
        if filename.endswith(("_env_server_traced.py", "tracemalloc.py")):
            continue  # the tracer's own snapshot
        grown = after.get(filename, 0) - before.get(filename, 0)
        by_package[_package(filename)] = by_package.get(_package(filename), 0.0) + grown / episodes
        by_file[filename] = grown / episodes
    top = sorted(by_file.items(), key=lambda item: -abs(item[1]))[:12]
    return {"episodes": episodes, "ok": ok, "bytes_per_episode": by_package, "top_files": top}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--traced-batches", type=int, default=3, help="0: no traced run")
    parser.add_argument("--traced-batch", type=int, default=500)
    parser.add_argument("--env", default="example_multi_step")
    add_json_flag(parser)
    args = parser.parse_args()
    config = env_config(args.env, api="chat")
    with tempfile.TemporaryDirectory(prefix="bench-env-server-memory-") as tmp, UpstreamThread(0.0) as up:
        plain = soak(Path(tmp), config, up.policy.base_url, args.batches, args.batch)
        traces = (
            traced(Path(tmp), config, up.policy.base_url, args.traced_batches, args.traced_batch)
            if args.traced_batches
            else None
        )
    print(f"\n{args.env} in verifiers' env server (one static worker), chat API, instant upstream")
    per = plain["bytes_per_episode"]
    print(
        f"soak: {plain['ok']:,}/{plain['episodes']:,} episodes ok, {plain['episodes_per_s']:.1f} episodes/s; "
        f"server RSS {plain['rss_warm_mib']:.1f} MiB after warm-up -> {plain['rss_mib'][-1]:.1f} MiB; "
        f"growth {per / 1024:.2f} KiB per episode (slope over batches 2..{args.batches})"
        if per is not None
        else "soak: too few batches for a slope"
    )
    if traces is not None:
        ok = f"{traces['ok']:,}/{traces['episodes']:,} ok"
        print(f"traced ({ok}): Python bytes still held per episode, by who allocated")
        for package, value in sorted(traces["bytes_per_episode"].items()):
            print(f"  {package:<45} {value:>10.1f} B/episode")
        print("  largest growth by file (B/episode):")
        for filename, value in traces["top_files"]:
            print(f"    {value:>10.1f}  {filename}")
    write_json(args.json, {"soak": plain, "traced": traces})


if __name__ == "__main__":
    main()
