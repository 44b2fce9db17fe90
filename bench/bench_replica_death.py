"""A replica that dies mid-run: `verifiers-nemo eval -b URL1,URL2` over two policy servers, one of them SIGKILLed
(by itself, on the call after its Nth) while rollouts run; how many rollouts are scored and how many errored.

Each policy server is a process of its own on 127.0.0.1 answering example_multi_step deterministically from the
conversation alone (look a synonym up, extract its value, stop: three or four calls a rollout), so a call may go to
either. Run it against this checkout, and against another (``--before DIR``: e.g. ``git worktree add /tmp/b REV``)
for a comparison with the same command:

    PYTHONPATH=$PWD .venv/bin/python bench/bench_replica_death.py --before /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ENV = "example_multi_step"
MODEL = "m"


# -- the policy server (a process of its own: --serve) ---------------------------------------------


def _decide(user: str, outputs: list[str]) -> dict[str, Any]:
    wanted = ["Blazing", "Warm"] if len(user) % 2 == 0 else ["Blazing"]
    if len(outputs) < len(wanted):
        return _call("get_synonym_value", {"synonym": wanted[len(outputs)]}, len(outputs))
    if len(outputs) == len(wanted):
        values = [json.loads(o)["synonym_value"] for o in outputs]
        return _call("extract_synonym_values", {"synonym_values": values}, len(outputs))
    text = {"type": "output_text", "text": "Done.", "annotations": []}
    return {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed", "content": [text]}


def _call(name: str, arguments: dict[str, Any], n: int) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}_{time.monotonic_ns()}",
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }


def serve(port_file: Path, die_after: int | None, fault: str = "die", slow_s: float = 0.0) -> None:
    """``fault`` after ``die_after`` calls: ``die`` (SIGKILL), ``freeze`` (SIGSTOP: connections still accepted, never
    answered), ``slow`` (every later call answered after ``slow_s`` seconds; ``GET /models`` at once)."""
    import asyncio

    from aiohttp import web

    calls = 0

    async def responses(request: web.Request) -> web.Response:
        nonlocal calls
        calls += 1
        if die_after is not None and calls > die_after:
            if fault == "die":
                os.kill(os.getpid(), signal.SIGKILL)  # killed mid-request: the call gets no answer
            elif fault == "freeze":
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen mid-request until SIGCONT
            else:
                await asyncio.sleep(slow_s)
        body = await request.json()
        items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
        user = "".join(
            (c if isinstance(c, str) else "".join(p.get("text", "") for p in c))
            for c in (i.get("content") for i in items if i.get("role") == "user")
        )
        outputs = [i["output"] for i in items if i.get("type") == "function_call_output"]
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 110,
        }
        return web.json_response(
            {
                "id": f"resp_{calls}",
                "object": "response",
                "created_at": int(time.time()),
                "model": body.get("model"),
                "status": "completed",
                "output": [_decide(user, outputs)],
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": body.get("tools") or [],
                "usage": usage,
            }
        )

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    async def main() -> None:
        import asyncio

        app = web.Application()
        app.router.add_post("/v1/responses", responses)
        app.router.add_get("/v1/models", models)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port_file.write_text(str(runner.addresses[0][1]))
        await asyncio.Event().wait()

    asyncio.run(main())


# -- the benchmark ---------------------------------------------------------------------------------


def _start_server(
    folder: Path, name: str, die_after: int | None, fault: str = "die", slow_s: float = 0.0
) -> tuple[subprocess.Popen[bytes], str]:
    port_file = folder / f"{name}.port"
    args = [sys.executable, str(HERE), "--serve", "--port-file", str(port_file)]
    if die_after is not None:
        args += ["--serve-die-after", str(die_after), "--serve-fault", fault, "--serve-slow-s", str(slow_s)]
    proc = subprocess.Popen(args, start_new_session=True)
    deadline = time.monotonic() + 30
    while not port_file.exists() or not port_file.read_text():
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError(f"policy server {name} did not start")
        time.sleep(0.05)
    return proc, f"http://127.0.0.1:{port_file.read_text()}/v1"


def run_once(code: Path, examples: int, repeats: int, concurrency: int, die_after: int) -> dict[str, Any]:
    """One eval with ``code`` first on PYTHONPATH; its counts, wall time and the summary's replica rows."""
    with tempfile.TemporaryDirectory(prefix="bench-replica-") as tmp:
        folder = Path(tmp)
        live, live_url = _start_server(folder, "live", None)
        dying, dying_url = _start_server(folder, "dying", die_after)
        try:
            env = {**os.environ, "PYTHONPATH": str(code)}
            env.pop("OPENAI_API_KEY", None)
            cli = Path(sys.executable).with_name("verifiers-nemo")
            args = [str(cli), "eval", ENV, "-b", f"{live_url},{dying_url}", "-m", MODEL]
            args += ["-n", str(examples), "-r", str(repeats), "-c", str(concurrency), "-s", "-o", str(folder / "out")]
            started = time.monotonic()
            done = subprocess.run(args, env=env, cwd=folder, capture_output=True, text=True, timeout=900)
            wall = time.monotonic() - started
            (metadata_path,) = (folder / "out").glob("*/*/metadata.json")
            metadata = json.loads(metadata_path.read_text())
            lines = [json.loads(x) for x in (metadata_path.parent / "results.jsonl").read_text().splitlines() if x]
        finally:
            for proc in (live, dying):
                if proc.poll() is None:
                    proc.kill()
                proc.wait(timeout=10)
        rollouts = metadata["summary"]["rollouts"]
        return {
            "code": str(code),
            "exit": done.returncode,
            "rollouts": rollouts["total"],
            "scored": rollouts["scored"],
            "errored": rollouts["errored"],
            "errors_by_type": metadata["summary"]["errors_by_type"],
            "moved": sum(1 for r in lines if r.get("failed_over")),
            "replica_killed": dying.returncode == -signal.SIGKILL,
            "replicas": metadata["summary"].get("replicas"),
            "wall_s": round(wall, 1),
            "summary_rows": [
                x for x in done.stdout.splitlines() if x.startswith(("Rollouts", "Errors", "Replicas", "Timing"))
            ],
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--serve-die-after", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--die-after", type=int, default=20, help="calls the dying replica answers (default 20)")
    parser.add_argument("-n", "--examples", type=int, default=5)
    parser.add_argument("-r", "--repeats", type=int, default=60, help="rollouts per example (5 x 60 = 300)")
    parser.add_argument("-c", "--concurrency", type=int, default=8)
    parser.add_argument("--before", type=Path, help="another checkout to run the same command with, first")
    parser.add_argument("--serve-fault", default="die", help=argparse.SUPPRESS)
    parser.add_argument("--serve-slow-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.port_file, args.serve_die_after, args.serve_fault, args.serve_slow_s)
        return
    runs = []
    if args.before is not None:
        runs.append(("before", run_once(args.before, args.examples, args.repeats, args.concurrency, args.die_after)))
    here = HERE.parent.parent
    runs.append(("this checkout", run_once(here, args.examples, args.repeats, args.concurrency, args.die_after)))
    total = args.examples * args.repeats
    print(f"{total} rollouts of {ENV}, {args.concurrency} at once, two replicas, one SIGKILLed on the call after its")
    print(f"{args.die_after}th (its process: that call unanswered, later connections refused)\n")
    print(f"{'code':<16}{'scored':>8}{'errored':>9}{'moved':>7}{'wall s':>8}  errors")
    for name, fig in runs:
        errors = ", ".join(f"{k}: {v}" for k, v in fig["errors_by_type"].items()) or "none"
        print(f"{name:<16}{fig['scored']:>8}{fig['errored']:>9}{fig['moved']:>7}{fig['wall_s']:>8}  {errors}")
        for row in fig["summary_rows"]:
            print(f"    {row}")
        if not fig["replica_killed"]:
            print("    (the dying replica was never killed: it got too few calls)")


if __name__ == "__main__":
    main()
