"""Synthetic saved runs for the report's tests and bench: run folders in the exact shape
``verifiers-nemo eval -s --save-trace`` writes (multi-turn tool rollouts, typed errors, masked rows)."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

WORDS = [
    f"{a}{b}"
    for a in ("ka", "lo", "mi", "ne", "su", "ta", "ve", "ro", "pi", "da")
    for b in ("n", "r", "st", "mpt", "lar", "ven", "dor", "sk", "th", "l", "x", "ne", "ro", "ga", "li")
]


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _call(
    index: int, request_input: list[dict[str, Any]], output: list[dict[str, Any]], rng: random.Random
) -> dict[str, Any]:
    return {
        "index": index,
        "request": {
            "input": list(request_input),
            "model": "m",
            "temperature": 0.7,
            "tools": [{"type": "function", "name": "lookup"}],
        },
        "response": {
            "id": f"resp_{index}",
            "output": output,
            "usage": {"input_tokens": 100 * (index + 1), "output_tokens": 40},
        },
        "status": 200,
        "latency_s": round(rng.uniform(0.05, 1.5), 4),
        "attempts": 1,
        "usage": {"input_tokens": 100 * (index + 1), "output_tokens": 40},
        "finish_reason": "tool_calls" if output and output[0].get("type") == "function_call" else "stop",
        "prompt_token_ids": list(range(20)),
        "completion_token_ids": list(range(5)),
        "completion_logprobs": [-0.1, -0.2, -0.05, -1.0, -0.3],
    }


def rollout_record(
    task: int,
    repeat: int,
    rng: random.Random,
    *,
    env: str = "synthetic_env",
    quality: float = 0.6,
    system: str | None = None,
    outcome: str | None = None,
) -> dict[str, Any]:
    """One ``results.jsonl`` line: ``outcome`` ``scored`` (default by chance), ``error`` or ``masked``."""
    system = system or f"You are agent for task family {task % 7}. " + words(random.Random(task % 7), 300)
    prompt = [{"role": "system", "content": system}, {"role": "user", "content": f"Task {task}: " + words(rng, 25)}]
    history: list[dict[str, Any]] = [dict(m, type="message") for m in prompt]
    trace, completion = [], []
    for step in range(rng.randint(1, 3)):
        call_id = f"call_{task}_{repeat}_{step}"
        item = {
            "type": "function_call",
            "name": "lookup",
            "arguments": json.dumps({"q": words(rng, 4)}),
            "call_id": call_id,
        }
        trace.append(_call(step, history, [item], rng))
        tool_output = json.dumps({"result": words(rng, 30)})
        history += [item, {"type": "function_call_output", "call_id": call_id, "output": tool_output}]
        completion += [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": item["arguments"]}}
                ],
            },
            {"role": "tool", "tool_call_id": call_id, "content": tool_output},
        ]
    answer = "Answer: " + words(rng, 50)
    trace.append(
        _call(
            len(trace),
            history,
            [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]}],
            rng,
        )
    )
    completion.append({"role": "assistant", "content": answer})
    if outcome is None:
        draw = rng.random()
        outcome = "error" if draw < 0.03 else "masked" if draw < 0.05 else "scored"
    reward = 1.0 if rng.random() < quality else 0.0
    record: dict[str, Any] = {
        "task_index": task,
        "rollout_index": repeat,
        "example_id": str(task),
        "env": env,
        "agent": "simple_agent",
        "endpoint": "m@http://127.0.0.1:8000/v1",
        "prompt": prompt,
        "completion": completion,
        "reward": reward,
        "metrics": {"accuracy": reward, "set_overlap": round(rng.random(), 3), "question_id": float(task)},
        "usage": {"input_tokens": sum(c["usage"]["input_tokens"] for c in trace), "output_tokens": 40 * len(trace)},
        "timing": {"rollout_s": round(sum(c["latency_s"] for c in trace) + rng.uniform(0.1, 0.5), 4)},
        "error": None,
        "trace": trace,
    }
    if outcome == "error":
        kind = rng.choice(["timeout", "upstream_http"])
        record.update(
            reward=None, metrics={}, error={"type": kind, "message": f"{kind} after 3 attempts: 503 from upstream"}
        )
        record["trace"][-1].update(
            response=None, status=502, error={"type": kind, "message": "503 Service Unavailable"}
        )
    elif outcome == "masked":
        record.update(
            reward=0.0, masked=True, failure_kind="judge_failed", failure_reason="the judge could not be reached"
        )
    return record


def write_run(
    folder: Path,
    tasks: int,
    repeats: int,
    *,
    seed: int = 0,
    quality: float = 0.6,
    env: str = "synthetic_env",
    save_trace: bool = True,
    outcomes: dict[tuple[int, int], str] | None = None,
    judged: bool = True,
) -> Path:
    """A run folder with ``tasks`` x ``repeats`` rollouts (``outcomes`` forces some (task, repeat)); ``judged``: its
    summary counts judge calls."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.jsonl", "w") as out:
        for task in range(tasks):
            for repeat in range(repeats):
                record = rollout_record(
                    task, repeat, rng, env=env, quality=quality, outcome=(outcomes or {}).get((task, repeat))
                )
                if not save_trace:
                    record.pop("trace")
                out.write(json.dumps(record) + "\n")
    metadata = {
        "run_id": folder.name,
        "env": env,
        "model": "m",
        "status": "finished",
        "created_at": "2026-11-25T12:00:00+0000",
        "updated_at": "2026-11-25T12:10:00+0000",
        "versions": {"verifiers-nemo": "0.1.0", "nemo-gym": "0.4.0"},
        "settings": {
            "env": env,
            "nemo_env": env,
            "policy": "endpoint",
            "model": "m",
            "base_url": "http://127.0.0.1:8000/v1",
            "api": "responses",
            "rollouts_per_example": repeats,
            "sampling_args": {"temperature": 0.7},
            "pass_threshold": 0.5,
            "save_trace": save_trace,
        },
        "counts": {"expected": tasks * repeats, "done": tasks * repeats, "missing": 0},
        "summary": {},
    }
    if judged:
        metadata["summary"]["judges"] = {  # type: ignore[index]
            "judge_model": {
                "target": "j@http://127.0.0.1:8001/v1",
                "calls": 7,
                "failed": 1,
                "input_tokens": 700,
                "output_tokens": 70,
            }
        }
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder
