"""The columns of each training-data format: the one place their names, types and meanings are written. The files'
own metadata (Parquet key-value metadata, the JSONL sidecar), the Arrow schema of a Parquet file and the docs' tables
(``docs/hooks.py`` writes ``docs/reference/training-data.md`` from here) are all made from these tuples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

FORMAT_VERSION = 1
"""Bumped when a column changes meaning or goes away (a new column does not bump it)."""


@dataclass(frozen=True)
class Column:
    """One column: its name, its type (``string``, ``int64``, ``list<int32>``, ``messages``...) and what it holds."""

    name: str
    type: str
    description: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "type": self.type, "description": self.description}


_IDENTITY = (
    Column("run_id", "string", "the run folder's name (its run id); null for results not read from a run folder"),
    Column("env", "string", "the Gym environment of the rollout"),
    Column("model", "string", "the policy model that sampled it"),
    Column(
        "task_index",
        "int64",
        "the task: its row in the environment's data (a mix numbers environment i's rows from i * 1,000,000)",
    ),
    Column("example_id", "string", "the row's own id (its id, example_id or task_id field), else its position"),
)
_ROLLOUT_INDEX = Column("rollout_index", "int64", "which of the task's rollouts (0-based, -r repeats a task)")
_OUTCOME = (
    Column(
        "status",
        "string",
        "scored, masked (Gym said the reward is no valid measurement: mask_sample) or error (the rollout failed)",
    ),
    Column(
        "reward",
        "float64",
        "Gym's reward; null when the rollout failed (never a silent 0); a masked rollout keeps the reward Gym gave",
    ),
    Column("error_type", "string", "why the rollout failed (timeout, upstream_http, gym_agent...); null unless error"),
    Column("failure_kind", "string", "Gym's name for what went wrong (judge_failed...), set on masked rollouts"),
    Column(
        "policy_versions",
        "list<string>",
        "the policy versions (the engine's weight_versions) that sampled the rollout, oldest first; null when the "
        "engine labelled none",
    ),
)
_TOKENS = (
    Column("prompt_token_ids", "list<int32>", "the first covered call's prompt, exactly as the model saw it"),
    Column(
        "completion_token_ids",
        "list<int32>",
        "every later token in order: each call's sampled tokens (end token included) and, between two calls, the "
        "tokens the model did not sample (tool results, user turns, the chat template's glue, the next assistant "
        "header)",
    ),
    Column("completion_mask", "list<int8>", "one per completion token: 1 where the policy sampled it, 0 elsewhere"),
    Column(
        "completion_logprobs",
        "list<float32>",
        "one per completion token: the logprob the server reported for a sampled token, 0.0 where the mask is 0; "
        "null when a covered call has no logprobs",
    ),
)
_TEXT_TOOLS = Column(
    "tools",
    "string",
    "the tools offered to the model, as JSON text of a list in Chat Completions form ({type: function, function: "
    "{name, description, parameters}}); null when it had none. TRL reads a JSON string in this column as is",
)
MESSAGE_FIELDS = (
    ("role", "string"),
    ("content", "string"),
    ("reasoning_content", "string"),
    ("tool_calls", "list<struct<id: string, type: string, function: struct<name: string, arguments: string>>>"),
    ("tool_call_id", "string"),
    ("item", "string"),
)
"""Every message of a ``messages`` column has these keys (null where a message has none)."""
MESSAGES_DOC = (
    "Chat Completions messages: role (system, user, assistant, tool), content (text; a message with images holds its "
    "parts as JSON text), reasoning_content (an assistant's reasoning), tool_calls (id, type, function {name, "
    "arguments as JSON text}), tool_call_id (of a tool result), item (an output item with no chat form, as JSON text)"
)

SFT_TOKENS = (
    *_IDENTITY,
    _ROLLOUT_INDEX,
    Column("sample_index", "int32", "which of the rollout's training samples this is (0-based)"),
    Column(
        "samples",
        "int32",
        "how many samples the rollout makes: 1 when its calls are one token sequence (each prompt extends the "
        "previous prompt + completion), more where that broke (each sample is contiguous; never glued)",
    ),
    Column("calls", "list<int32>", "the policy calls (their index in the rollout's trace) the sample covers"),
    *_OUTCOME,
    *_TOKENS,
    Column("input_ids", "list<int32>", "prompt_token_ids followed by completion_token_ids: the whole sequence"),
    Column(
        "labels",
        "list<int32>",
        "input_ids with -100 wherever the loss is off (the prompt and every completion token the policy did not "
        "sample): Hugging Face's convention, which TRL's SFTTrainer and transformers' Trainer read as they are",
    ),
)
SFT_MESSAGES = (
    *_IDENTITY,
    _ROLLOUT_INDEX,
    *_OUTCOME,
    Column("prompt", "messages", "the task's input messages (a developer message becomes system)"),
    Column(
        "completion",
        "messages",
        "what followed: each assistant turn (text, reasoning, tool calls) and each tool result, in order",
    ),
    _TEXT_TOOLS,
)
PREFERENCES = (
    *_IDENTITY,
    Column("chosen_rollout_index", "int64", "the chosen rollout (the higher reward)"),
    Column("rejected_rollout_index", "int64", "the rejected rollout (the lower reward)"),
    Column("chosen_reward", "float64", "the chosen rollout's reward"),
    Column("rejected_reward", "float64", "the rejected rollout's reward (at least the minimum gap below)"),
    Column("prompt", "messages", "the task's input messages, shared by both"),
    Column("chosen", "messages", "the chosen rollout's completion messages (assistant turns and tool results)"),
    Column("rejected", "messages", "the rejected rollout's completion messages"),
    _TEXT_TOOLS,
    Column(
        "prompt_token_ids",
        "list<int32>",
        "the shared prompt as tokens, when both rollouts recorded token IDs, each is one contiguous sample and "
        "both start from the same prompt tokens; else null (as are the other token columns)",
    ),
    Column("chosen_token_ids", "list<int32>", "the chosen rollout's completion tokens (its sample's)"),
    Column("chosen_mask", "list<int8>", "1 on the chosen completion's sampled tokens, 0 on tool results and glue"),
    Column("chosen_logprobs", "list<float32>", "the chosen completion's logprobs (0.0 where the mask is 0)"),
    Column("rejected_token_ids", "list<int32>", "the rejected rollout's completion tokens"),
    Column("rejected_mask", "list<int8>", "1 on the rejected completion's sampled tokens"),
    Column("rejected_logprobs", "list<float32>", "the rejected completion's logprobs (0.0 where the mask is 0)"),
)
SAMPLE_FIELDS = (
    ("prompt_token_ids", "list<int32>"),
    ("completion_token_ids", "list<int32>"),
    ("completion_mask", "list<int8>"),
    ("completion_logprobs", "list<float32>"),
    ("calls", "list<int32>"),
)
ROLLOUT_GROUPS = (
    *_IDENTITY,
    _ROLLOUT_INDEX,
    *_OUTCOME,
    Column("group_size", "int32", "the task's rollouts in the run, whatever their status"),
    Column("group_scored", "int32", "the task's scored rollouts: what the statistics are over"),
    Column("group_reward_mean", "float64", "the mean reward of the task's scored rollouts (null when none)"),
    Column(
        "group_reward_std",
        "float64",
        "their sample standard deviation (n - 1, as torch.std: null with fewer than 2)",
    ),
    Column(
        "advantage",
        "float64",
        "GRPO's advantage, (reward - group_reward_mean) / (group_reward_std + 1e-4) as TRL computes it; 0.0 for the "
        "only scored rollout of a task; null unless scored. Ignore it and use the reward and the group figures "
        "for another estimator (Dr. GRPO: reward - group_reward_mean)",
    ),
    Column("prompt", "messages", "the task's input messages"),
    Column("completion", "messages", "the rollout's completion messages"),
    _TEXT_TOOLS,
    Column(
        "samples",
        "samples",
        "the rollout's training samples, each with prompt_token_ids, completion_token_ids, completion_mask, "
        "completion_logprobs and calls as in sft-tokens (one when contiguous); null when no token IDs were recorded",
    ),
)

COLUMNS: dict[str, tuple[Column, ...]] = {
    "sft-tokens": SFT_TOKENS,
    "sft-messages": SFT_MESSAGES,
    "preferences": PREFERENCES,
    "rollout-groups": ROLLOUT_GROUPS,
}
"""Each training-data format's columns, in file order."""


