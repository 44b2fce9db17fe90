"""A saved run as an inspect-ai log (``verifiers-nemo export RUN_DIR --inspect``), so ``inspect view``
shows our rollouts: one sample per rollout (task id, epoch = rollout index + 1) with its messages and
tool calls, Gym's reward as the ``nemo_gym`` score, Gym's metrics as sample metadata, a typed error as
the sample's error, a masked rollout unscored (its failure kind and Gym's reward in metadata).

The log is built with inspect-ai's own models and written by its own writer (the ``inspect`` extra).
What inspect has no place for stays in our report: pass^k, runs compared per task, per-call latency.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

from .runs import ReportError, Rollout, Run, load_run
from .transcript import Strings

INSPECT_EXTRA = "pip install 'verifiers-nemo[inspect]'"
SCORER = "nemo_gym"


def inspect_available() -> bool:
    from importlib.util import find_spec

    return find_spec("inspect_ai") is not None


def _messages(rollout: Rollout, strings: Strings, model: str) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCall

    names: dict[str, str] = {}
    out: list[Any] = []
    for m in rollout.transcript.get("m", []):
        role, text = m["r"], strings.text(m.get("t", ""))
        if role == "system":
            out.append(ChatMessageSystem(content=text))
        elif role == "assistant":
            calls = []
            for name, args, call_id in m.get("tc", []):
                raw = strings.text(args)
                try:
                    parsed = json.loads(raw) if raw else {}
                    arguments, error = (parsed, None) if isinstance(parsed, dict) else ({"value": parsed}, None)
                except ValueError:
                    arguments, error = {}, f"arguments are not JSON: {raw[:200]}"
                call_id = call_id or f"call_{len(names)}"
                names[call_id] = name
                calls.append(ToolCall(id=call_id, function=name, arguments=arguments, parse_error=error))
            content: Any = text
            if m.get("rs"):
                from inspect_ai._util.content import ContentReasoning, ContentText

                content = [
                    ContentReasoning(reasoning=strings.text(m["rs"])),
                    *([ContentText(text=text)] if text else []),
                ]
            out.append(ChatMessageAssistant(content=content, tool_calls=calls or None, model=model, source="generate"))
        elif role == "tool":
            call_id = m.get("id") or ""
            out.append(ChatMessageTool(content=text, tool_call_id=call_id or None, function=names.get(call_id)))
        else:
            out.append(ChatMessageUser(content=text))
    return out


def _sample(rollout: Rollout, strings: Strings, model: str) -> Any:
    from inspect_ai._util.error import EvalError
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    messages = _messages(rollout, strings, model)
    first_input = [m for m in messages if m.role in ("system", "user")]
    prompt_end = next((i for i, m in enumerate(messages) if m.role not in ("system", "user")), len(messages))
    last_text = next((m.text for m in reversed(messages) if m.role == "assistant" and m.text), "")
    metadata: dict[str, Any] = {"env": rollout.env, "status": rollout.status, "metrics": rollout.metrics}
    if rollout.recorded_reward is not None:
        metadata["recorded_reward"] = rollout.recorded_reward
    scores = None
    error = None
    if rollout.status == "scored" and rollout.reward is not None:
        scores = {SCORER: Score(value=rollout.reward, metadata=rollout.metrics or None)}
    elif rollout.status == "masked":
        metadata.update(
            masked=True, failure_kind=rollout.kind, failure_reason=rollout.message, gym_reward=rollout.reward
        )
    else:
        metadata["error_type"] = rollout.kind
        error = EvalError(message=f"{rollout.kind}: {rollout.message or ''}", traceback="", traceback_ansi="")
    usage = {}
    if rollout.input_tokens is not None or rollout.output_tokens is not None:
        tokens_in, tokens_out = rollout.input_tokens or 0, rollout.output_tokens or 0
        usage = {
            model: ModelUsage(input_tokens=tokens_in, output_tokens=tokens_out, total_tokens=tokens_in + tokens_out)
        }
    return EvalSample(
        id=rollout.task,
        epoch=rollout.rollout_index + 1,
        input=first_input[:prompt_end] or "",
        target="",
        messages=messages,
        output=ModelOutput.from_content(model, last_text),
        scores=scores,
        metadata=metadata,
        model_usage=usage,
        total_time=rollout.latency_s,
        working_time=rollout.latency_s,
        error=error,
    )


def build_log(run: Run, strings: Strings) -> Any:
    """The inspect-ai ``EvalLog`` of a run."""
    from inspect_ai.log import EvalConfig, EvalDataset, EvalLog, EvalMetric, EvalResults, EvalScore, EvalSpec, EvalStats

    model = str(run.info.get("model") or "unknown")
    env = str(run.info.get("environment") or ", ".join(run.envs))
    samples = [_sample(r, strings, model) for r in run.rollouts]
    rewards = [r.reward for r in run.rollouts if r.status == "scored" and r.reward is not None]
    metrics: dict[str, EvalMetric] = {}
    if rewards:
        mean = math.fsum(rewards) / len(rewards)  # type: ignore[arg-type]
        metrics["mean"] = EvalMetric(name="mean", value=mean)
        if len(rewards) > 1:
            variance = math.fsum((x - mean) ** 2 for x in rewards) / (len(rewards) - 1)  # type: ignore[operator]
            metrics["stderr"] = EvalMetric(name="stderr", value=math.sqrt(variance / len(rewards)))
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    created = str(run.info.get("created") or now)
    tasks = sorted({r.task for r in run.rollouts})
    return EvalLog(
        status="success" if run.info.get("status") in (None, "finished") else "error",
        eval=EvalSpec(
            created=created,
            task=f"nemo_gym/{env}",
            dataset=EvalDataset(name=env, samples=len(tasks), sample_ids=tasks),
            model=model if "/" in model else f"nemo_gym/{model}",
            model_base_url=run.info.get("endpoint") if str(run.info.get("endpoint", "")).startswith("http") else None,
            config=EvalConfig(epochs=run.rollouts_per_example),
            metadata={
                "source": run.source,
                "run": run.label,
                **{k: v for k, v in run.info.items() if isinstance(v, str | int | float)},
            },
        ),
        results=EvalResults(
            total_samples=len(samples),
            completed_samples=len(rewards),
            scores=[
                EvalScore(
                    name=SCORER,
                    scorer=SCORER,
                    scored_samples=len(rewards),
                    unscored_samples=len(samples) - len(rewards),
                    metrics=metrics,
                )
            ],
        ),
        stats=EvalStats(started_at=created, completed_at=str(run.info.get("updated") or created)),
        samples=samples,
    )


def write_inspect_log(run_path: Path, output: Path | None = None) -> tuple[Path, int]:
    """Write the run at ``run_path`` as an inspect-ai ``.eval`` log; returns its path and the rollouts."""
    from inspect_ai.log import write_eval_log

    strings = Strings(limit=None)
    run = load_run(run_path, strings)
    if output is None:
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S+00-00", time.gmtime())
        env = "-".join(run.envs)[:60] or "run"
        output = run.path / "inspect" / f"{stamp}_{env}_{run.path.name[-12:]}.eval"
    if output.suffix not in (".eval", ".json"):
        raise ReportError(f"{output}: an inspect-ai log ends in .eval (or .json)")
    output.parent.mkdir(parents=True, exist_ok=True)
    write_eval_log(build_log(run, strings), str(output))
    return output, len(run.rollouts)
