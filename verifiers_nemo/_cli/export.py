"""``verifiers-nemo export RUN_DIR --format ...``: a saved run as training data (``sft-tokens``, ``sft-messages``,
``preferences``, ``rollout-groups``: a JSONL or Parquet file) or as an inspect-ai log (``inspect``, for ``inspect
view``)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from .console import EXIT_FAILED, EXIT_OK, fail, say

INSPECT = "inspect"
EXPORTS_FOLDER = "exports"
"""Where a run's training-data files go by default: ``RUN_DIR/exports/<format>.parquet``."""


def cmd_export(args: argparse.Namespace) -> int:
    form = INSPECT if args.inspect else args.format
    if form is None:
        return fail("say which format: --format sft-tokens, sft-messages, preferences, rollout-groups or inspect")
    if args.inspect and args.format not in (None, INSPECT):
        return fail(f"--inspect is --format inspect; it cannot go with --format {args.format}")
    if form == INSPECT:
        return _inspect(args)
    if args.max_rollouts is not None:
        return fail("--max-rollouts applies to --format inspect; a training-data export writes every rollout")
    return _training_data(args, form)


def _training_data(args: argparse.Namespace, form: str) -> int:
    from .._exceptions import ConfigurationError
    from .._export.saved_run import SavedRun
    from .._export.writer import export_training_data

    options = {
        name: value
        for name, value in (
            ("min_reward", args.min_reward),
            ("max_reward", args.max_reward),
            ("pairs", args.pairs),
            ("min_gap", args.min_gap),
            ("max_pairs_per_task", args.max_pairs),
        )
        if value is not None
    }
    options.update(include_masked=args.include_masked, include_errors=args.include_errors)
    started = time.monotonic()
    try:
        run = SavedRun(args.run)
        output: Path = args.output or run.path / EXPORTS_FOLDER / f"{form}.parquet"
        report = export_training_data(run, output, form, **options)
    except ConfigurationError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot write {args.output or 'the export'}: {exc} (pass -o PATH somewhere writable)", EXIT_FAILED)
    if run.truncated:
        say("note: the last line of results.jsonl was cut off (the run was stopped while writing it); left out")
    say(f"{report.describe()} ({time.monotonic() - started:.1f}s); load it with datasets:")
    if report.path.suffix == ".parquet":
        say(f"  datasets.load_dataset('parquet', data_files={str(report.path)!r}, split='train')")
    else:  # JSON is typed by inference, block by block: the file's own types come with it
        say(
            f"  datasets.load_dataset('json', data_files={str(report.path)!r}, split='train', "
            f"features=verifiers_nemo.training_data_features({form!r}))"
        )
    print(report.path, flush=True)
    return EXIT_OK


def _inspect(args: argparse.Namespace) -> int:
    from .._report import ReportError
    from .._report.inspect_log import INSPECT_EXTRA, inspect_available, write_inspect_log
    from .._report.selection import DEFAULT_MAX_ROLLOUTS

    given = [flag for flag, value in _training_flags(args) if value]
    if given:
        return fail(f"{', '.join(given)} apply to the training-data formats, not --format inspect")
    if not inspect_available():
        return fail(f"the inspect export needs inspect-ai, not installed here: {INSPECT_EXTRA}")
    max_rollouts = DEFAULT_MAX_ROLLOUTS if args.max_rollouts is None else args.max_rollouts
    try:
        log = write_inspect_log(args.run, args.output, max_rollouts=max_rollouts)
    except ReportError as exc:
        return fail(str(exc))
    except OSError as exc:
        return fail(f"cannot write the log: {exc} (pass -o PATH somewhere writable)", EXIT_FAILED)
    if log.choice:
        say(
            f"note: the log's samples are {log.choice}; its scores count every rollout (inspect-ai's writer holds "
            "every sample's summary in memory: --max-rollouts N writes more)"
        )
    say(f"inspect-ai log of {log.rollouts:,} rollouts; view it with: inspect view --log-dir {log.path.parent}")
    print(log.path, flush=True)
    return EXIT_OK


def _training_flags(args: argparse.Namespace) -> list[tuple[str, object]]:
    return [
        ("--min-reward", args.min_reward is not None),
        ("--max-reward", args.max_reward is not None),
        ("--include-masked", args.include_masked),
        ("--include-errors", args.include_errors),
        ("--pairs", args.pairs is not None),
        ("--min-gap", args.min_gap is not None),
        ("--max-pairs", args.max_pairs is not None),
    ]
