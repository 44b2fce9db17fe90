"""Rollout throughput, latency, memory and scaling: NeMoGymHarness vs nemo-gym's ``ng_collect_rollouts``.

    .venv/bin/python bench/bench_throughput.py [--envs example_single_tool_call,example_multi_step]
                                               [--concurrency 1,64,256,1024] [--scaling-max 4096]
                                               [--memory 1000,4096] [--json PATH]

Method. One fake upstream process (aiohttp on 127.0.0.1) answers ``POST /v1/responses`` instantly,
and ``POST /lat<ms>/v1/responses`` after ``<ms>`` milliseconds, with a scripted policy that solves
the environment (single tool call: ``get_weather`` then an answer; multi-step: every
``get_synonym_value``, then ``extract_synonym_values``, then an answer; session state: the counter
policy of ``tests/e2e/policies.py``). Both sides talk to that same process:

* ours: ``NeMoGymHarness(env)`` in this process (its stack: ng_run with the routing proxy as
  ``policy_model``), ``harness.run(taskset, endpoint, concurrency=c)``, timed from the call to the
  last result;
* stock: ``ng_run`` with the environment's config and Gym's own ``openai_model`` policy config
  (``+policy_base_url`` = the fake upstream; per-server venvs linked to this interpreter with
  ``+skip_venv_if_present``, as GymStack does), and the ``ng_collect_rollouts`` CLI, timed from its
  "Querying with N concurrent requests" line (printed just before dispatch) to its "Sorting results"
  line (printed after the last rollout is written); its start-up, row materialisation and aggregation
  are not counted.

Both stacks run during the whole benchmark and the two sides alternate, swapping which goes first at
each row, so that machine drift hits both alike. A point runs ``max(--min-rollouts, --factor x c)``
rollouts (200, 200, 256, 1,024 by default: from c = 256 on, one full wave of ``c`` rollouts started
together) of rows generated from the environment's ``example.jsonl`` (one JSONL, read by both sides).
Every run also records the CPU time of each process involved (client, Gym servers, Ray, upstream):
on a shared machine CPU per rollout moves much less with other people's load than rollouts/s do.

Sections: (1) throughput per concurrency with the ratio harness / ng_collect_rollouts, and (1b) CPU
per rollout by process; (2) latency per rollout at concurrency 1 against a direct agent ``POST /run``
(the floor: a row carrying a route key posted straight to the agent of our stack; and the plain row
posted to the stock stack's agent); (5) memory: this process's RSS (harness + proxy; results are
counted and dropped) and the stack's RSS, idle and with 1,000 / 4,096 rollouts started at once
against the slow upstream; (6) scaling: harness throughput as concurrency doubles from 1 to
``--scaling-max`` (first environment; points measured above are reused, the 4,096 one from the memory
run: at that concurrency the stack is CPU-bound, so the upstream's 200 ms do not change the rate).
Generated files live in a temporary directory that is deleted at the end; the stock stack is stopped
with its whole process session.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from _common import add_json_flag, cpu_seconds, pct, rss_self, write_json  # noqa: E402

from verifiers_nemo import Endpoint, NeMoGymHarness, NeMoGymTaskset  # noqa: E402
from verifiers_nemo._gym.config import merged_configs, server_instances  # noqa: E402
from verifiers_nemo._gym.runtime import cache_dir, find_gym_runtime  # noqa: E402
from verifiers_nemo._routing import ROUTE_METADATA_KEY  # noqa: E402
from verifiers_nemo._stack.procs import http_ok as _http_ok  # noqa: E402
from verifiers_nemo._stack.procs import kill_session, reserve_ports, rss_bytes, session_pids  # noqa: E402

MODEL = "bench-policy"
HOST = "127.0.0.1"

# -- the fake upstream (a child process) ---------------------------------------------------------------


def serve_upstream() -> None:
    """Child: scripted Responses policies for the example envs. Prints its port; serves until stdin closes."""
    import orjson
    from aiohttp import web

    from tests.e2e.policies import counter_policy

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass

    ids = itertools.count()
    root = find_gym_runtime().root
    synonyms: dict[str, list[str]] = {}
    with open(root / "resources_servers" / "example_multi_step" / "data" / "example.jsonl") as f:
        for line in f:
            row = json.loads(line)
            synonyms[_user_text(row["responses_create_params"])] = row["expected_synonyms"]

    def message(text: str) -> dict[str, Any]:
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return {"type": "message", "id": f"msg_{next(ids)}", "role": "assistant", "status": "completed",
                "content": content}  # fmt: skip

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        n = next(ids)
        return {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": name,
                "arguments": json.dumps(arguments), "status": "completed"}  # fmt: skip

    async def policy(body: dict[str, Any]) -> list[dict[str, Any]]:
        tools = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict)}
        items = body["input"] if isinstance(body.get("input"), list) else []
        done = [i["output"] for i in items if isinstance(i, dict) and i.get("type") == "function_call_output"]
        if "get_weather" in tools:
            return [call("get_weather", {"city": "San Francisco"})] if not done else [message("Cold; take a coat.")]
        if "increment_counter" in tools:
            return await counter_policy(body, None)  # type: ignore[arg-type]
        if "get_synonym_value" in tools:
            wanted = synonyms.get(_user_text(body), [])
            if not done and wanted:
                return [call("get_synonym_value", {"synonym": s}) for s in wanted]
            if len(done) == len(wanted):
                values = [json.loads(out)["synonym_value"] for out in done]
                return [call("extract_synonym_values", {"synonym_values": values})]
        return [message("Done.")]

    async def answer(request: web.Request) -> web.Response:
        body = orjson.loads(await request.read())
        output = await policy(body)
        delay = request.match_info.get("ms")
        if delay:
            await asyncio.sleep(int(delay) / 1000)
        reply = {
            "id": f"resp_{next(ids)}", "object": "response", "created_at": time.time(), "model": body.get("model"),
            "status": "completed", "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
            "tools": body.get("tools") or [],
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
                      "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}},
        }  # fmt: skip
        return web.Response(body=orjson.dumps(reply), content_type="application/json")

    async def main() -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_post("/v1/responses", answer)
        app.router.add_post("/lat{ms:\\d+}/v1/responses", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, HOST, 0, backlog=8192)
        await site.start()
        print(json.dumps({"port": runner.addresses[0][1]}), flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await runner.cleanup()

    asyncio.run(main())


def _user_text(params: dict[str, Any]) -> str:
    items = params.get("input")
    if isinstance(items, str):
        return items
    for item in items or []:
        if isinstance(item, dict) and item.get("role") == "user" and isinstance(item.get("content"), str):
            return item["content"]
    return ""


# -- measurements ------------------------------------------------------------------------------------------


@dataclass
class Batch:
    """One side's run of one point."""

    rollouts: int
    seconds: float
    errors: Counter[str] = field(default_factory=Counter)
    reward_sum: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds per kind of process during the run."""

    @property
    def rate(self) -> float:
        return self.rollouts / self.seconds if self.seconds > 0 else float("nan")

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    @property
    def busy(self) -> float:
        """Share of the machine's CPUs the measured processes used during the run."""
        return sum(self.cpu.values()) / (self.seconds * (os.cpu_count() or 1)) if self.seconds > 0 else float("nan")

    def cpu_ms(self) -> dict[str, float]:
        """CPU milliseconds per rollout, per kind of process."""
        return {kind: seconds * 1000 / self.rollouts for kind, seconds in self.cpu.items()}

    @property
    def reward_mean(self) -> float:
        ok = self.rollouts - self.n_errors
        return self.reward_sum / ok if ok else float("nan")


