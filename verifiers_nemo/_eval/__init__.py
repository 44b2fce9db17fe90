"""The eval run behind ``verifiers-nemo eval``.

``settings`` (what defines a run) → ``preflight`` (the endpoint checked before anything starts) →
``run`` (``Evaluation``: tasks, stack, policy, rollouts) → ``results`` (the run folder, resume
bookkeeping) → ``stats`` (pure statistics of result records) and ``token_ids`` (whether recorded token IDs
are contiguous) → ``metadata`` (``metadata.json``) →
``report`` (the printed summary). The console belongs to the CLI.
"""

from .metadata import run_metadata, slim_record
from .preflight import PreflightError, base_urls, check_base_url, preflight, resolve_api_key
from .report import fmt, format_summary, plural
from .results import DEFAULT_OUTPUT_DIR, ResultsFolder, dedupe_records, read_results
from .run import Evaluation, RunObserver
from .settings import ENV_PACKAGE, REPLAY_MODEL, RUN_DEFINING, EvalSettings, check_env_args, resolve_nemo_env
from .stats import summarize

__all__ = [
    "DEFAULT_OUTPUT_DIR",
    "ENV_PACKAGE",
    "REPLAY_MODEL",
    "RUN_DEFINING",
    "EvalSettings",
    "Evaluation",
    "PreflightError",
    "ResultsFolder",
    "RunObserver",
    "base_urls",
    "check_base_url",
    "check_env_args",
    "dedupe_records",
    "fmt",
    "format_summary",
    "plural",
    "preflight",
    "read_results",
    "resolve_api_key",
    "resolve_nemo_env",
    "run_metadata",
    "slim_record",
    "summarize",
]
