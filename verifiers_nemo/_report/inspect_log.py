"""A saved run as an inspect-ai log (``verifiers-nemo export RUN_DIR --inspect``), so ``inspect view``
shows our rollouts: one sample per rollout (task id, epoch = rollout index + 1) with its messages and
tool calls, Gym's reward as the ``nemo_gym`` score, Gym's metrics as sample metadata, a typed error as
the sample's error, a masked rollout unscored (its failure kind and Gym's reward in metadata).

The log is built with inspect-ai's own models and written by its own recorder (the ``inspect`` extra), the one
``write_eval_log`` uses, a sample at a time: the run is read streaming (its scores are over every rollout), and
the samples are the rollouts the report would show (``selection``: every one of a run of at most
``max_rollouts``), flushed to the ``.eval`` file every ``FLUSH_EVERY``. The bound is inspect's: its writer keeps
every sample's summary (its input messages included) in memory until the end and writes them all again in the
log's ``summaries.json`` (a ``.json`` log holds every sample in memory), so a log of a million samples would need
gigabytes wherever it is written or read. What inspect has no place for stays in our report: pass^k, runs
compared per task, per-call latency.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ReportError
from .records import Rollout
from .runs import Run, load_run
from .selection import DEFAULT_MAX_ROLLOUTS

INSPECT_EXTRA = "pip install 'verifiers-nemo[inspect]'"
SCORER = "nemo_gym"
FLUSH_EVERY = 500
"""Samples buffered by inspect's ``.eval`` recorder before they are written to the file."""


@dataclass
class InspectLog:
    """A written inspect-ai log: where, the run's rollouts, and the samples it holds (and how they were chosen)."""

    path: Path
    rollouts: int
    samples: int
    choice: str | None
    """How the samples were chosen (None: every rollout is one)."""


def inspect_available() -> bool:
    from importlib.util import find_spec

    return find_spec("inspect_ai") is not None


def _messages(rollout: Rollout, model: str) -> list[Any]:
    from inspect_ai.model import ChatMessageAssistant, ChatMessageSystem, ChatMessageTool, ChatMessageUser
    from inspect_ai.tool import ToolCall

    names: dict[str, str] = {}
    out: list[Any] = []
    for m in rollout.transcript.get("m", []):
        role, text = m["r"], m.get("t", "")
        if role == "system":
            out.append(ChatMessageSystem(content=text))
        elif role == "assistant":
            calls = []
            for name, args, call_id in m.get("tc", []):
                raw = args
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
                    ContentReasoning(reasoning=m["rs"]),
                    *([ContentText(text=text)] if text else []),
                ]
            out.append(ChatMessageAssistant(content=content, tool_calls=calls or None, model=model, source="generate"))
        elif role == "tool":
            call_id = m.get("id") or ""
            out.append(ChatMessageTool(content=text, tool_call_id=call_id or None, function=names.get(call_id)))
        else:
            out.append(ChatMessageUser(content=text))
    return out


def _sample(rollout: Rollout, model: str) -> Any:
    """An inspect-ai ``EvalSample`` of a rollout read with its texts as they are (no string table)."""
    from inspect_ai._util.error import EvalError
    from inspect_ai.log import EvalSample
    from inspect_ai.model import ModelOutput, ModelUsage
    from inspect_ai.scorer import Score

    messages = _messages(rollout, model)
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


def _header(run: Run, samples: int) -> tuple[Any, Any, Any, Any]:
    """The log's ``EvalSpec``, ``EvalPlan``, ``EvalResults`` (over every rollout of the run) and ``EvalStats``."""
    from inspect_ai.log import (
        EvalConfig,
        EvalDataset,
        EvalMetric,
        EvalPlan,
        EvalResults,
        EvalScore,
        EvalSpec,
        EvalStats,
    )

    model = str(run.info.get("model") or "unknown")
    env = str(run.info.get("environment") or ", ".join(run.envs))
    overall = run.tally.overall
    spread = overall.reward.spread
    metrics: dict[str, EvalMetric] = {}
    if spread.count:
        metrics["mean"] = EvalMetric(name="mean", value=spread.sum.mean())
        if spread.count > 1:  # the sample standard deviation over sqrt(n): pstdev / sqrt(n - 1)
            metrics["stderr"] = EvalMetric(name="stderr", value=spread.pstdev() / math.sqrt(spread.count - 1))
    now = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime())
    created = str(run.info.get("created") or now)
    chosen = run.choice.describe(samples)
    spec = EvalSpec(
        created=created,
        task=f"nemo_gym/{env}",
        dataset=EvalDataset(name=env, samples=overall.tasks),
        model=model if "/" in model else f"nemo_gym/{model}",
        model_base_url=run.info.get("endpoint") if str(run.info.get("endpoint", "")).startswith("http") else None,
        config=EvalConfig(epochs=run.rollouts_per_example),
        metadata={
            "source": run.source,
            "run": run.label,
            **{k: v for k, v in run.info.items() if isinstance(v, str | int | float)},
            **({"samples": chosen} if chosen else {}),
        },
    )
    results = EvalResults(
        total_samples=run.total,
        completed_samples=spread.count,
        scores=[
            EvalScore(
                name=SCORER,
                scorer=SCORER,
                scored_samples=spread.count,
                unscored_samples=run.total - spread.count,
                metrics=metrics,
            )
        ],
    )
    stats = EvalStats(started_at=created, completed_at=str(run.info.get("updated") or created))
    return spec, EvalPlan(), results, stats


def _samples(run: Run) -> Iterator[Any]:
    model = str(run.info.get("model") or "unknown")
    for rollout in run.shown(None):
        yield _sample(rollout, model)


async def _record(run: Run, output: Path) -> int:
    """Write ``run``'s log to ``output`` with inspect's recorder, a sample at a time; returns the samples."""
    from inspect_ai.log import condense_sample
    from inspect_ai.log._recorders.create import create_recorder_for_location

    spec, plan, results, stats = _header(run, len(run.choice.chosen()))
    recorder = create_recorder_for_location(str(output), str(output.parent))
    await recorder.log_init(spec, str(output))
    await recorder.log_start(spec, plan)
    written = 0
    for sample in _samples(run):
        await recorder.log_sample(spec, condense_sample(sample))
        written += 1
        if output.suffix == ".eval" and written % FLUSH_EVERY == 0:
            await recorder.flush(spec)
    status = "success" if run.info.get("status") in (None, "finished") else "error"
    await recorder.log_finish(spec, status, stats, results, None)
    return written


def write_inspect_log(
    run_path: Path, output: Path | None = None, *, max_rollouts: int | None = DEFAULT_MAX_ROLLOUTS
) -> InspectLog:
    """Write the run at ``run_path`` as an inspect-ai ``.eval`` log, with at most ``max_rollouts`` of its rollouts
    as samples (None: all of them; see the module for why there is a bound)."""
    run = load_run(run_path, max_rollouts=max_rollouts)
    if output is None:
        stamp = time.strftime("%Y-%m-%dT%H-%M-%S+00-00", time.gmtime())
        env = "-".join(run.envs)[:60] or "run"
        output = run.path / "inspect" / f"{stamp}_{env}_{run.path.name[-12:]}.eval"
    if output.suffix not in (".eval", ".json"):
        raise ReportError(f"{output}: an inspect-ai log ends in .eval (or .json)")
    output.parent.mkdir(parents=True, exist_ok=True)
    output.unlink(missing_ok=True)  # written afresh (inspect's recorder would add to a log it finds)
    samples = asyncio.run(_record(run, output.resolve()))
    return InspectLog(output, run.total, samples, run.choice.describe(samples))
