"""Stack start-to-ready: verifiers_nemo's GymStack vs nemo-gym's stock ``ng_run``, side by side.

    .venv/bin/python bench/bench_stack.py [--env example_single_tool_call] [--repeats 2]

Stock: ``ng_run`` with the environment's config plus Gym's own ``openai_model`` policy config,
run in a fresh working directory (cold: it builds one venv per server with uv; warm: the second
start in the same directory, where the venvs exist but are still re-synced). Ready = every server
answers ``GET /`` (polled every 0.1 s for both, so neither pays ng_run's own 3 s poll).
GymStack: cold = first start with an empty cache directory; warm = later starts, each the process's
first stack with no head held on the machine (so it starts the machine's shared Ray head, then ng_run once
the head's node is registered); "joined" = a stack started while another stack keeps the Ray head up (a
second environment, another process's stack, or a restart after a death); "own Ray" =
``shared_ray=False``, ng_run starting a Ray cluster of its own (how GymStack started before the shared head).
Also prints each stack's process count and total RSS once ready (for GymStack, with its Ray head's processes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _common import add_json_flag, write_json

from verifiers_nemo._gym.config import merged_configs, server_instances
from verifiers_nemo._gym.runtime import find_gym_runtime
from verifiers_nemo._stack import GymStack, StackConfig
from verifiers_nemo._stack.procs import http_ok as _http_ok
from verifiers_nemo._stack.procs import kill_session, reserve_ports, rss_bytes, session_pids


def stock_start(env: str, workdir: Path) -> tuple[float, int, int]:
    runtime = find_gym_runtime()
    config = runtime.root / "resources_servers" / env / "configs" / f"{env}.yaml"
    policy = runtime.root / "responses_api_models" / "openai_model" / "configs" / "openai_model.yaml"
    instances = server_instances(merged_configs([config, policy]))
    reservation = reserve_ports(1 + len(instances), Path(tempfile.gettempdir()) / "vn-bench-ports")
    head, *ports = reservation.ports
    argv = [
        *runtime.start_command,
        f"+config_paths=[{config},{policy}]",
        "+policy_base_url=http://127.0.0.1:9/v1",
        "+policy_api_key=EMPTY",
        "+policy_model_name=bench",
        f"++head_server={{host:127.0.0.1,port:{head}}}",
    ]
    for instance, port in zip(instances, ports, strict=True):
        argv.append(f"++{instance.override_prefix}.port={port}")
    # uv must find the runtime's base interpreter (no downloads here): put its bin dir first on PATH.
    base = subprocess.run(
        [str(runtime.python), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=True
    ).stdout.strip()
    path = f"{base}/bin:{runtime.bin_dir}:{os.environ['PATH']}"
    env_vars = dict(os.environ, PATH=path, UV_PYTHON_DOWNLOADS="never")
    env_vars.pop("PYTHONDONTWRITEBYTECODE", None)
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=workdir, env=env_vars, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        pending = {head, *ports}
        while pending:
            if proc.poll() is not None:
                raise RuntimeError(f"ng_run exited with {proc.returncode}")
            pending = {p for p in pending if not _http_ok(p)}
            time.sleep(0.1)
        ready = time.monotonic() - started
        pids = session_pids(proc.pid)
        return ready, len(pids), rss_bytes(pids)
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            pass
        kill_session(proc.pid)
        reservation.release()


def _stack(env: str, shared_ray: bool = True) -> GymStack:
    config = find_gym_runtime().root / "resources_servers" / env / "configs" / f"{env}.yaml"
    return GymStack(StackConfig(env, (config,), "http://127.0.0.1:9", shared_ray=shared_ray))


def ours_start(env: str, shared_ray: bool = True, keeper: GymStack | None = None) -> tuple[float, int, int]:
    """Start (and stop) one GymStack; with ``keeper`` running, it joins the keeper's Ray head."""
    stack = _stack(env, shared_ray)
    started = time.monotonic()
    info = stack.start()
    ready = time.monotonic() - started
    if keeper is not None:
        assert stack._ray_head is keeper._ray_head
    stack.stop()
    return ready, len(info.pids), info.rss_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="example_single_tool_call")
    parser.add_argument("--repeats", type=int, default=2, help="warm starts per side")
    add_json_flag(parser)
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory() as cache, tempfile.TemporaryDirectory() as stock_dir:
        os.environ["VERIFIERS_NEMO_CACHE_DIR"] = cache
        rows.append(("GymStack", "cold", *ours_start(args.env)))
        rows.append(("stock ng_run", "cold", *stock_start(args.env, Path(stock_dir))))
        for _ in range(args.repeats):
            rows.append(("GymStack", "warm", *ours_start(args.env)))
            rows.append(("stock ng_run", "warm", *stock_start(args.env, Path(stock_dir))))
            rows.append(("GymStack", "own Ray", *ours_start(args.env, shared_ray=False)))
        keeper = _stack(args.env)
        keeper.start()
        try:
            for _ in range(args.repeats):
                rows.append(("GymStack", "joined", *ours_start(args.env, keeper=keeper)))
        finally:
            keeper.stop()
        shutil.rmtree(Path(stock_dir) / "cache", ignore_errors=True)

    print(f"\nstart to ready, {args.env} (all servers answer GET /), one run, alternating sides\n")
    print(f"{'stack':<14}{'start':<9}{'ready s':>9}{'procs':>7}{'RSS MB':>9}")
    for name, kind, ready, procs, rss in rows:
        print(f"{name:<14}{kind:<9}{ready:>9.1f}{procs:>7}{rss / 1e6:>9.0f}")
    figures = {}
    for kind in ("cold", "warm", "own Ray", "joined"):
        ours = statistics.median(r[2] for r in rows if r[0] == "GymStack" and r[1] == kind)
        stock = statistics.median(
            r[2] for r in rows if r[0] == "stock ng_run" and r[1] == ("cold" if kind == "cold" else "warm")
        )
        print(f"{kind}: GymStack {ours:.1f}s vs stock {stock:.1f}s (x{stock / ours:.2f} faster)")
        figures[kind] = {"ours": ours, "stock": stock}
    write_json(args.json, figures)


if __name__ == "__main__":
    main()
