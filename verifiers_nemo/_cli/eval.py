"""``verifiers-nemo eval``: settings checked, the endpoint preflighted, the run folder opened (or
resumed), the rollouts run with live progress, the summary printed, and SIGINT/SIGTERM stopping
the run cleanly (finished rollouts kept)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .._eval import format_summary, plural, run_metadata
from .._eval.metadata import changed_sources, sources_with_this_session
from .._exceptions import ConfigurationError, MissingRequirementsError, VerifiersNemoError
from .._signals import CapturedSignals, capture_signals, end_now
from .console import EXIT_FAILED, EXIT_OK, EXIT_USAGE, PROG, fail, say
from .progress import Progress
from .report import REPORT_FILE, report_unavailable, write_and_tell
from .settings import new_settings, resumed_settings
from .token_warnings import TokenBreakWarnings

if TYPE_CHECKING:
    from .._eval import DoneRollouts, EvalSettings, Evaluation, ResultsFolder, RunTally
    from .._gym import GymEnvironment


def cmd_eval(args: argparse.Namespace) -> int:
    wall_start = time.monotonic()
    if args.output_dir is not None or args.save_trace or args.report:
        args.save = True
    if args.report and (unavailable := report_unavailable()):
        return fail(f"--report: {unavailable}")
    try:
        settings, folder, metadata = _prepare_settings(args)
    except VerifiersNemoError as exc:
        return fail(str(exc))
    try:
        return _run_eval(args, settings, folder, metadata, wall_start)
    finally:
        if folder is not None:
            folder.close()


def _prepare_settings(args: argparse.Namespace) -> tuple[EvalSettings, ResultsFolder | None, dict[str, Any]]:
    from .._eval import EvalSettings, ResultsFolder

    if args.resume is not None:
        folder = ResultsFolder.existing(args.resume)
        metadata = folder.read_metadata()
        settings = resumed_settings(args, EvalSettings.from_dict(metadata["settings"]))
        return settings, folder, metadata
    return new_settings(args), None, {}


def _check_environment(settings: EvalSettings) -> None:
    """The Gym environment exists and can run this policy (else a refusal, before anything starts or is
    written)."""
    from .._gym import get_environment
    from .._replay import unreproducible_reason
    from .._tasks.benchmark_rows import benchmark_data

    for name in settings.env_names:
        env = get_environment(name)
        own_recordings = "jsonl_path" in settings.env_args
        if settings.policy == "replay" and not env.has_example_rollouts and not own_recordings:
            raise ConfigurationError(
                f"{env.name} has no recorded rollouts to replay ({env.example_rollouts_path} is missing or "
                f"empty); evaluate a model with -b URL -m MODEL instead, or play it with a function of yours "
                f"(--policy-script FILE.py){_recorded_server_hint(env)}."
            )
        needs_prepared_rows = env.benchmark is not None and not own_recordings and "dataset" not in settings.env_args
        if needs_prepared_rows and settings.policy != "replay":
            benchmark_data(env)  # its rows prepared, or how to prepare them: before the endpoint is asked
        reason = None if env.local else unreproducible_reason(env.name)
        if settings.policy == "replay" and reason and not own_recordings:
            raise ConfigurationError(
                f"{env.name}'s recorded rollouts cannot be replayed: {reason} (marked † in `{PROG} envs`). "
                "Evaluate a model on it instead: -b URL -m MODEL."
            )


def _recorded_server_hint(env: GymEnvironment) -> str:
    """For one of nemo-gym 0.7's environments or benchmarks, the resources server of its name, when that one ships
    recordings (0.7 gave the short name to the environment)."""
    from .._gym import get_environment
    from .._gym.catalogue.gym_listing import RESOURCES_SERVER
    from .._gym.config import RESOURCES_SERVERS

    if env.kind == RESOURCES_SERVER:
        return ""
    try:
        server = get_environment(f"{RESOURCES_SERVERS}/{env.name}")
    except VerifiersNemoError:
        return ""
    if not server.has_example_rollouts:
        return ""
    return f", or replay the resources server of that name, which ships them: {PROG} eval {server.ref}"


def _run_eval(
    args: argparse.Namespace,
    settings: EvalSettings,
    folder: ResultsFolder | None,
    metadata: dict[str, Any],
    wall_start: float,
) -> int:
    from .._eval import (
        Evaluation,
        PreflightError,
        RunTally,
        base_urls,
        check_same_release,
        check_same_rows,
        preflight,
        read_resume_state,
        resolve_api_key,
    )
    from .._replay import unreproducible_reason

    resuming = folder is not None
    tally = RunTally(settings)
    done: DoneRollouts | None = None
    notes: list[str] = []
    try:
        if settings.policy == "endpoint":
            assert settings.base_url is not None
            settings.base_url = ",".join(base_urls(settings.base_url))
            key = resolve_api_key(settings.api_key_var) if not resuming else None
        _check_environment(settings)
        if settings.policy == "endpoint" and key is not None:
            settings.model = preflight(settings.base_url, settings.model or None, key)
        evaluation = Evaluation(settings)
        evaluation.load()
        expected = evaluation.expected
        examples = len(expected) // settings.rollouts_per_example
        if not resuming and settings.num_examples and settings.num_examples > examples:
            source = evaluation.env.taskset.path.name if evaluation.env is not None else "the dataset"
            say(f"note: -n {settings.num_examples}, but {source} has {plural(examples, 'example')}; running all.")
        if folder is not None:  # resume: what is done already (read only, so a finished run needs no write)
            check_same_rows(metadata, len(expected), folder.path)
            notes += changed_sources(metadata.get("env_sources") or {}, settings.env_names)
            if metadata.get("env_sources"):  # this session's code beside the earlier sessions' (run_metadata keeps it)
                metadata["env_sources"] = sources_with_this_session(metadata["env_sources"], settings.env_names)
            state = read_resume_state(folder.results_path, expected, tally.add)
            if not state.truncated and state.done.complete:
                return _show_finished(settings, folder, metadata, tally, len(expected))
            check_same_release(metadata, settings, folder.path)  # before anything runs: rollouts of one release
            if settings.policy == "endpoint":
                assert settings.base_url is not None
                key = resolve_api_key(settings.api_key_var)
                settings.model = preflight(settings.base_url, settings.model or None, key)
        external = evaluation.check()  # judge-scored environment, missing packages: refused before anything starts
        if external:
            notes.insert(0, f"note: {settings.nemo_env} needs more than this machine: {'; '.join(external)}.")
        if settings.policy == "endpoint":
            evaluation.use_api_key(key.value)
        if folder is not None:
            folder.open_for_append()
            if not state.unchanged():  # written to since it was read (now it is ours): read it again
                tally = RunTally(settings)
                state = read_resume_state(folder.results_path, expected, tally.add)
            state.repair()
            done = state.done
            if state.truncated:
                notes.append(
                    "note: the last line of results.jsonl was cut off (the run was killed while writing it); "
                    "that rollout runs again"
                )
            if done.duplicates or done.unexpected:
                notes.append(
                    f"note: ignoring {done.duplicates} duplicate and {done.unexpected} unexpected lines in "
                    "results.jsonl"
                )
        elif args.save:
            from .._eval import DEFAULT_OUTPUT_DIR, ResultsFolder

            folder = ResultsFolder.create(args.output_dir or DEFAULT_OUTPUT_DIR, settings.env, settings.model)
            folder.open_for_append()
    except PreflightError as exc:
        return fail(str(exc), EXIT_USAGE if exc.usage else EXIT_FAILED)
    except MissingRequirementsError as exc:
        env_args = {**settings.env_args, "isolated_venvs": True}
        return fail(exc.describe(f"add -a '{json.dumps(env_args)}'"), EXIT_FAILED)
    except VerifiersNemoError as exc:
        return fail(str(exc))

    for note in notes:
        say(note)
    previous = done.count if done is not None else 0
    if settings.policy == "replay":
        header = f"{settings.nemo_env} with the replay policy (its recorded rollouts answer)"
    elif settings.policy == "script":
        header = f"{settings.nemo_env} with the policy script {settings.policy_script} (it answers as the model)"
    else:
        header = f"{settings.nemo_env} with {settings.model} @ {settings.base_url} ({settings.api} API)"
    say(
        f"Evaluating {header}: {plural(examples, 'example')} x {plural(settings.rollouts_per_example, 'rollout')}"
        f" = {len(expected)}"
        + (f" ({len(expected) - previous} to run)" if previous else "")
        + (f"; saving to {folder.path}" if folder else "")
    )
    if settings.policy == "endpoint" and not _bounds_output(settings.sampling_args):
        say(
            "warning: no max output tokens (-t N): a model that does not stop runs until its context is full, "
            f"and each such rollout ends at the {settings.timeout:g}s timeout. The progress line shows calls "
            "waiting on the model."
        )
    if settings.policy == "replay":
        for task_index in evaluation.tasks.task_indices(done):
            reason = unreproducible_reason(*settings.origin(task_index))
            if reason:
                say(
                    f"note: the recording of task {task_index} is known not to reproduce ({reason}); it is left "
                    "out of the replay verdict."
                )
    interrupt = _Interrupt()
    # The first SIGINT/SIGTERM stops the run (finished rollouts kept, summary printed); once the loop is
    # closed the previous handlers come back and the signal is raised again (SIGINT: KeyboardInterrupt, 130).
    with capture_signals(interrupt.on_signal, force=False) as captured:
        interrupt.captured = captured
        code = asyncio.run(_execute(evaluation, done, tally, folder, metadata, wall_start, interrupt))
    if args.report and folder is not None and folder.results_path.exists():
        write_and_tell([folder.path], folder.path / REPORT_FILE)
    return code


class _Interrupt:
    """What a signal does to a running eval: the first cancels the run's task, a second ends the process."""

    def __init__(self) -> None:
        self.captured: CapturedSignals | None = None
        self.cancelled = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None

    @property
    def first_signal(self) -> signal.Signals | None:
        """The first signal received, if any."""
        return self.captured.signals[0] if self.captured else None

    def attach(self, task: asyncio.Task[Any]) -> None:
        """The task a signal cancels, from now until ``detach``."""
        self._loop, self._task = asyncio.get_running_loop(), task
        if self.first_signal is not None:  # it came while the loop was starting
            self._loop.call_soon(self._stop, self.first_signal)

    def detach(self) -> None:
        self._task = None

    def on_signal(self, sig: signal.Signals, count: int) -> None:
        if count > 1:  # asked again: end now (the stack's supervisor cleans up after this process)
            end_now(sig)
        elif self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop, sig)

    def _stop(self, sig: signal.Signals) -> None:
        if self._task is None or self.cancelled:
            return
        self.cancelled = True
        say(f"\n{sig.name}: stopping (finished rollouts are kept; again to force) ...")
        self._task.cancel()