def arrow_type(name: str) -> Any:
    """The pyarrow type a column type names (pyarrow comes with ``datasets``, a dependency of this package)."""
    import pyarrow as pa

    scalars = {
        "string": pa.string(),
        "int64": pa.int64(),
        "int32": pa.int32(),
        "int8": pa.int8(),
        "float64": pa.float64(),
        "float32": pa.float32(),
        "bool": pa.bool_(),
    }
    if name in scalars:
        return scalars[name]
    if name == "messages":
        return pa.list_(pa.struct([(field, arrow_type(kind)) for field, kind in MESSAGE_FIELDS]))
    if name == "samples":
        return pa.list_(pa.struct([(field, arrow_type(kind)) for field, kind in SAMPLE_FIELDS]))
    if name.startswith("list<") and name.endswith(">"):
        return pa.list_(arrow_type(name[5:-1]))
    if name.startswith("struct<") and name.endswith(">"):
        return pa.struct([_struct_field(part) for part in _split_fields(name[7:-1])])
    raise ValueError(f"unknown column type {name!r}")


def _struct_field(text: str) -> tuple[str, Any]:
    field, kind = text.split(":", 1)
    return field.strip(), arrow_type(kind.strip())


def _split_fields(text: str) -> list[str]:
    """``a: x, b: struct<c: y, d: z>`` → its top-level fields."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "<") - (char == ">")
        if char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    return [part for part in parts if part.strip()]


def arrow_schema(format_name: str, metadata: dict[str, str] | None = None) -> Any:
    """A format's Arrow schema: its columns in order, each with its description as field metadata."""
    import pyarrow as pa

    fields = [
        pa.field(column.name, arrow_type(column.type), metadata={"description": column.description})
        for column in COLUMNS[format_name]
    ]
    return pa.schema(fields, metadata=metadata)


def training_data_features(format_name: str) -> Any:
    """A training-data format's columns as ``datasets.Features``: what to pass to ``load_dataset("json", ...,
    features=...)`` for a JSONL export, whose JSON ``datasets`` otherwise types by inference, block by block (a column
    null in the file's first blocks and a list later, such as ``tool_calls``, then fails to load). A Parquet export
    carries its types itself."""
    from datasets import Features

    if format_name not in COLUMNS:
        from .._exceptions import ConfigurationError

        raise ConfigurationError(f"unknown training-data format {format_name!r}; choose one of {', '.join(COLUMNS)}.")
    return Features.from_arrow_schema(arrow_schema(format_name))
