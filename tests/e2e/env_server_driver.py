"""prime-rl's two sides of a verifiers env server, run from the verifiers venv (`.venv-vf`, no nemo-gym).

    python env_server_driver.py serve  ENV_CONFIG_JSON --address-file F --log-dir D --pool elastic|static
                                       --workers N [--multiplex M]
    python env_server_driver.py client ADDRESS ENV_CONFIG_JSON --base-url URL

``serve`` is prime-rl's ``env-server`` entry point (``prime_rl/entrypoints/env_server.py``): verifiers'
``serve_env`` with ``pool_serve_kwargs`` of the source's ``serve.pool``, the env config as
``env_config_data`` and a ``log_setup`` that runs in the broker and in every spawned worker (here: each
process logs to ``D/<pid>.log``, so a rollout's ``rollout done: id=<trace id>`` line says which worker ran
it). The bound ZMQ address is written to F.

``client`` is prime-rl's orchestrator side (``prime_rl/orchestrator/envs.py``): an ``EnvClient`` that waits
for the server's health, loads the taskset itself (``vf.load_taskset``) and sends each episode its task's
data. It prints ``{"event": "ready", ...}``, then reads commands on stdin, one JSON object a line:
``{"batch": NAME, "count": N, "timeout": SECONDS|null}`` starts N episodes (task ``i % len(tasks)``) at
once, each bounded by ``timeout`` (prime-rl sets none); every episode prints one ``{"event": "episode",
...}`` line when it ends (``"outcome"``: ``ok``, ``failed``, ``error`` (the request raised) or
``timeout``). A command may also name the batch's own ``"client"`` (a verifiers client config, e.g. the
training client prime-rl's orchestrator hands every episode: ``{"type": "train", "base_url": ...,
"renderer": {...}, "renderer_model_name": ...}``), ``"model"``, ``"sampling"`` and ``"traces"`` (a file each
episode's traces are appended to, as verifiers records them). The client never exits by itself: stop it
with SIGTERM or by closing stdin.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any


def log_to_pid_file(log_dir: str) -> None:
    """Each process of the server (broker, workers) logs verifiers' INFO lines to ``log_dir/<pid>.log``."""
    handler = logging.FileHandler(Path(log_dir) / f"{os.getpid()}.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    for name in ("verifiers", "verifiers_nemo"):
        logging.getLogger(name).setLevel(logging.INFO)


class AddressFile:
    """What ``serve_env`` reports its bound address to (it only calls ``put``)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    def put(self, address: str) -> None:
        partial_path = self.path.with_suffix(".tmp")
        partial_path.write_text(address)
        partial_path.rename(self.path)


def serve(args: argparse.Namespace) -> None:
    import verifiers.v1 as vf
    from verifiers.v1.serve import env_config_data, serve_env

    # The test or bench that started this server holds its stdin: EOF (its exit, even by SIGKILL) stops it.
    threading.Thread(target=_stop_at_stdin_eof, daemon=True).start()
    config = vf.resolve_env_config(json.loads(args.env_config))
    if args.pool == "elastic":
        pool: Any = vf.ElasticPoolConfig(max_workers=args.workers, multiplex=args.multiplex)
    else:
        pool = vf.StaticPoolConfig(num_workers=args.workers)
    serve_env(
        **vf.pool_serve_kwargs(pool),
        address="tcp://127.0.0.1:0",
        address_queue=AddressFile(args.address_file),
        log_setup=partial(log_to_pid_file, args.log_dir),
        config_data=env_config_data(config),
    )


def _stop_at_stdin_eof() -> None:
    sys.stdin.read()
    os.kill(os.getpid(), signal.SIGTERM)


async def client(args: argparse.Namespace) -> None:
    started = time.monotonic()
    import verifiers.v1 as vf
    from verifiers.v1.serve import EnvClient

    imported_s = time.monotonic() - started
    config = vf.resolve_env_config(json.loads(args.env_config))
    env_client = EnvClient(args.address)
    await env_client.wait_for_server_startup(timeout=args.startup_timeout)
    loaded_at = time.monotonic()
    tasks = list(vf.load_taskset(config.taskset))
    emit(event="ready", tasks=len(tasks), import_s=imported_s, load_s=time.monotonic() - loaded_at)
    from pydantic import TypeAdapter
    from verifiers.v1.configs.client import ClientConfig

    default_client = vf.EvalClientConfig(base_url=args.base_url, api_key_var="POLICY_KEY")
    client_configs = TypeAdapter(ClientConfig)
    running: set[asyncio.Task] = set()

    async def one(request: dict[str, Any], i: int) -> None:
        batch, timeout = request["batch"], request.get("timeout")
        client_config = client_configs.validate_python(request["client"]) if request.get("client") else default_client
        sampling = vf.SamplingConfig.model_validate(request.get("sampling") or {})
        task = tasks[i % len(tasks)]
        sent = time.monotonic()
        line: dict[str, Any] = {"event": "episode", "batch": batch, "i": i, "task": i % len(tasks)}
        try:
            data = task.data.model_dump(mode="json")
            episode = await asyncio.wait_for(
                env_client.run(client_config, request.get("model") or "m", sampling, data), timeout
            )
        except TimeoutError:
            line.update(outcome="timeout")
        except Exception as exc:  # what the orchestrator would see, reported as data
            line.update(outcome="error", error=f"{type(exc).__name__}: {exc}")
        else:
            trace = episode.traces[0]
            reward = trace.rewards.get("nemo_gym")
            outcome = trace.info.get("nemo_gym") or {}
            line.update(
                outcome="ok" if episode.ok and trace.ok else "failed",
                trace_id=trace.id,
                reward=reward.score if reward is not None else None,
                recorded_reward=getattr(task.data, "recorded_reward", None),
                errors=[f"{e.type}: {e.message}" for e in trace.errors],
                gym_error=(outcome.get("error") or {}).get("type"),
                trainable=trace.agent.trainable if trace.agent is not None else None,
            )
            if request.get("traces"):
                with open(request["traces"], "a") as out:
                    out.writelines(json.dumps(t.to_record()) + "\n" for t in episode.traces)
        line["elapsed_s"] = time.monotonic() - sent
        emit(**line)

    while True:
        command = await asyncio.to_thread(sys.stdin.readline)
        if not command:
            break
        request = json.loads(command)
        for i in range(request["count"]):
            job = asyncio.create_task(one(request, i))
            running.add(job)
            job.add_done_callback(running.discard)
        emit(event="sent", batch=request["batch"], count=request["count"])
    if running:
        await asyncio.wait(running)
    await env_client.close()


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="mode", required=True)
    serve_parser = sub.add_parser("serve")
    serve_parser.add_argument("env_config")
    serve_parser.add_argument("--address-file", required=True)
    serve_parser.add_argument("--log-dir", required=True)
    serve_parser.add_argument("--pool", choices=("elastic", "static"), default="elastic")
    serve_parser.add_argument("--workers", type=int, default=None)
    serve_parser.add_argument("--multiplex", type=int, default=128)
    client_parser = sub.add_parser("client")
    client_parser.add_argument("address")
    client_parser.add_argument("env_config")
    client_parser.add_argument("--base-url", required=True)
    client_parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args()
    if args.mode == "serve":
        serve(args)
    else:
        asyncio.run(client(args))


if __name__ == "__main__":
    main()