def _show_finished(
    settings: EvalSettings,
    folder: ResultsFolder,
    metadata: dict[str, Any],
    tally: RunTally,
    expected: int,
) -> int:
    """``-R`` of a run with nothing left to run: its summary as saved (no endpoint check, no stack, and its
    sessions' real timings), writing nothing unless its status was not ``finished`` yet."""
    sessions = list(metadata.get("sessions", []))
    updated = run_metadata(metadata, settings, folder, expected, tally, sessions)
    updated["status"] = "finished"
    if metadata.get("status") != "finished":
        with contextlib.suppress(OSError):
            folder.write_metadata(updated)
    say(f"Nothing to run: every rollout of {folder.path} is done ({tally.count} of {expected}).")
    print(format_summary(updated), flush=True)
    return _exit_status(updated)


def _bounds_output(sampling_args: Mapping[str, Any] | None) -> bool:
    """Whether the sampling args bound the length of a reply."""
    args = dict(sampling_args or {})
    args.update(args.pop("extra_body", None) or {})
    return any(args.get(k) for k in ("max_tokens", "max_output_tokens", "max_completion_tokens"))


def _model_waits(evaluation: Evaluation) -> tuple[int, float]:
    """Policy calls waiting on the model through this process's routing proxy (none seen on Ray actors)."""
    harness = evaluation.harness
    if not getattr(harness, "started", False):
        return 0, 0.0
    try:
        return harness.proxy.model_waits()
    except (ConfigurationError, AttributeError):
        return 0, 0.0


