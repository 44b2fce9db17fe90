"""Tasks of NeMo Gym environments: JSONL rows read, validated and given a framework-friendly view.

``taskset`` (``NeMoGymTaskset``, the sequence of tasks) → ``source`` (which file) → ``rows`` (reading,
limit, reservoir sample; a file's rows held as offsets, ``FileRows``; the compact ``RowStore``) → ``validation``
(a row checked as nemo-gym would) → ``task`` (``Task``: one rollout's work); ``recorded`` (a recording's task fields
put back from its environment's dataset); ``hf`` is the Hugging Face ``datasets`` bridge.
"""

from .rows import SkippedRows
from .task import Task
from .taskset import NeMoGymTaskset, harness_runtime

__all__ = ["NeMoGymTaskset", "SkippedRows", "Task", "harness_runtime"]