def pooled(batches: list[Batch]) -> Batch:
    """Several runs of one side as one: rollouts, seconds, errors, rewards and CPU summed."""
    total = Batch(0, 0.0)
    for batch in batches:
        total.rollouts += batch.rollouts
        total.seconds += batch.seconds
        total.errors.update(batch.errors)
        total.reward_sum += batch.reward_sum
        for kind, seconds in batch.cpu.items():
            total.cpu[kind] = total.cpu.get(kind, 0.0) + seconds
    return total


_KINDS = (
    ("/responses_api_models/", "policy server"),
    ("/responses_api_agents/", "Gym agent"),
    ("/resources_servers/", "resources server"),
)


def process_kind(pid: int) -> str:
    """What a stack process is: a Gym server (by its directory), or ng_run / Ray / the head server."""
    try:
        cwd = os.readlink(f"/proc/{pid}/cwd") + "/"
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return "gone"
    if b"app.py" in cmd:
        for marker, kind in _KINDS:
            if marker in cwd:
                return kind
    return "ng_run + Ray"


class CpuMeter:
    """CPU seconds used by each kind of process between ``__init__`` and ``stop()``."""

    def __init__(self, pids: dict[int, str]) -> None:
        self.pids = pids
        self.start = self._read()

    def _read(self) -> Counter[str]:
        used: Counter[str] = Counter()
        for pid, kind in self.pids.items():
            used[kind] += cpu_seconds(pid)
        return used

    def stop(self) -> dict[str, float]:
        end = self._read()
        return {kind: end[kind] - self.start[kind] for kind in end}


def listen_overflows() -> int:
    """The kernel's count of connections dropped because a listen queue was full (whole machine)."""
    with open("/proc/net/netstat") as f:
        rows = [line.split() for line in f if line.startswith("TcpExt:")]
    return int(dict(zip(rows[0], rows[1], strict=True)).get("ListenOverflows", 0)) if len(rows) >= 2 else 0


