"""Saved runs made up for the training-data export's tests and its benchmark: ``results.jsonl`` lines in the shape
``eval -s --save-trace`` writes (``RolloutResult.to_dict(include_trace=True, include_gym_result=True)``), with
multi-turn tool rollouts whose policy calls recorded token IDs and logprobs, contiguous or not, and the outcomes a real
run has (scored, masked, failed)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

TOOL = {
    "type": "function",
    "name": "lookup",
    "description": "Look a word up.",
    "parameters": {"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]},
    "strict": True,
}
SYSTEM = "You look words up with the tool, then answer."


def rollout_record(
    task: int,
    rollout: int,
    *,
    turns: int = 2,
    reward: float | None = 1.0,
    contiguous: bool = True,
    tokens: bool = True,
    trace: bool = True,
    error: str | None = None,
    masked: bool = False,
    env: str = "example_multi_step",
    tokens_per_turn: int = 12,
    prompt_tokens: int = 6,
    seed: int | None = None,
) -> dict[str, Any]:
    """One results line: ``turns`` policy calls (each but the last a tool call, then a tool result), the last an
    answer. ``contiguous=False`` makes the second call's prompt re-tokenize the first completion (so the rollout is two
    training samples). ``tokens=False``: calls without token IDs; ``trace=False``: a line saved without
    ``--save-trace``. ``prompt_tokens``: the first prompt's length (a system prompt with tools is hundreds)."""
    rng = random.Random(seed if seed is not None else task * 1_000 + rollout)
    prompt_messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Look up word {task}."}]
    completion: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    sequence = [1, 2, 3, 100 + task % 50, 7, 8] + [rng.randrange(200, 30_000) for _ in range(prompt_tokens - 6)]
    output: list[dict[str, Any]] = []
    for turn in range(turns):
        prompt_ids = list(sequence)
        if turn == 1 and not contiguous:
            prompt_ids[len(prompt_ids) - tokens_per_turn - 3] += 1  # the first completion, re-tokenized
        last = turn == turns - 1
        completion_ids = [rng.randrange(200, 30_000) for _ in range(tokens_per_turn)] + [2]
        logprobs = [-rng.random() for _ in completion_ids]
        if last:
            message = {"role": "assistant", "content": f"The answer is {task * 10 + rollout}."}
            item = {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": message["content"]}],
            }
            output.append(item)
        else:
            call_id = f"call_{task}_{rollout}_{turn}"
            arguments = json.dumps({"word": f"w{task}-{turn}"})
            message = {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"id": call_id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}
                ],
            }
            result = {"role": "tool", "tool_call_id": call_id, "content": json.dumps({"value": task + turn})}
            output += [
                {"type": "function_call", "call_id": call_id, "name": "lookup", "arguments": arguments},
                {"type": "function_call_output", "call_id": call_id, "output": result["content"]},
            ]
        completion.append(message)
        request = {"model": "policy", "messages": prompt_messages + completion[:-1], "tools": [TOOL]}
        calls.append(
            {
                "index": turn,
                "request": request,
                "response": {"id": f"resp_{turn}", "object": "response", "output": output[-1:]},
                "status": 200,
                "upstream_status": 200,
                "latency_s": 0.1,
                "attempts": 1,
                "started_at": 1_700_000_000.0 + turn,
                "usage": {"input_tokens": len(prompt_ids), "output_tokens": len(completion_ids)},
                "error": None,
                "prompt_token_ids": prompt_ids if tokens else None,
                "completion_token_ids": completion_ids if tokens else None,
                "completion_logprobs": logprobs if tokens else None,
                "context_overflow": False,
                "finish_reason": "stop" if last else "tool_calls",
            }
        )
        if not last:
            completion.append(result)
            tool_tokens = [9, 10] + [rng.randrange(200, 30_000) for _ in range(4)] + [11, 7, 8]
            sequence = prompt_ids + completion_ids + tool_tokens
    line: dict[str, Any] = {
        "task_index": task,
        "rollout_index": rollout,
        "example_id": str(task),
        "env": env,
        "agent": f"{env}_simple_agent",
        "endpoint": "Qwen/Qwen3-8B@http://gpu-node:8000/v1",
        "prompt": prompt_messages,
        "completion": completion,
        "reward": None if error else reward,
        "metrics": {},
        "usage": {},
        "timing": {"total_s": 1.0},
        "error": {"type": error, "message": f"{error} after 2 calls"} if error else None,
        "masked": masked,
    }
    if masked:
        line["failure_kind"], line["failure_reason"] = "judge_failed", "the judge did not answer"
    if trace:
        line["trace"] = calls
        input_items = [{"role": "developer", "content": SYSTEM}, {"role": "user", "content": f"Look up word {task}."}]
        line["gym_result"] = {
            "responses_create_params": {"input": input_items, "tools": [TOOL]},
            "response": {"output": output},
            "reward": reward,
        }
    return line


def reward_of(task: int, rollout: int) -> float:
    """A made-up graded reward in [0, 1] that differs between a task's rollouts."""
    return ((task * 7 + rollout * 3) % 5) / 4


def run_records(tasks: int, rollouts: int, **kwargs: Any) -> Iterator[dict[str, Any]]:
    """A run's lines, task by task (as an eval writes them, about)."""
    for task in range(tasks):
        for rollout in range(rollouts):
            yield rollout_record(task, rollout, reward=reward_of(task, rollout), **kwargs)


def write_run(folder: Path, records: Any, *, rollouts_per_example: int, settings: dict[str, Any] | None = None) -> Path:
    """A run folder as ``eval -s --save-trace --return-tokens`` leaves it: ``results.jsonl`` and ``metadata.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "results.jsonl", "w") as handle:
        for record in records:
            handle.write(json.dumps(record) + "\n")
    saved = {
        "env": "example_multi_step",
        "nemo_env": "example_multi_step",
        "policy": "endpoint",
        "model": "Qwen/Qwen3-8B",
        "rollouts_per_example": rollouts_per_example,
        "save_trace": True,
        "exact_tokens": False,
        "sampling_args": {"return_tokens": True},
        **(settings or {}),
    }
    metadata = {"run_id": folder.name, "env": saved["nemo_env"], "model": saved["model"], "settings": saved}
    (folder / "metadata.json").write_text(json.dumps(metadata))
    return folder
