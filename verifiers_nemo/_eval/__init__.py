"""The eval run behind ``verifiers-nemo eval``.

``settings`` (what defines a run) → ``preflight`` (the endpoint checked before anything starts) →
``run`` (``Evaluation``: tasks, stack, policy, rollouts) → ``results`` (the run folder, resume
bookkeeping) → ``tally`` (the running summary of a run's records: ``stats``, the statistics, with ``exact`` sums,
and ``token_ids``, whether recorded token IDs are contiguous) → ``metadata`` (``metadata.json``) →
``report`` (the printed summary). The console belongs to the CLI.
"""

from .metadata import check_same_release, check_same_rows, run_metadata, slim_record
from .preflight import PreflightError, base_urls, check_base_url, preflight, resolve_api_key
from .report import fmt, format_summary, plural
from .results import (
    DEFAULT_OUTPUT_DIR,
    DoneRollouts,
    ExpectedRollouts,
    ResultsFolder,
    SavedResults,
    read_results,
    read_resume_state,
)
from .run import Evaluation, RunObserver
from .settings import (
    ENV_PACKAGE,
    REPLAY_MODEL,
    RUN_DEFINING,
    EvalSettings,
    benchmark_repeats,
    check_env_args,
    resolve_nemo_env,
)
from .stats import summarize
from .tally import RunTally

__all__ = [
    "DEFAULT_OUTPUT_DIR",
    "DoneRollouts",
    "ExpectedRollouts",
    "ENV_PACKAGE",
    "REPLAY_MODEL",
    "RUN_DEFINING",
    "EvalSettings",
    "Evaluation",
    "PreflightError",
    "ResultsFolder",
    "RunObserver",
    "RunTally",
    "SavedResults",
    "base_urls",
    "check_base_url",
    "check_env_args",
    "fmt",
    "format_summary",
    "plural",
    "preflight",
    "read_results",
    "read_resume_state",
    "resolve_api_key",
    "benchmark_repeats",
    "resolve_nemo_env",
    "run_metadata",
    "check_same_release",
    "check_same_rows",
    "slim_record",
    "summarize",
]