def gym_env_vars(runtime: Any) -> dict[str, str]:
    """Environment for stock Gym commands: uv must find the base interpreter (no downloads here)."""
    base = subprocess.run(
        [str(runtime.python), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    env = dict(os.environ, PATH=f"{base}/bin:{runtime.bin_dir}:{os.environ['PATH']}", UV_PYTHON_DOWNLOADS="never")
    env.update(RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("VIRTUAL_ENV", None)
    return env


class StockStack:
    """nemo-gym's own way: ``ng_run`` (env config + ``openai_model``) and ``ng_collect_rollouts``."""

    def __init__(self, env: str, policy_base_url: str, workdir: Path) -> None:
        self.runtime = find_gym_runtime()
        self.env = env
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        config = self.runtime.root / "resources_servers" / env / "configs" / f"{env}.yaml"
        policy = self.runtime.root / "responses_api_models" / "openai_model" / "configs" / "openai_model.yaml"
        self.instances = server_instances(merged_configs([config, policy]))
        agents = [i for i in self.instances if i.server_type == "responses_api_agents"]
        self.agent = agents[0].name
        self.env_vars = gym_env_vars(self.runtime)
        self.config_paths = f"[{config},{policy}]"
        self.policy_base_url = policy_base_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.ports: dict[str, int] = {}
        self._reservation: Any = None

    def start(self, timeout: float = 240.0) -> float:
        links = self.workdir / "venvs"
        for instance in self.instances:
            link = links / instance.rel_dir / ".venv"
            link.parent.mkdir(parents=True, exist_ok=True)
            if not link.is_symlink():
                link.symlink_to(self.runtime.prefix, target_is_directory=True)
        self._reservation = reserve_ports(1 + len(self.instances), cache_dir() / "ports")
        head, *ports = self._reservation.ports
        self.ports = {"head_server": head} | {i.name: p for i, p in zip(self.instances, ports, strict=True)}
        argv = [
            *self.runtime.start_command,
            f"+config_paths={self.config_paths}",
            f"+policy_base_url={self.policy_base_url}",
            "+policy_api_key=EMPTY",
            f"+policy_model_name={MODEL}",
            "+skip_venv_if_present=true",
            f"+uv_venv_dir={links}",
            f"++head_server={{host:{HOST},port:{head}}}",
        ]
        for instance in self.instances:
            prefix = instance.override_prefix
            argv += [f"++{prefix}.host={HOST}", f"++{prefix}.port={self.ports[instance.name]}"]
        started = time.monotonic()
        with open(self.workdir / "ng_run.log", "ab") as log:
            self.proc = subprocess.Popen(
                argv, cwd=self.workdir, env=self.env_vars, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )  # fmt: skip
        pending = set(self.ports.values())
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"stock ng_run exited ({self.proc.returncode}); log: {self.workdir / 'ng_run.log'}")
            if time.monotonic() - started > timeout:
                raise RuntimeError(f"stock ng_run not ready in {timeout:.0f}s; log: {self.workdir / 'ng_run.log'}")
            pending = {p for p in pending if not _http_ok(p)}
            time.sleep(0.1)
        return time.monotonic() - started

    @property
    def agent_url(self) -> str:
        return f"http://{HOST}:{self.ports[self.agent]}"

    def pids(self) -> list[int]:
        return session_pids(self.proc.pid) if self.proc is not None else []

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=15)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        kill_session(proc.pid)
        if self._reservation is not None:
            self._reservation.release()

    def collect(self, input_jsonl: Path, n: int, concurrency: int, upstream_pid: int) -> Batch:
        """One ``ng_collect_rollouts`` run; timed from dispatch to the last written rollout."""
        out = self.workdir / f"rollouts-{concurrency}-{n}.jsonl"
        argv = [
            str(self.runtime.bin_dir / "ng_collect_rollouts"),
            f"+agent_name={self.agent}",
            f"+input_jsonl_fpath={input_jsonl}",
            f"+output_jsonl_fpath={out}",
            f"+limit={n}",
            f"+num_samples_in_parallel={concurrency}",
            f"++head_server={{host:{HOST},port:{self.ports['head_server']}}}",
            "+upload_rollouts_to_wandb=false",
            "+disable_aggregation=true",
        ]
        stamps: dict[str, float] = {}
        meter: CpuMeter | None = None
        cpu: dict[str, float] = {}
        with open(self.workdir / "collect.err", "wb") as err:
            proc = subprocess.Popen(
                argv, cwd=self.workdir, env=self.env_vars, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=err, text=True,
            )  # fmt: skip
            assert proc.stdout is not None
            for line in proc.stdout:
                now = time.perf_counter()
                if "Querying with" in line and "start" not in stamps:
                    stamps["start"] = now
                    kinds = {pid: process_kind(pid) for pid in self.pids()}
                    meter = CpuMeter(kinds | {proc.pid: "client", upstream_pid: "upstream"})
                elif "Sorting results" in line and "end" not in stamps:
                    stamps["end"] = now
                    if meter is not None:
                        cpu = meter.stop()
            code = proc.wait()
        ok, reward = 0, 0.0
        if out.exists():
            with open(out, "rb") as f:
                for line in f:
                    ok += 1
                    reward += float(json.loads(line).get("reward") or 0.0)
        failures = out.with_name(out.stem + "_failures.jsonl")
        errors: Counter[str] = Counter()
        if failures.exists():
            errors["failed"] = len(failures.read_bytes().splitlines())
        if code != 0 or "start" not in stamps or "end" not in stamps:
            tail = (self.workdir / "collect.err").read_text(errors="replace")[-2000:]
            errors["crashed"] = max(1, n - ok - errors["failed"])
            print(f"  ng_collect_rollouts exited {code}:\n{tail}", file=sys.stderr)
            return Batch(n, float("nan"), errors, reward)
        for path in (out, failures, out.with_stem(out.stem + "_materialized_inputs")):
            path.unlink(missing_ok=True)
        return Batch(n, stamps["end"] - stamps["start"], errors, reward, cpu)


async def harness_batch(
    harness: NeMoGymHarness, env: str, path: Path, n: int, concurrency: int, endpoint: Endpoint, upstream_pid: int
) -> Batch:
    tasks = NeMoGymTaskset(env, jsonl_path=path, limit=n)
    errors: Counter[str] = Counter()
    reward, count = 0.0, 0
    kinds = {pid: process_kind(pid) for pid in harness.stack.info().pids}
    meter = CpuMeter(kinds | {os.getpid(): "client", upstream_pid: "upstream"})
    started = time.perf_counter()
    async for result in harness.run(tasks, endpoint, concurrency=concurrency):
        count += 1
        if result.error is not None:
            errors[result.error.type] += 1
        else:
            reward += result.reward or 0.0
    seconds = time.perf_counter() - started
    return Batch(count, seconds, errors, reward, meter.stop())


def route_row(row: dict[str, Any], key: str) -> dict[str, Any]:
    """A Gym row carrying a route key, as the harness sends it (model and metadata)."""
    body = json.loads(json.dumps(row))
    params = body["responses_create_params"]
    params["model"] = key
    params["metadata"] = {**(params.get("metadata") or {}), ROUTE_METADATA_KEY: key}
    return body


async def latency_at_one(
    harness: NeMoGymHarness, stock: StockStack, env: str, path: Path, endpoint: Endpoint, n: int
) -> dict[str, list[float]]:
    """Per-rollout latency at concurrency 1: harness.rollout, direct /run on our stack (route key), and
    direct /run on the stock stack, in alternating blocks of 25."""
    tasks = list(NeMoGymTaskset(env, jsonl_path=path, limit=n))
    await harness.astart()  # restarts the stack if an earlier section left it dead
    ours_url = harness.stack.agent_url() + "/run"
    stock_url = stock.agent_url + "/run"
    lat: dict[str, list[float]] = {"harness": [], "direct_ours": [], "direct_stock": []}
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:

        async def post(url: str, body: dict[str, Any]) -> None:
            async with session.post(url, json=body) as resp:
                await resp.read()
                if resp.status != 200:
                    raise RuntimeError(f"{url} answered {resp.status}")

        for start in range(0, n, 25):
            block = tasks[start : start + 25]
            modes = ["harness", "direct_ours", "direct_stock"]
            shift = (start // 25) % 3
            for mode in modes[shift:] + modes[:shift]:
                for task in block:
                    if mode == "harness":
                        t0 = time.perf_counter()
                        result = await harness.rollout(task, endpoint)
                        elapsed = time.perf_counter() - t0
                        if result.error is not None:
                            raise RuntimeError(f"harness rollout failed: {result.error!r}")
                    elif mode == "direct_ours":
                        route = harness.proxy.open_route(endpoint)
                        body = route_row(task.gym_row(), route.key)
                        t0 = time.perf_counter()
                        await post(ours_url, body)
                        elapsed = time.perf_counter() - t0
                        route.close()
                    else:
                        body = task.gym_row()
                        t0 = time.perf_counter()
                        await post(stock_url, body)
                        elapsed = time.perf_counter() - t0
                    lat[mode].append(elapsed)
    return lat


class Sampler:
    """Samples this process's RSS (every 0.2 s), the stack's RSS (every 1 s) and open routes."""

    def __init__(self, harness: NeMoGymHarness) -> None:
        self.harness = harness
        self.peak_rss = 0
        self.peak_stack_rss = 0
        self.peak_routes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last_stack = 0.0
        while not self._stop.wait(0.2):
            self.peak_rss = max(self.peak_rss, rss_self())
            self.peak_routes = max(self.peak_routes, self.harness.proxy.open_routes)
            if time.monotonic() - last_stack >= 1.0:
                last_stack = time.monotonic()
                self.peak_stack_rss = max(self.peak_stack_rss, self.harness.stack.info().rss_bytes)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the benchmark -------------------------------------------------------------------------------------


def generate_rows(env: str, path: Path, count: int) -> str:
    """``count`` rows cycling the env's example.jsonl, each naming the env's agent. Returns the agent."""
    runtime = find_gym_runtime()
    config = runtime.root / "resources_servers" / env / "configs" / f"{env}.yaml"
    agent = next(i.name for i in server_instances(merged_configs([config])) if i.server_type == "responses_api_agents")
    example = runtime.root / "resources_servers" / env / "data" / "example.jsonl"
    examples = [json.loads(line) for line in example.read_text().splitlines() if line.strip()]
    with open(path, "w") as f:
        for i in range(count):
            row = dict(examples[i % len(examples)])
            row["agent_ref"] = {"name": agent}
            f.write(json.dumps(row) + "\n")
    return agent


def rollouts_for(concurrency: int, args: argparse.Namespace) -> int:
    return max(args.min_rollouts, args.factor * concurrency)


def spawn_upstream() -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(
        [sys.executable, __file__, "_upstream"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    for line in proc.stdout:  # the first JSON line carries the port
        if line.startswith("{"):
            return proc, json.loads(line)["port"]
    proc.kill()
    raise RuntimeError(f"the fake upstream exited ({proc.wait()}) before telling its port")


def stop_upstream(upstream: subprocess.Popen[str]) -> None:
    """Stop an upstream from ``spawn_upstream``: close its stdin (it exits on EOF), wait, kill if it hangs."""
    if upstream.stdin is not None:
        upstream.stdin.close()
    try:
        upstream.wait(10)
    except subprocess.TimeoutExpired:
        upstream.kill()
        upstream.wait()


def bar(value: float, top: float, width: int = 40) -> str:
    return "#" * max(1, round(width * value / top)) if top > 0 else ""


async def bench_env(
    env: str,
    args: argparse.Namespace,
    upstream: tuple[int, int],
    tmp: Path,
    first: bool,
    figures: dict[str, Any],
) -> None:
    upstream_port, upstream_pid = upstream
    instant = Endpoint(base_url=f"http://{HOST}:{upstream_port}/v1", model=MODEL)
    slow = Endpoint(base_url=f"http://{HOST}:{upstream_port}/lat{args.latency_ms}/v1", model=MODEL)
    concurrencies = [int(c) for c in args.concurrency.split(",") if c]
    scaling = [1 << k for k in range(13) if (1 << k) <= args.scaling_max] if first else []
    memory_points = [int(m) for m in args.memory.split(",") if m] if first else []
    biggest = max([rollouts_for(c, args) for c in concurrencies + scaling] + memory_points + [args.latency_samples])
    biggest = max(biggest, 64)
    path = tmp / f"{env}.jsonl"
    generate_rows(env, path, biggest)
    out: dict[str, Any] = {"throughput": [], "throughput_slow": [], "scaling": [], "memory": [], "latency_ms": {}}
    figures.setdefault("envs", {})[env] = out

    stock = StockStack(env, instant.base_url, tmp / f"stock-{env}")
    harness = NeMoGymHarness(env, timeout=args.timeout)
    try:
        started = time.monotonic()
        await asyncio.gather(harness.astart(), asyncio.to_thread(stock.start))
        print(f"\n== {env}: both stacks ready in {time.monotonic() - started:.1f}s (started together)", flush=True)
        # Warm up both sides (lazy imports, connection pools, pydantic validators).
        warm = await harness_batch(harness, env, path, 32, 8, instant, upstream_pid)
        lat = await latency_at_one(harness, stock, env, path, instant, 25)
        if warm.n_errors:
            raise RuntimeError(f"harness warm-up failed: {warm.errors}")
        del lat

        # (5) memory first, on a quiet process: idle, then N in flight against the slow upstream.
        if memory_points:
            idle_rss = rss_self()
            idle_stack = harness.stack.info().rss_bytes
            out["memory"].append({"in_flight": 0, "rss": idle_rss, "stack_rss": idle_stack, "errors": 0})
            out["stock_stack_rss_idle"] = rss_bytes(stock.pids())
            for n in memory_points:
                await harness.astart()
                overflows = listen_overflows()
                with Sampler(harness) as sampler:
                    batch = await harness_batch(harness, env, path, n, n, slow, upstream_pid)
                overflows = listen_overflows() - overflows
                out["memory"].append(
                    {"in_flight": sampler.peak_routes, "target": n, "rss": sampler.peak_rss,
                     "stack_rss": sampler.peak_stack_rss, "errors": batch.n_errors, "seconds": batch.seconds,
                     "error_types": dict(batch.errors), "reward": batch.reward_mean, "rate": batch.rate,
                     "listen_overflows": overflows}
                )  # fmt: skip
                errors = dict(batch.errors)
                print(f"  memory {n}: peak RSS {sampler.peak_rss / 1e6:.0f} MB, errors {errors}", flush=True)

        # (2) latency at concurrency 1.
        lat = await latency_at_one(harness, stock, env, path, instant, args.latency_samples)
        out["latency_ms"] = {k: [v * 1000 for v in vs] for k, vs in lat.items()}

        async def side_by_side(row: int, c: int, n: int, endpoint: Endpoint, other: StockStack, repeats: int):
            """``repeats`` runs per side, alternating sides and swapping which goes first; pooled."""
            runs: dict[str, list[Batch]] = {"ours": [], "stock": []}
            for repeat in range(repeats):
                for side in ("ours", "stock") if (row + repeat) % 2 == 0 else ("stock", "ours"):
                    if side == "ours":
                        runs[side].append(await harness_batch(harness, env, path, n, c, endpoint, upstream_pid))
                    else:
                        runs[side].append(await asyncio.to_thread(other.collect, path, n, c, upstream_pid))
            ours, theirs = pooled(runs["ours"]), pooled(runs["stock"])
            ratios = [a.rate / b.rate for a, b in zip(runs["ours"], runs["stock"], strict=True)]
            return ours, theirs, {
                "concurrency": c, "rollouts": ours.rollouts, "ratio_runs": ratios,
                "ours": ours.rate, "stock": theirs.rate,
                "ours_errors": ours.n_errors, "stock_errors": theirs.n_errors,
                "ours_reward": ours.reward_mean, "stock_reward": theirs.reward_mean,
            }  # fmt: skip

        # (1) throughput: ``--repeats`` runs per side.
        for row, c in enumerate(concurrencies):
            ours, theirs, figures_row = await side_by_side(row, c, rollouts_for(c, args), instant, stock, args.repeats)
            figures_row.update(ours_cpu_ms=ours.cpu_ms(), stock_cpu_ms=theirs.cpu_ms(), ours_busy=ours.busy,
                               stock_busy=theirs.busy)  # fmt: skip
            out["throughput"].append(figures_row)
            print(f"  c={c}: harness {ours.rate:.1f}/s, ng_collect_rollouts {theirs.rate:.1f}/s (ratio per run: "
                  f"{', '.join(f'{r:.2f}' for r in figures_row['ratio_runs'])})", flush=True)  # fmt: skip

        # (1c) throughput against the slow upstream (a model's latency), one run per side; the stock side
        # needs a stack of its own, since openai_model's base URL is fixed when ng_run starts.
        slow_concurrencies = [int(c) for c in args.slow_concurrency.split(",") if c] if first else []
        if slow_concurrencies:
            stock_slow = StockStack(env, slow.base_url, tmp / f"stock-slow-{env}")
            try:
                await asyncio.to_thread(stock_slow.start)
                for row, c in enumerate(slow_concurrencies):
                    n = max(24, c) if c < 8 else rollouts_for(c, args)
                    ours, theirs, figures_row = await side_by_side(row, c, n, slow, stock_slow, 1)
                    out["throughput_slow"].append(figures_row)
                    print(f"  {args.latency_ms} ms upstream, c={c}: harness {ours.rate:.1f}/s, "
                          f"ng_collect_rollouts {theirs.rate:.1f}/s", flush=True)  # fmt: skip
            finally:
                await asyncio.to_thread(stock_slow.stop)

        # (6) scaling (harness), reusing the throughput rows' and memory rows' figures where measured
        # (at those concurrencies the stack is CPU-bound, so a 200 ms upstream does not change the rate).
        measured = {r["concurrency"]: (r["ours"], r["ours_errors"], "") for r in out["throughput"]}
        for m in out["memory"][1:]:
            measured.setdefault(m["target"], (m["rate"], m["errors"], f"{args.latency_ms} ms upstream, memory run"))
        for c in scaling:
            if c in measured:
                rate, errors, note = measured[c]
                out["scaling"].append({"concurrency": c, "ours": rate, "errors": errors, "note": note})
                continue
            batch = await harness_batch(harness, env, path, rollouts_for(c, args), c, instant, upstream_pid)
            out["scaling"].append({"concurrency": c, "ours": batch.rate, "errors": batch.n_errors, "note": ""})
            print(f"  scaling c={c}: {batch.rate:.1f}/s", flush=True)
        out["stack_pids"] = len(harness.stack.info().pids)
        out["stock_pids"] = len(stock.pids())
    finally:
        await harness.aclose()
        await asyncio.to_thread(stock.stop)


def print_report(figures: dict[str, Any], args: argparse.Namespace) -> None:
    load = figures["load"]
    print(
        f"\nRollout benchmarks: NeMoGymHarness vs ng_collect_rollouts ({os.cpu_count()} CPUs, "
        f"Python {sys.version.split()[0]}, load average {load[0]:.1f} before, {load[1]:.1f} after)"
    )
    for env, out in figures["envs"].items():
        print(f"\n[1] Throughput, {env}, instant fake upstream (rollouts/s; both stacks up, sides alternate)")
        head = (
            f"{'concurrency':>11} {'rollouts':>8} | {'harness':>8} {'err':>4} {'busy':>5} | "
            f"{'ng_collect':>10} {'err':>4} {'busy':>5} | {'ratio':>6} {'CPU ratio':>9}"
        )
        print(head + "  target")
        print("-" * (len(head) + 14))
        targets = {64: 1.0, 1024: 0.9}
        for r in out["throughput"]:
            ratio = r["ours"] / r["stock"] if r["stock"] == r["stock"] and r["stock"] > 0 else float("nan")
            r["ratio"] = ratio
            target = targets.get(r["concurrency"])
            verdict = f">={target:.1f} {'met' if ratio >= target else 'MISSED'}" if target else ""
            ours_cpu, stock_cpu = sum(r["ours_cpu_ms"].values()), sum(r["stock_cpu_ms"].values())
            r["cpu_ratio"] = stock_cpu / ours_cpu if ours_cpu > 0 else float("nan")
            print(
                f"{r['concurrency']:>11} {r['rollouts']:>8} | {r['ours']:>8.1f} {r['ours_errors']:>4} "
                f"{r['ours_busy'] * 100:>4.0f}% | {r['stock']:>10.1f} {r['stock_errors']:>4} "
                f"{r['stock_busy'] * 100:>4.0f}% | {ratio:>5.2f}x {r['cpu_ratio']:>8.2f}x  {verdict}"
            )
        runs = "; ".join(
            f"c={r['concurrency']}: " + ", ".join(f"{x:.2f}" for x in r["ratio_runs"]) for r in out["throughput"]
        )
        print(f"ratio of each run pair ({args.repeats} per row, pooled above): {runs}")
        rewards = {f"{r['ours_reward']:.2f}/{r['stock_reward']:.2f}" for r in out["throughput"]}
        print(
            "ratio: harness / ng_collect_rollouts rollouts/s. busy: CPU used by all the processes of that side "
            "(client, Gym servers, Ray, upstream) / (wall x CPUs); well under 100% at high concurrency means "
            "other work on the machine took the CPU. CPU ratio: stock CPU per rollout / harness CPU per rollout "
            "(table 1b), the figure that noise from other work moves least."
        )
        print(f"mean reward harness/stock: {', '.join(sorted(rewards))}")
        print(f"\n[1b] CPU per rollout by process, {env}, ms (client: this process = harness + proxy, or the "
              "ng_collect_rollouts process; policy server: Gym's openai_model, stock only)")  # fmt: skip
        kinds = ("client", "policy server", "Gym agent", "resources server", "upstream", "ng_run + Ray")
        print(f"{'concurrency':>11} {'side':<8}" + "".join(f"{k:>17}" for k in kinds) + f"{'total':>8}")
        for r in out["throughput"]:
            for side, label in (("ours", "harness"), ("stock", "stock")):
                cpu = r[f"{side}_cpu_ms"]
                cells = "".join(f"{cpu.get(k, 0.0):>17.2f}" for k in kinds)
                print(f"{r['concurrency']:>11} {label:<8}{cells}{sum(cpu.values()):>8.2f}")

        if out["throughput_slow"]:
            print(f"\n[1c] Throughput, {env}, {args.latency_ms} ms fake upstream (rollouts/s; sides alternate)")
            print(f"{'concurrency':>11} {'rollouts':>8} | {'harness':>8} {'err':>4} | {'ng_collect':>10} {'err':>4} | "
                  f"{'ratio':>6}  rewards")  # fmt: skip
            for r in out["throughput_slow"]:
                ratio = r["ours"] / r["stock"] if r["stock"] == r["stock"] and r["stock"] > 0 else float("nan")
                r["ratio"] = ratio
                print(
                    f"{r['concurrency']:>11} {r['rollouts']:>8} | {r['ours']:>8.1f} {r['ours_errors']:>4} | "
                    f"{r['stock']:>10.1f} {r['stock_errors']:>4} | {ratio:>5.2f}x  "
                    f"{r['ours_reward']:.2f}/{r['stock_reward']:.2f}"
                )

        lat = out["latency_ms"]
        if lat:
            print(f"\n[2] Latency per rollout at concurrency 1, {env}, ms ({len(lat['harness'])} each, interleaved)")
            print(f"{'':<44}{'p50':>8}{'p99':>8}{'mean':>8}")
            names = {
                "harness": "harness.rollout()",
                "direct_ours": "direct POST /run, our stack (floor)",
                "direct_stock": "direct POST /run, stock stack (+openai_model)",
            }
            for key, label in names.items():
                v = lat[key]
                print(f"{label:<44}{pct(v, 0.5):>8.2f}{pct(v, 0.99):>8.2f}{statistics.mean(v):>8.2f}")
            c1 = next((r for r in out["throughput"] if r["concurrency"] == 1), None)
            if c1:
                print(f"{'ng_collect_rollouts at c=1 (wall / rollouts)':<44}{'':>16}{1000 / c1['stock']:>8.2f}")
            added50 = pct(lat["harness"], 0.5) - pct(lat["direct_ours"], 0.5)
            added99 = pct(lat["harness"], 0.99) - pct(lat["direct_ours"], 0.99)
            print(f"harness over the floor: p50 +{added50:.2f} ms, p99 +{added99:.2f} ms")

        if out["memory"]:
            idle = out["memory"][0]
            print(f"\n[5] Memory, {env}, {args.latency_ms} ms upstream (RSS of this process = harness + proxy)")
            print(
                f"{'':<18}{'in flight':>10}{'errors':>8}{'harness MB':>12}{'+ MB':>8}{'stack MB':>10}{'wall s':>8}"
                f"{'drops':>7}"
            )
            print(f"{'idle':<18}{0:>10}{0:>8}{idle['rss'] / 1e6:>12.0f}{'':>8}{idle['stack_rss'] / 1e6:>10.0f}")
            stock_rss = out.get("stock_stack_rss_idle", 0) / 1e6
            for m in out["memory"][1:]:
                added = (m["rss"] - idle["rss"]) / 1e6
                m["mb_per_1000"] = added / m["target"] * 1000
                print(
                    f"{m['target']:>8,} rollouts{m['in_flight']:>10}{m['errors']:>8}{m['rss'] / 1e6:>12.0f}"
                    f"{added:>+8.0f}{m['stack_rss'] / 1e6:>10.0f}{m['seconds']:>8.1f}{m['listen_overflows']:>7}"
                )
            for m in out["memory"][1:]:
                if m["errors"]:
                    print(f"  {m['target']:,}: errors by type: {m['error_types']}")
                verdict = "met" if m["mb_per_1000"] < 50 and m["errors"] == 0 else "MISSED"
                print(
                    f"  {m['target']:,}: +{m['mb_per_1000']:.1f} MB per 1,000 in flight, {m['errors']} errors "
                    f"(target < 50 MB, 0 errors): {verdict}"
                )
            print(
                "  in flight: most routes open at once (= rollouts started and not finished); drops: connections "
                "the kernel dropped meanwhile because a listen queue was full (whole machine)"
            )
            print(f"  for scale: the stock stack (ng_run + openai_model) at idle: {stock_rss:.0f} MB RSS")

        if out["scaling"]:
            print(f"\n[6] Scaling, {env}, harness, instant upstream (rollouts = max({args.min_rollouts}, "
                  f"{args.factor} x concurrency))")  # fmt: skip
            top = max(s["ours"] for s in out["scaling"])
            for s in out["scaling"]:
                note = f"  ({s['note']})" if s.get("note") else ""
                print(f"{s['concurrency']:>6} {s['ours']:>7.1f}/s  {bar(s['ours'], top):<40}{note}")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    figures: dict[str, Any] = {"load": [os.getloadavg()[0]]}
    tmp = Path(tempfile.mkdtemp(prefix="bench_throughput_"))
    upstream: subprocess.Popen[str] | None = None
    try:
        upstream, port = spawn_upstream()
        for i, env in enumerate(e for e in args.envs.split(",") if e):
            await bench_env(env, args, (port, upstream.pid), tmp, i == 0, figures)
    finally:
        if upstream is not None:
            stop_upstream(upstream)
        shutil.rmtree(tmp, ignore_errors=True)
    figures["load"].append(os.getloadavg()[0])
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_upstream":
        return serve_upstream()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="example_single_tool_call", help="comma-separated env names")
    parser.add_argument("--concurrency", default="1,64,256,1024", help="throughput rows (both sides)")
    parser.add_argument("--scaling-max", type=int, default=4096, help="harness sweep 1, 2, 4, ... up to this (0: off)")
    parser.add_argument("--memory", default="1000,4096", help="rollouts in flight for the memory rows ('' : off)")
    parser.add_argument("--latency-ms", type=int, default=200, help="the slow upstream's latency (1c, memory rows)")
    parser.add_argument(
        "--slow-concurrency", default="1,64,256,1024", help="throughput rows against the slow upstream ('' : off)"
    )
    parser.add_argument("--latency-samples", type=int, default=150, help="rollouts per mode at concurrency 1")
    parser.add_argument("--min-rollouts", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3, help="runs per side of each throughput row (pooled)")
    parser.add_argument("--factor", type=int, default=1, help="rollouts per point = max(min, factor x c)")
    parser.add_argument("--timeout", type=float, default=600.0, help="harness per-rollout timeout")
    add_json_flag(parser)
    args = parser.parse_args()
    figures = asyncio.run(run(args))
    print_report(figures, args)
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
