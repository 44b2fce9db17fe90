"""The Hugging Face ``datasets`` bridge: a taskset as a ``Dataset`` (one row per task) and back."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._exceptions import ConfigurationError
from .rows import LoadedRows, RowStore
from .task import RESPONSES_CREATE_PARAMS, Task

if TYPE_CHECKING:
    import datasets


def to_dataset(
    firsts: Iterable[tuple[Task, int]], *, path: Path, recorded: bool, rollouts_per_task: int
) -> datasets.Dataset:
    """The dataset of each row's first task (with the row's index in its file)."""
    import datasets

    records = []
    for task, row_index in firsts:
        line_no = int(task.source.rsplit(":", 1)[1])
        info = {
            "row": task.row,
            "agent": task.agent_name,
            "env": task.env,
            "task_index": task.task_index,
            "row_index": row_index,
            "path": str(path),
            "line": line_no,
            "recorded": recorded,
            "rollouts_per_task": rollouts_per_task,
        }
        records.append(
            {
                "prompt": task.prompt,
                "example_id": task.example_id,
                "task": task.env or task.agent_name or "nemo_gym",
                "info": json.dumps(info, ensure_ascii=False),
            }
        )
    if any(not isinstance(m.get("content"), str) for r in records for m in r["prompt"]):
        for record in records:  # Arrow needs one type per column: use content parts everywhere
            record["prompt"] = [_content_as_parts(m) for m in record["prompt"]]
    return datasets.Dataset.from_list(records)


def from_dataset(dataset: Iterable[Mapping[str, Any]]) -> LoadedRows:
    """The rows (and taskset settings) of ``to_dataset()``'s output; ConfigurationError for anything else."""
    store = RowStore()
    env_name: str | None = None
    recorded = False
    rollouts_per_task = 1
    path = Path("<dataset>")
    for index, record in enumerate(dataset):
        try:
            info = json.loads(record["info"])
            row = info["row"]
            if not isinstance(row, dict) or RESPONSES_CREATE_PARAMS not in row:
                raise ValueError("info.row is not a Gym row")
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"dataset row {index} has no usable 'info' ({exc}). from_dataset() takes what "
                "NeMoGymTaskset.to_dataset() returns."
            ) from exc
        if index == 0:
            env_name = info.get("env")
            recorded = bool(info.get("recorded", False))
            rollouts_per_task = int(info.get("rollouts_per_task", 1))
            path = Path(info.get("path") or path)
        line = json.dumps(row, ensure_ascii=False, separators=(",", ":")).encode()
        store.append(line, int(info.get("line", index + 1)), int(info.get("row_index", index)), info.get("agent"))
    if store.size == 0:
        raise ConfigurationError("from_dataset() got an empty dataset: there are no tasks to rebuild.")
    return LoadedRows(store, path, env_name, recorded, rollouts_per_task)


def _content_as_parts(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": [{"type": "text", "text": content}]}
    return message