def _exit_status(metadata: Mapping[str, Any]) -> int:
    rollouts = metadata["summary"]["rollouts"]
    if rollouts["total"] and rollouts["scored"] == 0:
        if rollouts.get("masked"):
            say(
                f"{PROG}: no rollout could be scored: {rollouts['masked']} masked by Gym (no valid measurement; "
                f"see Masked), {rollouts['errored']} errored."
            )
        else:
            say(f"{PROG}: every rollout failed ({rollouts['errored']}); see Errors in the summary.")
        return EXIT_FAILED
    return EXIT_OK


async def _execute(
    evaluation: Evaluation,
    done: DoneRollouts | None,
    tally: RunTally,
    folder: ResultsFolder | None,
    metadata: dict[str, Any],
    wall_start: float,
    interrupt: _Interrupt,
) -> int:
    """Run what is left of the run, each result saved (``-s``) and counted in ``tally`` as it finishes (nothing
    of a finished rollout is kept here), then print the summary."""
    settings = evaluation.settings
    previous = tally.count
    progress = Progress()
    if settings.policy == "endpoint":
        progress.watch_model(lambda: _model_waits(evaluation))
        progress.watch_replicas(lambda: evaluation.replicas.down() if evaluation.replicas is not None else [])
    overall = tally.overall
    progress.seed(
        overall.rewards.count, overall.rewards.sum.total, sum(overall.errors.values()), sum(overall.masked.values())
    )
    session = {"started_at": evaluation.timing.started_at}
    sessions = [*metadata.get("sessions", []), session]
    expected = len(evaluation.expected)
    metadata = run_metadata(metadata, settings, folder, expected, tally, sessions)
    if folder is not None:
        metadata["status"] = "running"
        folder.write_metadata(metadata)

    main_task = asyncio.current_task()
    assert main_task is not None
    interrupt.attach(main_task)
    failure: str | None = None
    gym_metrics: dict[str, Any] = {}
    try:
        if previous >= expected:
            say(f"All {previous} rollouts are already done; nothing to run.")
        else:
            await evaluation.start(progress)
            breaks = TokenBreakWarnings(say) if settings.exact_tokens else None
            async for result in evaluation.run(evaluation.tasks.pending(done), progress, done=previous):
                record = evaluation.record_of(result)
                if folder is not None:
                    folder.append(record)
                tally.add(record)
                if breaks is not None:
                    breaks.check(record)
            if tally.gym:  # the environment's own metrics of every rollout of the run, from its running stack
                gym_metrics = await evaluation.gym_metrics(tally.gym)
    except asyncio.CancelledError:
        if not interrupt.cancelled:
            raise
        main_task.uncancel()
    except MissingRequirementsError as exc:  # the install of a server's requirements failed at start
        env_args = {**settings.env_args, "isolated_venvs": True}
        failure = exc.describe(f"add -a '{json.dumps(env_args)}'")
    except VerifiersNemoError as exc:  # the stack could not start ...
        failure = str(exc)
    finally:
        progress.close()
        with contextlib.suppress(Exception):
            await asyncio.shield(evaluation.aclose())
        interrupt.detach()

    timing = evaluation.timing
    session.update(
        wall_s=time.monotonic() - wall_start,
        stack_start_s=timing.stack_start_s,
        rollouts=timing.rollouts,
        rollouts_s=timing.rollouts_s,
    )
    if evaluation.judges:
        session["judges"] = evaluation.judges
    outages = evaluation.replica_outages()
    if outages:
        session["replica_outages"] = outages
    metadata = run_metadata(metadata, settings, folder, expected, tally, sessions)
    if gym_metrics:
        metadata["summary"]["gym_metrics"] = gym_metrics
    missing = metadata["counts"]["missing"]
    received = interrupt.first_signal
    status = "interrupted" if received else "failed" if failure else "finished" if not missing else "incomplete"
    metadata["status"] = status
    never_started = failure is not None and evaluation.timing.stack_start_s is None and not tally.count
    never_started = never_started and not previous and len(sessions) == 1  # a fresh run whose stack never started
    if folder is not None and never_started:
        folder.discard()  # a fresh run that never started: nothing to resume, no empty folder left behind
        folder = None
    if folder is not None:
        folder.write_metadata(metadata)

    if failure is not None:
        say(f"{PROG}: error: {failure}")
    if tally.count:
        print(format_summary(metadata), flush=True)
    if received:
        hint = f" Resume with: {PROG} eval -R {folder.path}" if folder is not None else " (use -s to be able to resume)"
        say(f"Interrupted: {tally.count} of {metadata['counts']['expected']} rollouts done.{hint}")
        return 128 + received  # when the restored handler lets the process go on
    if failure is not None:
        return EXIT_FAILED
    return _exit_status(metadata)
